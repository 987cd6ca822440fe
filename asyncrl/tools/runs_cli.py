"""`asyncrl runs list|add|remove RUN_DIR`: the runs of a live deployment of several LoRA runs (docs/lora.md).

A change is checked whole before anything is written (the new run's config, what the replicas' adapter banks
hold, its ports free), then written into the deployment's resolved config in one rename; `asyncrl up` applies
it within a second (`asyncrl.tools.live_runs`). A change refused leaves the deployment as it was.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from asyncrl.core.checks.config_error import ConfigError
from asyncrl.core.config.file import dump_config, load_config, set_keys
from asyncrl.core.config.run_spec import RunSpec
from asyncrl.core.config.runs import check_change, run_configs
from asyncrl.core.config.schema import AsyncRLConfig
from asyncrl.core.runtime.events import read_events
from asyncrl.core.wire.ports import why_not_listenable
from asyncrl.tools.port_plan import planned_ports


def resolved_path(run_dir: str) -> Path:
    path = Path(run_dir) / "config.resolved.yaml"
    if not path.is_file():
        raise ConfigError(f"RUN_DIR: {str(path)!r} does not exist (the directory `asyncrl up` printed)")
    return path


def deployment(run_dir: str) -> AsyncRLConfig:
    cfg = load_config(resolved_path(run_dir))
    if not cfg.runs:
        raise ConfigError(f"RUN_DIR: {run_dir!r} is a single run, not a deployment of several (`runs:`)")
    return cfg


def list_runs(run_dir: str) -> list[dict]:
    """Each run of the deployment: name, weight, state, steps done of its total, its last held-out accuracy."""
    cfg = deployment(run_dir)
    every = run_configs(cfg, removed=True)
    rows = []
    for spec in cfg.runs:
        run_cfg = every[spec.name]
        events = read_events(run_cfg.run_dir, "learner") if Path(run_cfg.run_dir, "events").is_dir() else []
        steps = max((e["step"] for e in events if e["kind"] == "step"), default=0)
        evals = [e["accuracy"] for e in events if e["kind"] == "eval"]
        done = steps >= run_cfg.learner.total_steps
        rows.append({"name": spec.name, "weight": spec.weight,
                     "state": "removed" if spec.removed else "finished" if done else "training",
                     "step": steps, "total_steps": run_cfg.learner.total_steps,
                     "eval_accuracy": evals[-1] if evals else None, "run_dir": run_cfg.run_dir})
    return rows


def add_run(run_dir: str, name: str, weight: float, overrides: list[str]) -> AsyncRLConfig:
    """Add run `name` with `overrides` ("key=value", the run's own keys) to the live deployment."""
    before = deployment(run_dir)
    spec = RunSpec(name=name, weight=weight, overrides=set_keys({}, overrides))
    after = before.model_copy(update={"runs": [*before.runs, spec]})
    after = AsyncRLConfig.model_validate(after.model_dump(mode="json"))
    check_change(before, after)
    for port in planned_ports(after):
        if port.owner.startswith(f"run {name}: ") and (reason := why_not_listenable(port.host, port.port)):
            raise ConfigError(f"{port.key}: run {name!r} would listen on {port.describe()}: {reason}")
    _write(resolved_path(run_dir), after)
    return after


def remove_run(run_dir: str, name: str) -> AsyncRLConfig:
    """Take run `name` out of the live deployment (its entry stays, marked removed)."""
    before = deployment(run_dir)
    names = [spec.name for spec in before.runs if not spec.removed]
    if name not in names:
        raise ConfigError(f"NAME: the deployment has no active run {name!r} (active: {', '.join(names) or 'none'})")
    runs = [spec.model_copy(update={"removed": True}) if spec.name == name else spec for spec in before.runs]
    after = before.model_copy(update={"runs": runs})
    check_change(before, after)
    _write(resolved_path(run_dir), after)
    return after


def _write(path: Path, cfg: AsyncRLConfig) -> None:
    """`cfg` into `path` in one rename: a reader sees the old file or the new one, never half of one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".config.", suffix=".yaml")
    os.close(fd)
    try:
        dump_config(cfg, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
