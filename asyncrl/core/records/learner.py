"""The learner's records, in `<run_dir>/events/learner.jsonl` (`up` adds `learner_lost` and `final_buffer` when
a learner process ended without its own). A resumed run appends to the same log: a `resumed` or
`learner_lost` record voids the earlier records of the steps after its `from_step` (`asyncrl.tools.audit`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from asyncrl.core.records.base import Record


@dataclass(frozen=True, kw_only=True)
class Step(Record):
    """One learner step done: it published `version`."""

    KIND = "step"
    FLAT = "metrics"
    step: int
    version: int
    push_wait_s: float = 0.0
    """Seconds the weight push cost the learner's critical path."""
    metrics: dict = field(default_factory=dict)
    """The step's figures by name ("reward/mean", "staleness/hist", "rc/kl_k3", "time/busy", ...)."""


@dataclass(frozen=True, kw_only=True)
class Trained(Record):
    KIND = "trained"
    step: int
    version: int
    entry_ids: list[str]
    group_ids: list[str]
    trajectories: int


@dataclass(frozen=True, kw_only=True)
class Eval(Record):
    """A held-out evaluation of the weights of `version`."""

    KIND = "eval"
    FLAT = "scores"
    step: int
    version: int
    accuracy: float
    """Greedy accuracy on the held-out set."""
    seconds: float
    by: str
    """"learner" | "replica"."""
    replica_id: str | None = None
    weight_versions: list[int] | None = None
    """Versions the replica's tokens came from (an evaluation on a replica)."""
    scores: dict = field(default_factory=dict)
    """Further scores by name ("pass@k")."""


@dataclass(frozen=True, kw_only=True)
class EvalSkipped(Record):
    KIND = "eval_skipped"
    step: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class EvalFallback(Record):
    """An evaluation a replica could not run; the learner ran it."""

    KIND = "eval_fallback"
    step: int
    error: str


@dataclass(frozen=True, kw_only=True)
class WeightsPushed(Record):
    """The learner's side of a weight push of `version`."""

    KIND = "push"
    version: int
    push_s: float
    broadcast_s: float
    push_bytes: int
    receivers: int
    acked: list[str]
    dropped: list[str]
    attempts: int
    new_group: bool
    background: bool
    in_band: bool
    begin_s: float
    acks_s: float
    commit_s: float


@dataclass(frozen=True, kw_only=True)
class Resync(Record):
    """A resync push of the current version to replicas that lack it."""

    KIND = "resync"
    version: int
    acked: list[str]
    dropped: list[str]
    seconds: float


@dataclass(frozen=True, kw_only=True)
class TeacherUnavailable(Record):
    KIND = "teacher_unavailable"
    step: int
    error: str


@dataclass(frozen=True, kw_only=True)
class LearnerStarted(Record):
    """A learner process began training toward `total_steps` (the audit's measure of a run that ended short)."""

    KIND = "learner_started"
    total_steps: int
    from_step: int


@dataclass(frozen=True, kw_only=True)
class Resumed(Record):
    """A learner process started from a checkpoint at `from_step` (0: from the model)."""

    KIND = "resumed"
    from_step: int
    version: int
    path: str


@dataclass(frozen=True, kw_only=True)
class LearnerLost(Record):
    """Written by `up`: the last learner process ended without its closing records; the run continues from
    `from_step`."""

    KIND = "learner_lost"
    from_step: int
    checkpoint: str | None


@dataclass(frozen=True, kw_only=True)
class RecoveredPending(Record):
    """Entries delivered to a previous learner process and never acknowledged: trained first."""

    KIND = "recovered_pending"
    entries: list[str]


@dataclass(frozen=True, kw_only=True)
class FinalBuffer(Record):
    """What the buffer held when the run ended (the audit counts those groups as left, not lost)."""

    KIND = "final_buffer"
    entry_ids: list[str]
    snapshot_t: float | None = None
    """When the buffer was listed (None: at `t`)."""
    written_by: str | None = None
    """"up" when the learner could not write it itself."""


@dataclass(frozen=True, kw_only=True)
class CheckpointSaved(Record):
    KIND = "checkpoint_saved"
    step: int
    version: int
    path: str
    acked: int
    seconds: float
    stall_s: float
    """Seconds the save cost the learner's step loop."""
    background: bool


@dataclass(frozen=True, kw_only=True)
class CoveredAcked(Record):
    """Entries a checkpoint covers, acknowledged by whoever continued from it (its learner died between the save
    and the acknowledgement)."""

    KIND = "covered_acked"
    path: str
    acked: int
    covered: int


@dataclass(frozen=True, kw_only=True)
class MemoryPlanned(Record):
    """The learner's host-memory plan at start (`learner.memory_plan`), in bytes, and what it gave up to fit."""

    KIND = "memory_plan"
    parts: dict[str, int]
    """Bytes per part kept: weights, gradients, optimizer, reference, push_snapshot, checkpoint_snapshot,
    push_base."""
    needed: int
    """Their total with the headroom."""
    available: int
    given_up: list[str]
    """Settings turned off to fit (learner.checkpoint.background, learner.push_in_background)."""


@dataclass(frozen=True, kw_only=True)
class MemoryMeasured(Record):
    """The check after the first step (`learner.memory_plan.MemoryWatch`): its measured peak plus the snapshots
    kept against what the process can reach, in bytes."""

    KIND = "memory_measured"
    peak: int
    reachable: int
    predicted: int
    given_up: list[str]


@dataclass(frozen=True, kw_only=True)
class LearnerDied(Record):
    """Written by `up`: a learner process ended with an error, and what `up` did about it."""

    KIND = "learner_died"
    exit_code: int
    """The process's exit status (negative: the signal that ended it, as -9 for SIGKILL)."""
    cause: str
    """What `up` makes of it: "out_of_memory" (SIGKILL while the kernel's OOM kill count rose), "killed",
    "config_error" (exit 2: the learner refused its settings), or "error"."""
    action: str
    """"restarted", "restarted with <settings>" or "not restarted: <why>"."""
