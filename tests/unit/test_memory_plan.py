"""The learner's host-memory plan (`learner.memory_plan`): the parts it adds up, hand-computed; what it gives up,
in order, to fit; the memory it reads (MemAvailable, cgroup v1 and v2); and the learner's builder acting on it."""

import pytest

from asyncrl.core.checks.config_error import ConfigError
from asyncrl.core.model.modeling import load_causal_lm
from asyncrl.learner import builder
from asyncrl.learner.memory_plan import (
    MeasuredFit,
    MemoryPlan,
    available_bytes,
    fit,
    measured_fit,
    plan_memory,
)


def test_the_plan_adds_up_every_part_the_settings_hold():
    # 100 bytes of weights, 80 of them trainable: gradients 80, AdamW 2 x 80, the KL reference and the push's
    # snapshot a copy of the weights each, the checkpoint's copy weights + optimizer.
    plan = plan_memory(weight_bytes=100, trainable_bytes=80, kl_reference=True, push_in_background=True,
                       checkpoint_background=True)
    assert plan == MemoryPlan(weights=100, gradients=80, optimizer=160, reference=100, push_snapshot=100,
                              checkpoint_snapshot=260)
    assert plan.total == 800 and plan.needed == 1000  # 25 % headroom
    lean = plan_memory(weight_bytes=100, trainable_bytes=100, kl_reference=False, push_in_background=False,
                       checkpoint_background=False)
    assert lean.total == 400 and lean.parts()["reference"] == 0
    kept = plan_memory(weight_bytes=100, trainable_bytes=100, kl_reference=False, push_in_background=False,
                       checkpoint_background=False, sparse_deltas=True)  # the last push kept: one more copy
    assert kept.total == 500 and kept.parts()["push_base"] == 100


def test_a_qwen_half_billion_in_float32_needs_what_killed_it_with_the_defaults():
    """494,032,768 parameters in float32 (the embedding tied): 1.98 GB of weights; with the default background
    checkpoint and push the plan is 8x that, 15.8 GB (+ headroom 19.8 GB), the 17 GB the kernel killed it at."""
    weights = 494_032_768 * 4
    plan = plan_memory(weight_bytes=weights, trainable_bytes=weights, kl_reference=False, push_in_background=True,
                       checkpoint_background=True)
    assert plan.total == 8 * weights and round(plan.total / 1e9, 1) == 15.8
    verdict = fit(plan, available=16 * 10**9)
    assert verdict.fits and verdict.given_up == ("learner.checkpoint.background",)
    assert verdict.plan.total == 5 * weights  # weights, gradients, AdamW, the push snapshot


def test_fit_gives_up_the_background_checkpoint_then_the_background_push_then_refuses():
    plan = plan_memory(weight_bytes=100, trainable_bytes=80, kl_reference=True, push_in_background=True,
                       checkpoint_background=True)
    assert fit(plan, 1000).given_up == () and fit(plan, 1000).fits
    assert fit(plan, 999).given_up == ("learner.checkpoint.background",)  # 540 -> 675 needed
    assert fit(plan, 675).fits and fit(plan, 674).given_up == ("learner.checkpoint.background",
                                                               "learner.push_in_background")  # 440 -> 550
    refused = fit(plan, 549)
    assert not refused.fits
    message = refused.refusal()
    for named in ("model.dtype", "learner.algo.kl.mode", "learner.memory_check: false", "0.00 GiB"):
        assert named in message, message


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize("files, expected", [
    ({}, 1000 * 1024),  # no cgroup files: MemAvailable
    ({"memory.max": "max\n", "memory.current": "5\n"}, 1000 * 1024),  # v2 without a limit
    ({"memory.max": "600000\n", "memory.current": "100000\n"}, 500_000),  # v2: limit less usage
    ({"memory/memory.limit_in_bytes": "9223372036854771712\n", "memory/memory.usage_in_bytes": "7\n"},
     1000 * 1024),  # v1 writes "no limit" as a huge number
    ({"memory/memory.limit_in_bytes": "300000\n", "memory/memory.usage_in_bytes": "100000\n"}, 200_000),
])
def test_available_memory_is_mem_available_capped_by_the_cgroup(tmp_path, files, expected):
    write(tmp_path / "meminfo", "MemTotal: 2000 kB\nMemAvailable:    1000 kB\n")
    for name, text in files.items():
        write(tmp_path / "cgroup" / name, text)
    assert available_bytes(held=7, meminfo=str(tmp_path / "meminfo"), cgroup=str(tmp_path / "cgroup")) == expected + 7


