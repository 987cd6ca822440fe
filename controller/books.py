"""`StateBooks`: what every part of the controller's state shares, named in one place.

The controller's state is split into collaborators (`Admission`, `LearnerSeating`, `ReplicaReachability`,
`Liveness`) around one set of books: the lock and its condition, the clocks, the replica registry, the lease
book, the push coordinator, the policy version, the learner's seat and report, the event log, the metrics
and the store. Each collaborator receives the books (and the other collaborators it calls) in its
constructor; none reaches into another's private attributes.

Every mutation happens with `cond` held and ends with `changed()`: it saves what changed to the store, updates
the gauges and wakes the requests held for a lease (threads on the condition, coroutines through the wakers).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from asyncrl.controller.controller_metrics import ControllerMetrics
from asyncrl.controller.difficulty import DifficultyBook
from asyncrl.controller.learner_seat import LearnerSeat, Probe
from asyncrl.controller.leases import LeaseBook
from asyncrl.controller.persistence import ControllerStore, StateWriter
from asyncrl.controller.registry import ReplicaRegistry
from asyncrl.controller.results import LearnerReport
from asyncrl.core.config.schema import ControllerConfig
from asyncrl.core.runtime.events import EventSink
from asyncrl.push.coordinator import PushCoordinator, PushTiming
from asyncrl.push.session import WeightNotifier


class StateBooks:
    def __init__(self, config: ControllerConfig, batch_size: int, *, events: EventSink,
                 metrics: ControllerMetrics, notify: WeightNotifier, store: ControllerStore, run_id: str,
                 learner_probe: Probe | None, clock: Callable[[], float], wall_clock: Callable[[], float]):
        self.config, self.batch_size, self.eta = config, batch_size, config.eta
        self.events, self.metrics = events, metrics
        self.clock = clock
        """Monotonic seconds (injectable): heartbeats, lease TTLs, push ages."""
        self.wall = wall_clock
        """Unix seconds: lease expiries told to replicas, the status page's history."""
        self.cond = threading.Condition()
        """The one lock over everything here; held requests wait on it."""
        self.registry = ReplicaRegistry(config.heartbeat_timeout_s, config.max_replicas, config.forget_dead_after_s,
                                        config.max_replicas_per_host, config.trust_initial_weights)
        self.leases = LeaseBook(config.lease_ttl_s, config.start_admitted, config.start_prompt_index,
                                config.lease_max_s)
        self.pushes = PushCoordinator(timing=PushTiming(config.push_timeout_s, config.push_backoff_s),
                                      replicas=self.registry, notify=notify, events=events, metrics=metrics)
        self.current_version = config.start_version
        """The policy version i: a committed push of i+1 moves it; versions only grow, but for a timeline reset."""
        self.seat = LearnerSeat(learner_probe)
        self.learner: LearnerReport | None = None
        """The seated learner's last heartbeat."""
        self.held = 0
        """Lease requests held now (waiting for admission)."""
        self.wakers: list[Callable[[], None]] = []
        """Called (under the lock: they only schedule) whenever a held request may have become admissible."""
        self.end_wakers: list[Callable[[], None]] = []
        """Called (under the lock: they only schedule) whenever a lease ended (`Controller.AwaitLeases`)."""
        self._ended_seen = 0
        self.run_id = run_id
        self.writer = StateWriter(store)
        self.difficulty = DifficultyBook(config.difficulty)
        """Pass-rate estimates per prompt, and the hard prompts a lease may sample again."""

    def changed(self, wake: bool = True, replicas: bool = False) -> None:
        """After a mutation (lock held): save, update the gauges and, with `wake`, wake the held requests.
        `replicas`: the mutation may have changed a replica (the save compares them all)."""
        self.persist(replicas)
        self.publish_gauges()
        if self.leases.ended_total != self._ended_seen:  # whatever ended them: completion, expiry, reset
            self._ended_seen = self.leases.ended_total
            for wake_up in self.end_wakers:
                wake_up()
        if wake:
            self.cond.notify_all()
            for wake_up in self.wakers:
                wake_up()

    def persist(self, replicas_changed: bool = False) -> None:
        """Write what changed to the store (one transaction; nothing when unchanged). Replicas are compared
        only when `replicas_changed` says an operation may have changed one (a scan of all of them)."""
        meta = {
            "run_dir": self.run_id, "current_version": self.current_version, "admitted": self.leases.admitted,
            "next_prompt_index": self.leases.next_prompt_index, "granted_total": self.leases.granted_total,
            "expired_total": self.leases.expired_total, "pushes_committed": self.pushes.committed,
            "learner_key": self.seat.holder.key.hex(), "learner_address": self.seat.holder.address,
            "regenerate": ",".join(map(str, self.leases.regenerate)),
        }  # fmt: skip
        self.writer.write(meta, self.leases.active_by_id(), self.registry.all() if replicas_changed else None,
                          self.difficulty.changes())

    def publish_gauges(self) -> None:
        self.metrics.current_version.set(self.current_version)
        self.metrics.admitted_trajectories.set(self.leases.admitted)
        self.metrics.held_requests.set(self.held)
        self.metrics.live_replicas.set(len(self.registry.live()))
        self.metrics.hard_prompts.set(self.difficulty.hard)
        self.metrics.tracked_prompts.set(self.difficulty.tracked)
