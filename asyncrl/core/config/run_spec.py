"""One entry of `runs:`: a LoRA run of its own in a deployment that trains several on one base.

The deployment's config holds what the runs share: the base model, the replicas and their engine, the buffer's
Redis, the learner's device, security, launch. A run's entry names the run, gives its share of the replicas,
and overrides only the keys a run owns (`RUN_KEYS`): its task and data, environment, reward, sampling, η,
batch size, learning rate, adapter and the rest of its training, and whether the shared teacher annotates its
groups. Each run's whole config is derived from the two by `asyncrl.core.config.runs.run_config`.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from asyncrl.core.config.base import Section

RUN_NAME = r"^[a-z][a-z0-9-]{0,30}$"
"""A run's name: its Redis keys, run directory, metric label and adapter name are made from it."""

RUN_KEYS: dict[str, frozenset[str] | None] = {
    "seed": None,
    "task": None,
    "reward": None,
    "sampling": None,
    "tracking": None,
    "environment": None,
    "controller": frozenset({"eta", "difficulty", "max_hold_s", "lease_ttl_s"}),
    "learner": frozenset({"batch_size", "minibatches", "total_steps", "lr", "weight_decay", "max_grad_norm",
                          "microbatch_tokens", "eval_every", "eval_prompts", "eval_pass_k", "eval_samples",
                          "eval_samples_max", "eval_pass_k_large", "checkpoint", "oldest_first", "stale_groups",
                          "algo", "lora"}),
    # The teacher is one process the runs share; each run chooses whether its trajectories are annotated.
    "teacher": frozenset({"annotate"}),
}
"""Section -> the keys of it a run may set (None: the whole section). Everything else is the deployment's."""


class RunSpec(Section):
    """A run in a deployment of several LoRA runs on one base (docs/lora.md, "Several runs on one base")."""

    name: str = Field(pattern=RUN_NAME)
    """The run's name (lower-case letters, digits, '-'; at most 31): its run directory `<run_dir>/<name>`, its
    Redis keys, its adapter's name and the `run` label of its metrics."""
    weight: float = Field(1.0, gt=0)
    """The run's share of the replicas' capacity against the other runs' weights (equal: fair shares)."""
    removed: bool = False
    """Taken out of the deployment (`asyncrl runs remove`): it trains no more and its share of the replicas
    goes to the others. The entry stays, so the runs after it keep their ports and it its run directory."""
    overrides: dict[str, Any] = Field(default_factory=dict)
    """The run's own settings, as a partial config over the deployment's: `seed`, `task`, `environment`,
    `reward`, `sampling`, `tracking`, of `controller` and `learner` the keys a run owns (η, batch size, learning
    rate, adapter, ...; docs/lora.md lists them), and `teacher.annotate` (whether the shared teacher annotates
    its groups). Any other key is the deployment's, shared by every run, and refused here."""

    @field_validator("overrides")
    @classmethod
    def _only_run_keys(cls, overrides: dict[str, Any]) -> dict[str, Any]:
        for section, value in overrides.items():
            if section in ("run_name", "run_dir"):
                raise ValueError(f"{section}: made from the run's `name`")
            if section not in RUN_KEYS:
                raise ValueError(f"{section}: shared by every run of the deployment; a run may set "
                                 f"{', '.join(RUN_KEYS)}")
            owned = RUN_KEYS[section]
            if owned is None:
                continue
            if not isinstance(value, dict):
                raise ValueError(f"{section}: a section (a mapping), got {type(value).__name__}")  # noqa: TRY004 - pydantic reports ValueErrors
            for key in value:
                if key not in owned:
                    raise ValueError(f"{section}.{key}: shared by every run of the deployment; a run may set "
                                     f"{section}.{{{', '.join(sorted(owned))}}}")
        lora = overrides.get("learner", {}).get("lora", {})
        if isinstance(lora, dict) and lora.get("enabled") is False:
            raise ValueError("learner.lora.enabled: every run of a deployment of several runs trains an adapter")
        return overrides
