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
from dataclasses import dataclass

from pydantic import ValidationError

from asyncrl.core.checks.config_error import ConfigError, validation_line
from asyncrl.core.config.schema import AsyncRLConfig
from asyncrl.core.lora.versions import AdapterServing

PORT_STRIDE = 100
"""Run i's fixed ports are the deployment's + PORT_STRIDE * i (room for 100 replicas counting up from each)."""

RUN_PORTS = ("controller.port", "controller.status_port", "learner.port", "learner.metrics_port",
             "learner.weight_transport.store_port", "rollout.port", "rollout.metrics_port")
"""The ports each run's own processes (its controller) or tenants (in the learner and the replicas) listen on."""


def run_configs(cfg: AsyncRLConfig, removed: bool = False) -> dict[str, AsyncRLConfig]:
    """Run name -> that run's whole config, in the order of `runs`, the removed ones left out unless `removed`;
    {} for a deployment of one run. ConfigError naming the key when the deployment cannot host several runs
    or a run's config does not validate."""
    if not cfg.runs:
        return {}
    _check_deployment(cfg)
    every = {spec.name: run_config(cfg, index) for index, spec in enumerate(cfg.runs)}
    _check_capacity(cfg, every)
    return {spec.name: every[spec.name] for spec in cfg.runs if removed or not spec.removed}


@dataclass(frozen=True)
class BankShape:
    """What each replica's adapter bank holds (`asyncrl.core.engines.run_adapters`, `vllm_runs`)."""

    runs: int
    """Runs it has slots for."""
    max_rank: int
    targets: tuple[str, ...]
    """The modules it can adapt: the deployment's `learner.lora.target_modules` and every run's."""
    versions_kept: int = 4
    """A run's adapter versions a vLLM engine keeps loaded at once: the most any run needs (η + 2)."""


def bank_shape(cfg: AsyncRLConfig) -> BankShape:
    """The bank a replica builds for `cfg` (`rollout.max_runs`, `rollout.max_lora_rank`, or the runs listed)."""
    every = run_configs(cfg, removed=True)
    active = sum(not spec.removed for spec in cfg.runs)
    targets = dict.fromkeys(cfg.learner.lora.target_modules)
    for run_cfg in every.values():
        targets.update(dict.fromkeys(run_cfg.learner.lora.target_modules))
    return BankShape(runs=cfg.rollout.max_runs or active,
                     max_rank=cfg.rollout.max_lora_rank or max(c.learner.lora.rank for c in every.values()),
                     targets=tuple(targets),
                     versions_kept=max(AdapterServing.for_run(c.learner.lora, c.controller.eta).versions_kept
                                       for c in every.values()))


def check_change(before: AsyncRLConfig, after: AsyncRLConfig) -> list[str]:
    """The runs `after` adds to the live deployment `before` (ConfigError naming the key when the change cannot be
    made live: a run's settings changed, a removed run back, or a new run that the replicas' banks, built for
    `before`, cannot hold)."""
    before_specs = {spec.name: spec for spec in before.runs}
    after_specs = {spec.name: spec for spec in after.runs}
    shared = before.model_dump(mode="json", exclude={"runs"}), after.model_dump(mode="json", exclude={"runs"})
    if shared[0] != shared[1]:
        raise ConfigError("runs: only the runs may change while the deployment lives; the shared settings differ "
                          "(stop it, and start again with them)")
    if [name for name in before_specs if name not in after_specs]:
        raise ConfigError("runs: a run's entry stays once it was in the deployment (`asyncrl runs remove` marks "
                          "it removed)")
    for name, spec in before_specs.items():
        now = after_specs[name]
        if now.model_copy(update={"removed": spec.removed}) != spec or (spec.removed and not now.removed):
            raise ConfigError(f"runs: run {name!r} cannot change while the deployment lives (only be removed); add "
                              "a run under another name instead")
    added = [name for name in after_specs if name not in before_specs]
    shape, configs = bank_shape(before), run_configs(after)
    if len(configs) > shape.runs:
        raise ConfigError(f"rollout.max_runs: the replicas hold adapter slots for {shape.runs} runs, and "
                          f"{len(configs)} would be active; start the deployment with a larger rollout.max_runs")
    for name in added:
        lora = configs[name].learner.lora
        if lora.rank > shape.max_rank:
            raise ConfigError(f"runs: run {name!r}: learner.lora.rank {lora.rank} is above the {shape.max_rank} "
                              "the replicas' slots hold (rollout.max_lora_rank, set when the deployment starts)")
        outside = [t for t in lora.target_modules if t not in shape.targets]
        if outside:
            raise ConfigError(f"runs: run {name!r}: learner.lora.target_modules {outside} are not among the "
                              f"modules the replicas adapt ({', '.join(shape.targets)}: the deployment's "
                              "learner.lora.target_modules and its runs')")
    return added


def run_config(cfg: AsyncRLConfig, index: int) -> AsyncRLConfig:
    """The config of `cfg.runs[index]`: the deployment's, the run's overrides merged in, its own directory, Redis
    keys and ports (see the module's docstring)."""
    spec = cfg.runs[index]
    tree = cfg.model_dump(mode="json")
    tree["runs"] = []
    _merge(tree, copy.deepcopy(spec.overrides))
    tree["run_dir"] = f"{cfg.run_dir}/{spec.name}"
    tree["run_name"] = spec.name
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
        (cfg.learner.world_size == 1, "learner.world_size: 1"),
        (cfg.model.determinism == "off", "model.determinism: off (the runs' steps interleave on one base)"),
        (cfg.learner.eval_by == "learner", "learner.eval_by: learner"),
    ]
    for ok, need in needs:
        if not ok:
            raise ConfigError(f"runs: a deployment of several runs needs {need}")


def _check_capacity(cfg: AsyncRLConfig, every: dict[str, AsyncRLConfig]) -> None:
    """The runs fit the replicas' banks when `rollout.max_runs` / `rollout.max_lora_rank` bound them."""
    active = sum(not spec.removed for spec in cfg.runs)
    if cfg.rollout.max_runs and active > cfg.rollout.max_runs:
        raise ConfigError(f"rollout.max_runs: {active} runs are active, above {cfg.rollout.max_runs}")
    for name, run_cfg in every.items():
        if cfg.rollout.max_lora_rank and run_cfg.learner.lora.rank > cfg.rollout.max_lora_rank:
            raise ConfigError(f"runs: run {name!r}: learner.lora.rank {run_cfg.learner.lora.rank} is above "
                              f"rollout.max_lora_rank ({cfg.rollout.max_lora_rank})")


def _merge(tree: dict, overrides: dict) -> None:
    """`overrides` into `tree`, section by section (a mapping merges into a mapping; anything else replaces)."""
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(tree.get(key), dict):
            _merge(tree[key], value)
        else:
            tree[key] = value

