"""Checks a process runs before it starts anything: the checkpoints exist and load, the task builds (its
dataset files exist, hold rows and the named field), the reward resolves. Each failure is one
`ConfigError` naming the config key and the path, instead of a traceback minutes into a run."""

from __future__ import annotations

from pathlib import Path


class ConfigError(ValueError):
    """A config value that cannot work; the message starts with the key."""


def check_checkpoint(path: str, key: str) -> None:
    """`path` is a Hugging Face checkpoint directory (has config.json)."""
    directory = Path(path)
    if not directory.exists():
        raise ConfigError(f"{key}: {path!r} does not exist")
    if not (directory / "config.json").is_file():
        raise ConfigError(f"{key}: {path!r} is not a Hugging Face checkpoint directory (no config.json)")


def check_routing_replay(config) -> None:
    """Routing replay needs a mixture-of-experts policy (the checkpoint's config names its experts)."""
    mode = config.learner.routing_replay.mode
    if mode == "none":
        return
    from asyncrl.core.modeling import checkpoint_config
    from asyncrl.core.routing import checkpoint_num_experts

    if checkpoint_num_experts(config.model.path) == 0:
        model_type = checkpoint_config(config.model.path).get("model_type", "model")
        raise ConfigError(
            f"learner.routing_replay.mode: {mode} replays MoE routing, but model.path {config.model.path!r} is a "
            f"dense {model_type} (no experts); use mode none"
        )


def preflight(config) -> None:
    """Everything a run needs from the disk, checked once before any process starts."""
    from asyncrl.core.tasks import task_for_run

    check_checkpoint(config.model.path, "model.path")
    check_routing_replay(config)
    if config.teacher.enabled:
        check_checkpoint(config.teacher.model_path, "teacher.model_path")
    try:
        task_for_run(config)
    except ConfigError:
        raise
    except ValueError as err:
        raise ConfigError(str(err)) from None
