"""Plain answers of `ControllerState`'s operations (the service edge copies them into protobuf messages)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for the annotation only: results stay plain data
    from asyncrl.push.session import PushSession


@dataclass(frozen=True)
class Registration:
    replica_id: str
    current_version: int
    needs_sync: bool
    heartbeat_interval_s: float
    push_key: bytes = b""


@dataclass(frozen=True)
class ReplicaPulse:
    """Answer to a replica heartbeat."""

    current_version: int
    needs_sync: bool
    held_back_s: float = 0.0
    """How much longer it sits out pushes (`Replica.hold_back`), and why (`push_problem`)."""
    push_problem: str = ""


@dataclass(frozen=True)
class LeaseDecision:
    granted: bool
    version: int
    """Policy version at admission (granted) or now (refused)."""
    lease_id: str = ""
    prompt_index: int = 0
    expires_unix_s: float = 0.0
    reason: str = ""
    held_s: float = 0.0
    sample_index: int | None = None
    """A hard prompt to sample again instead of `prompt_index` (None: `prompt_index`)."""
    num_trajectories: int = 0
    """Trajectories to generate under the lease (granted): the request's, or a hard prompt's larger group."""


@dataclass(frozen=True)
class LeaseBatch:
    """Answer to a request for several leases."""

    leases: list[LeaseDecision]
    """The grants, in admission order; empty: none (refused)."""
    reason: str
    """Why no (further) lease was granted; empty when every lease asked for was."""
    version: int
    """Policy version at the decision."""
    held_s: float = 0.0


@dataclass(frozen=True)
class CommitResult:
    committed: bool
    current_version: int
    acked: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    next_push: PushSession | None = None
    """The next push, reserved for the learner when it asked (`PushCoordinator.reserve`)."""


@dataclass(frozen=True)
class LearnerPulse:
    """Answer to a learner heartbeat."""

    sync_requested: bool
    current_version: int


@dataclass(frozen=True)
class LearnerReport:
    """The learner's last heartbeat as the controller saw it."""

    step: int
    version: int
    consumed: int
    at: float
    """State clock time of the heartbeat."""
    progress: LearnerFigures | None = None


@dataclass(frozen=True)
class LearnerFigures:
    """What the learner reports after a step, for the status page: its figures by name
    (`asyncrl.core.records.learner_figures`; a figure it did not report is absent)."""

    total_steps: int = 0
    values: dict[str, float] = field(default_factory=dict)

    def get(self, name: str) -> float | None:
        return self.values.get(name)


@dataclass(frozen=True)
class LearnerRegistration:
    """Answer to a learner taking the seat."""

    learner_key: bytes
    current_version: int


@dataclass(frozen=True)
class TimelineReset:
    """Answer to a timeline reset."""

    current_version: int
    leases_expired: int
    prompt_index: int
