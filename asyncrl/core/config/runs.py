"""The config of each run of a deployment of several LoRA runs on one base (`runs:`), derived from the
deployment's config and the run's overrides (`run_spec.RunSpec`).

What a run derives from its name and place, so that nothing of one run is another's:
- its run directory `<run_dir>/<name>` (events, checkpoints, audit, logs);
- its Redis keys: the buffer's stream and dead letters, the controller's state, each suffixed `:<name>`;
- its fixed ports: the deployment's + `PORT_STRIDE` x its index (0 stays 0: picked free), so run 0 of a
  deployment listens where a single run would.
What the runs share (the model, the replicas' engine, Redis, security) stays the deployment's. Pure: no I/O.
"""

from __future__ import annotations

import copy

from pydantic import ValidationError

from asyncrl.core.checks.config_error import ConfigError, validation_line
from asyncrl.core.config.schema import AsyncRLConfig

PORT_STRIDE = 100
"""Run i's fixed ports are the deployment's + PORT_STRIDE * i (room for 100 replicas counting up from each)."""

RUN_PORTS = ("controller.port", "controller.status_port", "learner.port", "learner.metrics_port",
             "learner.weight_transport.store_port", "rollout.port", "rollout.metrics_port")
"""The ports each run's own processes (its controller) or tenants (in the learner and the replicas) listen on."""


def run_configs(cfg: AsyncRLConfig) -> dict[str, AsyncRLConfig]:
    """Run name -> that run's whole config, in the order of `runs`; {} for a deployment of one run. ConfigError
    naming the key when the deployment cannot host several runs or a run's config does not validate."""
    if not cfg.runs:
        return {}
    _check_deployment(cfg)
    return {spec.name: run_config(cfg, index) for index, spec in enumerate(cfg.runs)}


def run_config(cfg: AsyncRLConfig, index: int) -> AsyncRLConfig:
    """The config of `cfg.runs[index]`: the deployment's, the run's overrides merged in, its own directory, Redis
    keys and ports (see the module's docstring)."""
    spec = cfg.runs[index]
    tree = cfg.model_dump(mode="json")
    tree["runs"] = []
    _merge(tree, copy.deepcopy(spec.overrides))
    tree["run_dir"] = f"{cfg.run_dir}/{spec.name}"
    tree["buffer"]["stream"] = f"{cfg.buffer.stream}:{spec.name}"
    tree["buffer"]["dead_letter_stream"] = f"{cfg.buffer.dead_letter_stream}:{spec.name}"
    tree["controller"]["state_key"] = f"{cfg.controller.state_key}:{spec.name}"
    for key in RUN_PORTS:
        *path, field = key.split(".")
        section = tree
        for part in path:
            section = section[part]
        if section[field]:
            section[field] += PORT_STRIDE * index
    try:
        return AsyncRLConfig.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(f"runs[{index}] ({spec.name}): {validation_line(err)}") from None


def _check_deployment(cfg: AsyncRLConfig) -> None:
    """What a deployment of several runs needs today (each refusal names its key)."""
    names = [spec.name for spec in cfg.runs]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ConfigError(f"runs: each run needs a name of its own; {', '.join(twice)} appear more than once")
    needs = [
        (cfg.learner.lora.enabled, "learner.lora.enabled: true (the runs train adapters on one frozen base)"),
        (cfg.rollout.engine.type == "torch", "rollout.engine.type: torch (vLLM's per-run adapters are not built)"),
        (cfg.learner.world_size == 1, "learner.world_size: 1"),
        (cfg.model.determinism == "off", "model.determinism: off (the runs' steps interleave on one base)"),
        (not cfg.teacher.enabled, "teacher.enabled: false"),
        (cfg.environment.type == "none", "environment.type: none (single-turn tasks)"),
        (cfg.learner.eval_by == "learner", "learner.eval_by: learner"),
    ]
    for ok, need in needs:
        if not ok:
            raise ConfigError(f"runs: a deployment of several runs needs {need}")


def _merge(tree: dict, overrides: dict) -> None:
    """`overrides` into `tree`, section by section (a mapping merges into a mapping; anything else replaces)."""
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(tree.get(key), dict):
            _merge(tree[key], value)
        else:
            tree[key] = value