def test_the_builder_turns_the_background_checkpoint_off_to_fit_and_refuses_what_cannot(tiny_model_dir,
                                                                                       monkeypatch):
    config = tiny_model_dir.config.model_copy(deep=True)
    model = load_causal_lm(config.model.path, config.model.dtype, "cpu")
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    weights = params + sum(b.numel() * b.element_size() for b in model.buffers())  # the rotary table too
    # Defaults: both in the background, no KL reference.
    expected = plan_memory(weight_bytes=weights, trainable_bytes=params, kl_reference=False, push_in_background=True,
                           checkpoint_background=True)
    monkeypatch.setattr(builder, "available_bytes", lambda held: expected.needed)
    kept, verdict = builder.fit_in_memory(config, model)
    assert kept is config and verdict.given_up == () and verdict.plan == expected
    monkeypatch.setattr(builder, "available_bytes", lambda held: int(weights * 7))
    fitted, verdict = builder.fit_in_memory(config, model)
    assert verdict.given_up == ("learner.checkpoint.background",)
    assert not fitted.learner.checkpoint.background and fitted.learner.push_in_background
    assert config.learner.checkpoint.background  # the caller's config is left as it was
    monkeypatch.setattr(builder, "available_bytes", lambda held: weights)
    with pytest.raises(ConfigError, match="learner: the plan needs about"):
        builder.fit_in_memory(config, model)
    config.learner.memory_check = False
    assert builder.fit_in_memory(config, model) == (config, None)


def test_after_the_first_step_the_measured_peak_decides_what_stays_in_the_background():
    snapshots = {"learner.checkpoint.background": 300, "learner.push_in_background": 100}
    # 1000 measured + 400 of snapshots, 10 % margin: 1540 needed; without the checkpoint's copy 1210.
    assert measured_fit(peak=1000, reachable=1540, snapshots=snapshots).given_up == ()
    kept_push = measured_fit(peak=1000, reachable=1539, snapshots=snapshots)
    assert kept_push.given_up == ("learner.checkpoint.background",) and kept_push.predicted == 1100
    assert measured_fit(peak=1000, reachable=1210, snapshots=snapshots).given_up == kept_push.given_up
    assert measured_fit(peak=1000, reachable=1209, snapshots=snapshots).given_up == (
        "learner.checkpoint.background", "learner.push_in_background")
    assert measured_fit(peak=1000, reachable=1100, snapshots={}).predicted == 1000


class Watch:
    def __init__(self, fit):
        self.fit = fit

    def after_first_step(self):
        return self.fit


def test_the_loop_gives_up_the_background_copies_the_first_step_showed_do_not_fit():
    from asyncrl.core.config.schema import AsyncRLConfig
    from asyncrl.core.runtime.events import MemoryEvents
    from asyncrl.learner.learner_metrics import LearnerMetrics
    from asyncrl.learner.loop import LearnerLoop

    config = AsyncRLConfig()
    both = ("learner.checkpoint.background", "learner.push_in_background")
    events = MemoryEvents()
    loop = LearnerLoop(learner=config.learner, groups_per_step=8, lookahead=8, trainer=None, buffer=None,
                       controller_stub=None, publisher=None, evaluate=None, events=events, metrics=LearnerMetrics(),
                       limits=None, checkpointer=object(),
                       memory_watch=Watch(MeasuredFit(peak=10, reachable=11, predicted=10, given_up=both)))
    loop.finish_push = lambda: None  # no push in flight in this loop
    assert loop.saver._writes is not None and loop.config.push_in_background
    loop._refit_memory()
    assert loop.saver._writes is None and not loop.config.push_in_background and loop.memory_watch is None
    (record,) = events.of_kind("memory_measured")
    assert record["given_up"] == list(both) and record["peak"] == 10
