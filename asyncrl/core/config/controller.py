"""The controller's section of the configuration schema (`ControllerConfig`): the staleness bound, liveness of
replicas and the learner's seat, leases, weight-push orchestration, and where its state is kept. Part of the one
schema in `asyncrl.core.config.schema`, kept apart as `learner_config.py` and `data_config.py` are."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from asyncrl.core.config.base import PinnedSection, Section


class DifficultyConfig(Section):
    """Difficulty-aware sampling: the controller's pass-rate estimate of each prompt (from the rewards the
    replicas report with each lease completion) and hard prompts sampled again."""

    replay_share: float = Field(0.0, ge=0, le=0.9)
    """Share of the leases that sample a hard prompt again instead of the next one of the stream (0 = off).
    The lease still takes the next stream position (so every lease keeps its own prompt index); that
    position's own prompt is not sampled."""
    hard_below: float = Field(0.25, ge=0, le=1)
    """A prompt whose mean reward so far is below this is hard (with 0/1 rewards: its pass rate)."""
    max_replays: int = Field(2, ge=1)
    """Times one prompt is sampled again at most: a prompt nobody solves in that many groups is left alone."""
    max_prompts: int = Field(100_000, ge=1)
    """Prompts whose estimate is kept (and persisted); beyond, the oldest are forgotten."""
    hard_group_size: int = Field(0, ge=0)
    """Samples in the group of a hard prompt sampled again (0: sampling.group_size, like every group). Larger
    puts more of each step's fixed budget (learner.batch_size trajectories; fewer prompts per step) where a
    group of G often holds no success to learn from: a prompt of pass rate p has none among G samples with
    probability (1 - p)^G. A multiple of sampling.group_size that divides learner.batch_size. A hard group
    never straddles two steps' shares of the budget: where fewer places are left in a step's share, the lease
    samples the stream instead."""


class ControllerConfig(PinnedSection):
    host: str = "127.0.0.1"
    """Interface the controller binds and the address others dial."""
    port: int = Field(50051, ge=0, le=65535)
    """gRPC port (0 = any free port, for tests)."""
    status_port: int = Field(8080, ge=0, le=65535)
    """HTTP port of the status page and /metrics (0 = any free port)."""
    eta: int | None = Field(2, ge=0)
    """Max staleness η, enforced when leases are granted: floor((N_r-1)/B) <= i + η. 0 = synchronous; null =
    unbounded. The learner trains the oldest groups it holds first (learner.oldest_first); one written only
    after its last admissible step began still reaches the learner a step late (measured in the demo: 0.25%
    of the trajectories at η + 1 with η = 2, none with η = 4)."""
    heartbeat_interval_s: float = Field(1.0, gt=0)
    """How often replicas heartbeat."""
    heartbeat_timeout_s: float = Field(10.0, gt=0)
    """A replica silent this long is dead: its leases expire and return their quota. Also how long the learner's
    seat stays with a holder the controller cannot challenge (no answer at all) after its last heartbeat; a
    learner taking the seat waits up to twice this long for it."""
    dial_silent_after_s: float = Field(1.5, ge=0)
    """A replica that holds leases, has answered the controller at its address before, and has been silent
    this long (less than heartbeat_timeout_s) is dialled there (a TCP connect): a refused connection means
    its process is gone, and it is declared dead at once, its leases returning their quota, instead of
    after heartbeat_timeout_s or its restart. A dial that connects (a paused or busy process) or gets no
    answer changes nothing. 0 = never dial."""
    forget_dead_after_s: float = Field(600.0, gt=0)
    """A replica dead this long is removed from the registry (it registers again if it comes back)."""
    max_replicas: int = Field(1024, ge=1)
    """Replicas registered at most (live, or dead and not yet forgotten). When full, a new registration
    takes the slot of the replica dead the longest; with none dead it gets RESOURCE_EXHAUSTED."""
    max_replicas_per_host: int = Field(64, ge=0)
    """Live replicas registered at most from one caller's host (the address the registration came from,
    not the one it names), so one host holding the token cannot fill the registry and keep other hosts'
    replicas out; more get RESOURCE_EXHAUSTED. 0 = no cap."""
    trust_initial_weights: bool = False
    """Let a replica that registers holding version 0 take leases on the weights it loaded itself, before any
    push reached it. Off: every replica earns its leases by acknowledging a push, the first included, so at
    the start of a fresh run the learner pushes version 0 to each replica while it waits for its first batch,
    and a token holder's replica with no engine behind it gets no lease at any version. On: saves that push
    (replicas generate while the learner loads), for deployments where every token holder is trusted."""
    lease_report_grace_s: float = Field(5.0, gt=0)
    """A lease missing from its replica's heartbeat (HeartbeatRequest.held_leases) is abandoned once it is
    older than this (the grace covers a grant whose reply crossed a heartbeat); it expires and returns its
    quota."""
    lease_ttl_s: float = Field(120.0, gt=0)
    """A lease not completed within this time (and not kept alive) expires and returns its quota."""
    lease_max_s: float = Field(1800.0, ge=0)
    """The longest a lease stays open, heartbeats or not: then it expires (reason "max_age") and returns its
    quota. Heartbeats keep a replica's leases alive, so without this limit a replica whose heartbeats go on
    while its generation never ends (or any client with the run's token that takes leases and never completes
    them) holds their quota, and at a small eta stalls the learner, for as long as it heartbeats. Set it above
    the longest generation of one lease and at least `rollout.lease_deadline_s` (refused otherwise), after which
    a stuck replica of ours restarts itself. 0 = no limit."""
    max_hold_s: float = Field(5.0, gt=0)
    """Longest a held AcquireLease waits server-side before answering granted=false (the client asks again)."""
    push_timeout_s: float = Field(120.0, gt=0)
    """A receiver that has not acknowledged a push within this time is dropped from it."""
    push_backoff_s: float = Field(10.0, gt=0)
    """A replica that failed a push by never joining the broadcast, or whose address answered nothing, is left
    out of the pushes that follow for this long, doubling with each further failure up to
    32 times this; it needs a resync, so it gets no leases meanwhile. The push is retried without it at once. A
    push it acknowledges clears it. Without this, one replica the controller or the learner cannot reach (a
    wrong `rollout.advertise_host`) failed every push. The same back-off holds a new registration out of
    pushes while it does not answer the controller's challenge at its address (after three quick retries);
    it is challenged again when the back-off ends."""
    start_version: int = Field(0, ge=0)
    """Policy version the controller starts at (`up --resume` sets it to the checkpoint's version)."""
    start_admitted: int = Field(0, ge=0)
    """N_r the controller starts with: trajectories already trained or waiting in the buffer (`up --resume`)."""
    start_prompt_index: int = Field(0, ge=0)
    """First prompt index handed out (`up --resume`: past every prompt already trained or in the buffer)."""
    state_store: Literal["redis", "none"] = "redis"
    """Where the controller keeps its state (version, N_r, prompt cursor, replicas, leases) so a restarted
    controller continues where it stopped: "redis" (the buffer's Redis, under `state_key`; every deployment)
    or "none" (lost with the process; needs no Redis)."""
    state_key: str = "asyncrl:controller"
    """Redis key prefix of the controller's state. A saved state wins over the start_* fields; one saved by
    another run_dir is refused (use another key, or `up --resume`, which starts a new controller timeline)."""
    difficulty: DifficultyConfig = DifficultyConfig()
    """Per-prompt pass rates and hard prompts sampled again."""
    max_restarts: int = Field(3, ge=0)
    """`asyncrl up` restarts a controller that dies (same ports; it restores its state from the store), at
    most this many times."""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"
