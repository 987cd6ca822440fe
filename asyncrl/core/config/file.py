"""A config file on disk: read into `AsyncRLConfig` with `--set` overrides applied (validated at load), and the
resolved config written back out (`<run_dir>/config.resolved.yaml`, what every process of a run reads)."""

from __future__ import annotations

from pathlib import Path

import yaml

from asyncrl.core.checks.config_error import ConfigError
from asyncrl.core.config.runs import run_configs
from asyncrl.core.config.schema import AsyncRLConfig


def load_config(path: str | Path, overrides: list[str] | None = None) -> AsyncRLConfig:
    """Load and validate a YAML config; `overrides` are dotted `key=value` pairs (value parsed as YAML). A file
    that cannot be read or parsed, or an override that is not `key=value` into a section, is a ConfigError
    naming `--config` or `--set`."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except OSError as err:
        raise ConfigError(f"--config: cannot read {str(path)!r}: {err.strerror or err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"--config: {str(path)!r} is not valid YAML: {_one_line(err)}") from None
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise ConfigError(f"--config: {str(path)!r} must hold a mapping of sections, not a {type(raw).__name__}")
    config = AsyncRLConfig.model_validate(set_keys(raw, overrides or []))
    run_configs(config)  # a deployment of several runs: each run's config validates too
    return config


def set_keys(tree: dict, overrides: list[str]) -> dict:
    """`tree` (a config as nested mappings) with each dotted `key=value` of `overrides` set in it, the value
    parsed as YAML (ConfigError naming `--set` for one that is not KEY=VALUE into a section); returns `tree`."""
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set: {item!r} is not KEY=VALUE (e.g. learner.total_steps=5)")
        node = tree
        parts = key.split(".")
        for depth, part in enumerate(parts[:-1]):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item}: {'.'.join(parts[: depth + 1])} is a value, not a section")
        try:
            node[parts[-1]] = yaml.safe_load(value)
        except yaml.YAMLError as err:
            raise ConfigError(f"--set {key}: {value!r} is not a YAML value: {_one_line(err)}") from None
    return tree


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())


def dump_config(config: AsyncRLConfig, path: str | Path) -> None:
    """Write the resolved config (every default filled in) as YAML."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
