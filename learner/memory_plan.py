"""What the learner will hold in host memory, estimated before it trains, against what the machine has left.

A learner that does not fit is killed by the kernel mid-step or mid-save, and a restart with the same settings
dies the same way (a Qwen2.5-0.5B-shaped model in float32 on a 24 GB machine: 1.98 GB of weights, but the
default background checkpoint took the learner to 17 GB). So, once the model is loaded and before anything
else is allocated, the learner adds up what its settings will hold (`plan_memory`) and compares it with the
memory available (`available_bytes`: the kernel's MemAvailable, capped by the container's cgroup limit):

- weights, gradients and AdamW's two moments (each the size of the trainable weights, in their dtype);
- the frozen KL reference model (`learner.algo.kl.mode` other than none): the weights again;
- the snapshot a background push sends from (`learner.push_in_background`): the weights again;
- the host copy a background checkpoint writes from (`learner.checkpoint.background`): weights and optimizer.

Activations, the optimizer step's temporaries and the allocator are not modelled before the start:
`HEADROOM_PERCENT` of the total is kept free for them (the runtime is already resident, outside what is
available). Where the plan does not fit, the learner gives up what costs memory but not
correctness, in order: the background checkpoint (saves in line), then the background push (pushes in line),
each named in a warning and the learner's `memory_plan` record; if it still does not fit it refuses to start,
naming the figures and the settings that would make it fit (`learner.memory_check: false` starts anyway).

The headroom is a guess; the first step is a measurement. After it, and before the first snapshot exists, the
learner knows the peak training alone reached (activations, transients and runtime included) and checks it
again (`MemoryWatch`): that peak plus the snapshots still to come must fit in what the process can reach, else
the same settings are given up, in the same order (bench/learner_memory.py: predicted vs measured).
"""

from __future__ import annotations

import resource
from dataclasses import dataclass, replace
from pathlib import Path

HEADROOM_PERCENT = 25
"""Share of the planned total kept free for activations, the optimizer step's temporaries and the allocator: at
the Qwen2.5-0.5B shape they took 17-24% over the plan, the most with the least planned (bench/learner_memory.py)."""

GIB = 1 << 30


@dataclass(frozen=True, kw_only=True)
class MemoryPlan:
    """Bytes the learner's settings make it hold (each 0 when that part is off)."""

    weights: int
    gradients: int
    optimizer: int
    reference: int
    push_snapshot: int
    checkpoint_snapshot: int
    push_base: int = 0
    """With sparse delta pushes: the copy of the last push the next one is compared with."""

    @property
    def total(self) -> int:
        return (self.weights + self.gradients + self.optimizer + self.reference + self.push_snapshot
                + self.checkpoint_snapshot + self.push_base)

    @property
    def needed(self) -> int:
        """The total with its headroom."""
        return _with_percent(self.total, HEADROOM_PERCENT)

    def parts(self) -> dict[str, int]:
        return {"weights": self.weights, "gradients": self.gradients, "optimizer": self.optimizer,
                "reference": self.reference, "push_snapshot": self.push_snapshot,
                "checkpoint_snapshot": self.checkpoint_snapshot, "push_base": self.push_base}

    def describe(self) -> str:
        shown = ", ".join(f"{name.replace('_', ' ')} {size / GIB:.2f}" for name, size in self.parts().items() if size)
        return f"{self.needed / GIB:.2f} GiB ({shown} GiB, plus {HEADROOM_PERCENT}% headroom)"


def plan_memory(*, weight_bytes: int, trainable_bytes: int, kl_reference: bool, push_in_background: bool,
                checkpoint_background: bool, trained_only: bool = False, sparse_deltas: bool = False) -> MemoryPlan:
    """The plan of a learner whose model holds `weight_bytes` (parameters and buffers), `trainable_bytes` of
    them trainable, under the given settings. `trained_only`: pushes and checkpoints copy only what trains
    (LoRA's adapters), not every weight. `sparse_deltas`: the last push is kept (a copy as the snapshot's)."""
    optimizer = 2 * trainable_bytes  # AdamW: exp_avg and exp_avg_sq, each like its parameter
    copied = trainable_bytes if trained_only else weight_bytes
    return MemoryPlan(
        weights=weight_bytes, gradients=trainable_bytes, optimizer=optimizer,
        reference=weight_bytes if kl_reference else 0,
        push_snapshot=copied if push_in_background else 0,
        checkpoint_snapshot=copied + optimizer if checkpoint_background else 0,
        push_base=copied if sparse_deltas else 0,
    )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class MemoryVerdict:
    plan: MemoryPlan
    """The plan with the settings the learner keeps."""
    available: int
    """Bytes available to the learner when it checked (what it already holds counted in)."""
    given_up: tuple[str, ...] = ()
    """The settings turned off to fit (`learner.checkpoint.background`, `learner.push_in_background`)."""
    fits: bool = True

    def refusal(self) -> str:
        return (f"learner: the plan needs about {self.plan.describe()} of host memory, {self.available / GIB:.2f} "
                "GiB are available (after giving up the background checkpoint and push). Use a smaller "
                "model.dtype (bfloat16 halves every part), learner.algo.kl.mode: none (no reference copy), a "
                "smaller model or a machine with more memory; learner.memory_check: false starts anyway")


