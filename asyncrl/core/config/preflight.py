"""Checks `asyncrl up` runs before it starts anything: the checkpoints exist and load, the task builds (its
dataset files exist, hold rows and the named field), the reward resolves, a NCCL push has a GPU per rank.
Each failure is one `ConfigError` naming the config key and the path, instead of a traceback minutes into a
run."""

from __future__ import annotations

from pathlib import Path

from asyncrl.core.checks.config_error import ConfigError


def check_checkpoint(path: str, key: str) -> None:
    """`path` is a Hugging Face checkpoint directory (has config.json)."""
    if not path:
        raise ConfigError(f"{key}: required: the directory of a Hugging Face checkpoint (config.json, weights, "
                          "tokenizer)")
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
    from asyncrl.core.model.modeling import checkpoint_config
    from asyncrl.core.model.routing import checkpoint_num_experts

    if checkpoint_num_experts(config.model.path) == 0:
        model_type = checkpoint_config(config.model.path).get("model_type", "model")
        raise ConfigError(
            f"learner.routing_replay.mode: {mode} replays MoE routing, but model.path {config.model.path!r} is a "
            f"dense {model_type} (no experts); use mode none"
        )


def _cuda_index(device: str) -> int | None:
    """The GPU a torch device string names ("cuda" = the first), None for anything else."""
    if not device.startswith("cuda"):
        return None
    return int(device.partition(":")[2] or 0)


def check_local_nccl(config) -> None:
    """On one machine (`asyncrl up`), a NCCL push needs every rank on a GPU of its own: NCCL refuses two ranks
    on one device ("Duplicate GPU detected", seen on an H100). The learner's ranks sit on `learner.device`
    (rank r on cuda:r when sharded) and every replica `up` starts on the one `rollout.engine.device`."""
    if config.learner.weight_transport.type != "nccl":
        return
    key = "learner.weight_transport.type"
    learner = _cuda_index(config.learner.device)
    if learner is None:
        raise ConfigError(f"{key}: nccl pushes GPU tensors, but learner.device is {config.learner.device!r}; "
                          "use gloo")
    if config.rollout.replicas > 1:
        raise ConfigError(f"{key}: nccl needs one GPU per rank, and the {config.rollout.replicas} replicas `up` "
                          "starts share rollout.engine.device (NCCL refuses two ranks on one GPU); use gloo, or "
                          "start replicas on GPUs of their own with `asyncrl rollout`")
    learner_gpus = set(range(config.learner.world_size)) if config.learner.world_size > 1 else {learner}
    if config.rollout.engine.type == "torch":
        replica = _cuda_index(config.rollout.engine.device)
        if replica is None or replica in learner_gpus:
            used = ", ".join(f"cuda:{i}" for i in sorted(learner_gpus))
            raise ConfigError(f"{key}: nccl needs the replica on a GPU of its own, but rollout.engine.device is "
                              f"{config.rollout.engine.device!r} and the learner uses {used}; use gloo, or put "
                              "the replica on another GPU")


def preflight(config) -> None:
    """Everything a run needs from the disk, checked once: `preflight_files`, then `preflight_task`."""
    preflight_files(config)
    preflight_task(config)


def preflight_files(config) -> None:
    """The checkpoints the run loads and what they must be (reads a few files; nothing heavy is imported)."""
    check_checkpoint(config.model.path, "model.path")
    check_routing_replay(config)
    check_local_nccl(config)
    if config.teacher.enabled:
        check_checkpoint(config.teacher.model_path, "teacher.model_path")


def preflight_task(config) -> None:
    """The task as every process builds it: its tokenizer, prompts, reward and environment. Building it imports
    transformers and torch (about two seconds here), so `asyncrl up` runs it while the services start, and
    stops them when it fails."""
    from asyncrl.core.tasks import task_for_run

    try:
        task_for_run(config)
    except ConfigError:
        raise
    except ValueError as err:
        raise ConfigError(str(err)) from None
