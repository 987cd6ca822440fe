"""The learner's metric sinks beside its JSONL event log: TensorBoard event files (default, no account) and
Weights & Biases when configured. Every sink gets the same names as the `step` and `eval` events."""

from __future__ import annotations

import math
from pathlib import Path


class MetricSinks:
    def __init__(self, config):
        cfg = config.tracking
        self._tensorboard = None
        self._wandb = None
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tensorboard = SummaryWriter(log_dir=str(Path(config.run_dir) / "tensorboard"))
        if cfg.wandb:
            try:
                import wandb
            except ImportError:
                raise ValueError("tracking.wandb: the wandb package is not installed (pip install 'asyncrl[wandb]')") from None
            self._wandb = wandb.init(
                project=cfg.wandb_project, mode=cfg.wandb_mode, dir=str(config.run_dir),
                name=Path(config.run_dir).name, config=config.model_dump(mode="json"),
            )  # fmt: skip

    def log(self, step: int, metrics: dict) -> None:
        """Numeric, finite values only (ids and lists stay in the JSONL log)."""
        values = {
            k: float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        }  # fmt: skip
        if self._tensorboard is not None:
            for key, value in values.items():
                self._tensorboard.add_scalar(key, value, global_step=step)
            self._tensorboard.flush()
        if self._wandb is not None:
            self._wandb.log(values, step=step)

    def close(self) -> None:
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._wandb is not None:
            self._wandb.finish()