FALLBACKS = (("learner.checkpoint.background", "checkpoint_snapshot"), ("learner.push_in_background", "push_snapshot"))
"""What the learner gives up, in this order, to fit: (the setting, the part of the plan it costs)."""


def fit(plan: MemoryPlan, available: int) -> MemoryVerdict:
    """Keep the plan if it fits in `available`; else give up the parts in `FALLBACKS` one at a time until it
    does, or say it cannot fit."""
    given_up: list[str] = []
    for setting, part in ((None, None), *FALLBACKS):
        if part is not None and getattr(plan, part):
            plan = replace(plan, **{part: 0})
            given_up.append(setting)
        if plan.needed <= available:
            return MemoryVerdict(plan=plan, available=available, given_up=tuple(given_up))
    return MemoryVerdict(plan=plan, available=available, given_up=tuple(given_up), fits=False)


MEASURED_MARGIN_PERCENT = 10
"""Kept free over the prediction made from the first step's measured peak: later steps reached 5-7% above it
(allocator fragmentation, the second step's temporaries; bench/learner_memory.py)."""


@dataclass(frozen=True, kw_only=True)
class MeasuredFit:
    peak: int
    """Resident bytes the first training step reached."""
    reachable: int
    """Resident bytes now plus what is available."""
    predicted: int
    """The peak with the snapshots the learner keeps."""
    given_up: tuple[str, ...]


class MemoryWatch:
    """The check after the first step: the snapshots the plan kept (setting -> bytes), given up in `FALLBACKS`
    order while the measured peak plus them does not fit."""

    def __init__(self, plan: MemoryPlan):
        self.snapshots = {setting: getattr(plan, part) for setting, part in FALLBACKS if getattr(plan, part)}

    def after_first_step(self) -> MeasuredFit:
        """The check, on this process's memory now (nothing to give up: it fits by definition)."""
        peak, rss = process_memory()
        return measured_fit(peak=peak, reachable=available_bytes(held=rss), snapshots=self.snapshots)


def measured_fit(*, peak: int, reachable: int, snapshots: dict[str, int]) -> MeasuredFit:
    """`peak` plus the `snapshots` still to come (setting -> bytes), with `MEASURED_MARGIN`, against
    `reachable`; the snapshots given up in `FALLBACKS` order until it fits (or none are left)."""
    kept, given_up = dict(snapshots), []
    for setting, _part in FALLBACKS:
        if _with_percent(peak + sum(kept.values()), MEASURED_MARGIN_PERCENT) <= reachable:
            break
        if setting in kept:
            del kept[setting]
            given_up.append(setting)
    return MeasuredFit(peak=peak, reachable=reachable, predicted=peak + sum(kept.values()), given_up=tuple(given_up))


def process_memory() -> tuple[int, int]:
    """This process's peak and current resident bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kB
    resident = int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()
    return peak, resident


def _with_percent(total: int, percent: int) -> int:
    """`total` plus `percent` of it, rounded up (integers: no float rounding at the boundary)."""
    return -(-total * (100 + percent) // 100)


def available_bytes(held: int, meminfo: str = "/proc/meminfo", cgroup: str = "/sys/fs/cgroup") -> int:
    """Memory this process can still count on, plus `held` (what it already holds of the plan: the loaded
    weights): the kernel's MemAvailable, capped by the cgroup's limit less its usage (v2 or v1)."""
    free = _meminfo_available(meminfo)
    limit = _cgroup_room(Path(cgroup))
    if limit is not None:
        free = min(free, limit)
    return free + held


def _meminfo_available(path: str) -> int:
    for line in Path(path).read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{path}: no MemAvailable line")


def _cgroup_room(root: Path) -> int | None:
    """Limit less usage of this process's memory cgroup (None: no limit, or none readable)."""
    for limit_file, usage_file in (("memory.max", "memory.current"),
                                   ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        try:
            limit = (root / limit_file).read_text().strip()
            usage = int((root / usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or int(limit) >= 1 << 60:  # v1 writes "no limit" as a huge number
            return None
        return max(0, int(limit) - usage)
    return None
