"""The run's models in place before anything starts (`asyncrl up`): the named real model fetched and
converted (model.source), or the tiny demo model built (model.build_tiny); each cached in its folder."""

from __future__ import annotations

import contextlib
import fcntl
from pathlib import Path

from asyncrl.core.checks.config_error import ConfigError
from asyncrl.core.config.schema import AsyncRLConfig
from asyncrl.tools.tiny_model_stamp import tiny_models_current


def ensure_models(cfg: AsyncRLConfig) -> None:
    """Fetch and convert the named real model (model.source) when `model.path` holds no import of it, or build
    the tiny demo model (model.build_tiny) when its checkpoints are missing or were built from another
    tiny_model/task config (a no-op otherwise). One build at a time per model folder: two `up`s started
    together on a fresh machine would otherwise write the same checkpoint twice at once; the second waits for
    the first and finds the model built."""
    if cfg.model.source:
        from asyncrl.tools.model_sources import fetch_source, source_is_imported

        if source_is_imported(cfg.model.source, cfg.model.path):
            return
        with _build_lock(cfg.model.path):
            try:
                report = fetch_source(cfg.model.source, cfg.model.path, log=lambda line: print(line, flush=True))
            except ValueError as err:
                raise ConfigError(str(err)) from None
        if report:
            print(f"[up] imported {cfg.model.source} into {report.out} ({report.parameters / 1e6:.0f}M parameters, "
                  f"log-probs equal to the GGUF's within {report.max_logprob_diff:.1g}; cached for later runs)",
                  flush=True)
        return
    if not cfg.model.build_tiny or (cfg.model.path and tiny_models_current(cfg)):
        return
    from asyncrl.tools.tiny_model import make_tiny_model  # torch and the task: only to build

    with _build_lock(cfg.model.path):
        if tiny_models_current(cfg):
            return
        paths = make_tiny_model(cfg)
    if paths.built:
        print(f"[up] built the tiny model into {paths.policy} (cached for later runs)", flush=True)


@contextlib.contextmanager
def _build_lock(model_path: str):
    """Held while a model is built into `model_path`: one build per model folder at a time."""
    folder = Path(model_path).parent
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
