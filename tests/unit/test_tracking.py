"""The learner's metric sinks write what they are given, under the JSONL log's names."""

from __future__ import annotations

import importlib.util

import pytest

from asyncrl.core.config.schema import AsyncRLConfig
from asyncrl.learner.tracking import MetricSinks


def test_tensorboard_event_files_hold_the_step_metrics(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sinks = MetricSinks(AsyncRLConfig(run_dir=str(tmp_path)))
    sinks.log(1, {"reward/mean": 0.25, "loss/policy": -0.5, "entry_ids": ["1-0"], "nan": float("nan"), "ok": True})
    sinks.log(2, {"reward/mean": 0.5})
    sinks.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {"reward/mean", "loss/policy"}  # numbers only; no lists, NaN or bools
    assert [(e.step, e.value) for e in acc.Scalars("reward/mean")] == [(1, 0.25), (2, 0.5)]


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb is not installed (the wandb extra)")
def test_wandb_offline_run_needs_no_account(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = AsyncRLConfig(run_dir=str(tmp_path), tracking={"tensorboard": False, "wandb": True})
    sinks = MetricSinks(config)
    sinks.log(1, {"reward/mean": 0.25})
    sinks.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
