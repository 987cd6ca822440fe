"""The controller's records, in `<run_dir>/events/controller.jsonl`: the audit trail of admission (from them one
checks that every lease satisfied the staleness bound), of replicas and of versions (they only grow)."""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.core.records.base import Record


@dataclass(frozen=True, kw_only=True)
class ControllerStarted(Record):
    """Written by `serve`. A resumed run starts at its checkpoint's version, so the audit reads each start not
    `restored` from a saved state as a new epoch of version ordering."""

    KIND = "controller_started"
    grpc: str
    """host:port of the gRPC service."""
    http: str
    """host:port of the status page."""
    eta: int | None
    """The staleness bound (None: unbounded)."""
    batch_size: int
    start_version: int
    start_admitted: int
    start_prompt_index: int
    state_store: str
    restored: dict | None = None
    """What was restored from the saved state (None: a fresh start)."""


@dataclass(frozen=True, kw_only=True)
class ReplicaRegistered(Record):
    KIND = "replica_registered"
    replica_id: str
    address: str
    weight_version: int
    engine: str
    needs_sync: bool
    current_version: int
    reregistered: bool
    """The id was known (a restart): its old leases expire with reason "reregistered"."""


@dataclass(frozen=True, kw_only=True)
class ReplicaRevived(Record):
    """A replica declared dead spoke again (its leases had already expired)."""

    KIND = "replica_revived"
    replica_id: str


@dataclass(frozen=True, kw_only=True)
class ReplicaDead(Record):
    KIND = "replica_dead"
    replica_id: str
    silent_s: float
    leases_expired: int
    reason: str | None = None
    """"unreachable": a push found nothing listening at its address; "gone": the controller's dial of a silent
    lease holder's address was refused; None: silent past the heartbeat time-out."""


@dataclass(frozen=True, kw_only=True)
class ReplicaForgotten(Record):
    KIND = "replica_forgotten"
    replica_id: str
    silent_s: float


@dataclass(frozen=True, kw_only=True)
class LeaseGranted(Record):
    """Audit: eta is None or floor((admitted_after - 1) / batch_size) <= version + eta."""

    KIND = "lease_granted"
    lease_id: str
    replica_id: str
    n: int
    admitted_after: int
    """N_r after this admission, i.e. the N_r of the lease's last trajectory."""
    version: int
    """The policy version i at admission."""
    eta: int | None
    batch_size: int
    prompt_index: int
    held_s: float
    sample_index: int | None = None
    """The prompt sampled under this lease instead of its own `prompt_index` (None: its own)."""
    regenerated: bool = False
    """`sample_index` is a dropped group's prompt generated again (else a hard prompt sampled again)."""


@dataclass(frozen=True, kw_only=True)
class LeaseCompleted(Record):
    KIND = "lease_completed"
    lease_id: str
    replica_id: str
    n: int
    num_written: int
    returned: int
    """n - num_written: the quota that returns."""
    admitted_after: int
    reward_mean: float | None = None
    """Mean reward of the lease's samples, as its replica reported it (None: not reported)."""
    claimed: int | None = None
    """What the replica claimed it wrote, when more than reached the buffer under the lease (None: as counted)."""


@dataclass(frozen=True, kw_only=True)
class LeaseExpired(Record):
    KIND = "lease_expired"
    lease_id: str
    replica_id: str
    n: int
    returned: int
    admitted_after: int
    reason: str
    """"ttl" | "max_age" | "replica_dead" | "reregistered" | "unreachable" | "gone" | "abandoned" |
    "timeline_reset"."""


@dataclass(frozen=True, kw_only=True)
class PushBegun(Record):
    KIND = "push_begun"
    push_id: str
    version: int
    mode: str
    """"new" | "resync"."""
    receivers: list[str]
    """Replica ids in rank order."""
    world_size: int
    current_version: int
    """Before the push."""
    aborted_previous: str | None
    """The push id it aborted, if any."""
    group_id: str
    new_group: bool
    in_band: bool
    reserved: bool
    """Opened at the previous commit for the learner (`CommitWeightPush.reserve_next`)."""


@dataclass(frozen=True, kw_only=True)
class PushCommitted(Record):
    """Audit: `version` never decreases from one record to the next and grows by exactly 1 on mode "new"."""

    KIND = "push_committed"
    push_id: str
    version: int
    """The current version after the commit."""
    mode: str
    acked: list[str]
    dropped: list[str]
    seconds: float
    """From its Begin; for a reserved push, the learner's own measure up to its commit plus the commit."""
    in_band: bool


@dataclass(frozen=True, kw_only=True)
class PushAborted(Record):
    """The version is not committed."""

    KIND = "push_aborted"
    push_id: str
    version: int
    mode: str
    reason: str
    """Sender failure, time-out, or a reserved push superseded without being named unused."""


@dataclass(frozen=True, kw_only=True)
class PushWithdrawn(Record):
    """A reserved push its learner dropped unused; nobody took it."""

    KIND = "push_withdrawn"
    push_id: str
    version: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class ReplicaDropped(Record):
    KIND = "replica_dropped"
    push_id: str
    replica_id: str
    version: int
    """Of the push."""
    error: str


@dataclass(frozen=True, kw_only=True)
class ControllerStalled(Record):
    """The controller itself stood still `seconds` (a reap came that much later than due); every replica's
    silence, lease age and the learner's silence were moved on by it."""

    KIND = "controller_stalled"
    seconds: float
    replicas: int
    leases: int


@dataclass(frozen=True, kw_only=True)
class ReplicaReachable(Record):
    """It answered the controller's challenge at its address under its registration's key; from now on it joins
    pushes."""

    KIND = "replica_reachable"
    replica_id: str
    address: str
    failed_checks: int


@dataclass(frozen=True, kw_only=True)
class ReplicaHeldBack(Record):
    """It sits out pushes for `seconds` (`controller.push_backoff_s`, doubling with `failures`) after it could
    not be reached, never joined a push, or never answered the controller's challenge at its address."""

    KIND = "replica_held_back"
    replica_id: str
    address: str
    seconds: float
    failures: int
    problem: str


@dataclass(frozen=True, kw_only=True)
class LearnerRegistered(Record):
    """The learner's seat changed hands."""

    KIND = "learner_registered"
    address: str
    previous_address: str | None
    current_version: int


@dataclass(frozen=True, kw_only=True)
class LearnerRefused(Record):
    """A RegisterLearner without a valid proof of the learner secret."""

    KIND = "learner_refused"
    address: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class TimelineReset(Record):
    """The run went back to a checkpoint's `version` (a learner restarted alone, behind its controller): written
    by the controller (with `previous_version`) and by the learner (with `survivors`). The audit starts a new
    epoch of version ordering at the controller's."""

    KIND = "timeline_reset"
    version: int
    admitted: int
    prompt_index: int
    leases_expired: int
    previous_version: int | None = None
    """The controller's version before the reset (the controller's record)."""
    survivors: int | None = None
    """Buffered groups that belong to the new timeline (the learner's record)."""


@dataclass(frozen=True, kw_only=True)
class QuotaReturned(Record):
    """The learner dropped a group it read (older than η at the version that would train it) and gave its
    trajectories' quota back (`Controller.ReturnQuota`); N_r went down by `returned` (0 when the group's lease
    had expired: its quota came back then)."""

    KIND = "quota_returned"
    entry_id: str
    returned: int
    admitted_after: int
    reason: str
    prompt_index: int | None = None
    """The prompt the group was generated for, queued to be generated again (None: not)."""
    lease_id: str = ""
