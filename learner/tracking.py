"""The learner's metric sinks beside its JSONL event log: TensorBoard event files (default, no account) and
Weights & Biases when configured. Every sink gets the same names as the `step` and `eval` events."""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from pathlib import Path

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary

from asyncrl.core.config.schema import AsyncRLConfig

log = logging.getLogger(__name__)

FLUSH_S = 2


class MetricSinks:
    def __init__(self, config: AsyncRLConfig):
        """The whole config: W&B records it with the run."""
        cfg = config.tracking
        self._tensorboard = None
        self._wandb = None
        if cfg.tensorboard:
            from tensorboard.summary.writer.event_file_writer import EventFileWriter

            # The writer's own thread flushes every FLUSH_S: a live TensorBoard stays seconds behind, and the
            # learner's step never waits on the file.
            self._tensorboard = EventFileWriter(str(Path(config.run_dir) / "tensorboard"), flush_secs=FLUSH_S)
        if cfg.wandb:
            try:
                import wandb
            except ImportError:
                raise ValueError("tracking.wandb: the wandb package is not installed (pip install 'asyncrl[wandb]')") from None
            self._wandb = wandb.init(
                project=cfg.wandb_project, mode=cfg.wandb_mode, dir=str(config.run_dir),
                name=Path(config.run_dir).name, config=config.model_dump(mode="json"),
            )  # fmt: skip
        # Sinks are written on a thread of their own: building and queueing fifty summaries per step is a few
        # milliseconds the learner's step need not wait for.
        self._queue: queue.Queue = queue.Queue()
        self._writer = threading.Thread(target=self._drain, name="metric-sinks", daemon=True)
        self._writer.start()

    def log(self, step: int, metrics: dict) -> None:
        """Numeric, finite values only (ids and lists stay in the JSONL log); written in the background."""
        values = {
            k: float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        }  # fmt: skip
        self._queue.put((step, values))

    def _drain(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                self._write(*item)
            except Exception:
                log.exception("metric sinks: step %s not written", item[0])

    def _write(self, step: int, values: dict) -> None:
        if self._tensorboard is not None:
            # One event holding every scalar of the step: the event file is opened once per record, so fifty
            # records per step cost 2 ms of CPU where one costs 0.1.
            summary = Summary(value=[Summary.Value(tag=key, simple_value=value) for key, value in values.items()])
            self._tensorboard.add_event(Event(wall_time=time.time(), step=step, summary=summary))
        if self._wandb is not None:
            self._wandb.log(values, step=step)

    def close(self) -> None:
        """Write what is queued, then close the sinks."""
        self._queue.put(None)
        self._writer.join()
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._wandb is not None:
            self._wandb.finish()
