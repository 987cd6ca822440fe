"""Weight-push orchestration, the part of `ControllerState` that opens, commits and aborts pushes.

A mixin rather than a separate object because a push touches the same guarded state as the leases (the
version that the staleness bound reads, the replicas' sync flags) under the same lock and condition
variable. `ControllerState` provides `_cond`, `_registry`, `_push`, `_current_version`, `_clock`,
`_notify`, `config`, `events`, `metrics`, `_pushes_committed`, `_learner`, `_reap_locked` and `_changed`.

Handshake (docs/architecture.md): Begin picks the receivers (every live replica for version current+1, the
live replicas that need sync for version == current), ranks them 1..N, builds the plan (world_size N+1)
and fans out `Rollout.UpdateWeights`; Commit waits for the acks (bounded by push_timeout_s from Begin),
drops and flags the receivers that failed, commits a new version and wakes the held lease requests.
"""

from __future__ import annotations

import uuid

from asyncrl.controller.errors import PreconditionFailed
from asyncrl.controller.push import NEW, RESYNC, PushSession, Receiver
from asyncrl.controller.results import CommitResult, LearnerProgress, LearnerPulse

from asyncrl.core.weights.plan import PushPlan, TensorMeta


class PushOrchestration:
    def begin_push(
        self,
        version: int,
        store_address: str,
        transport: str,
        tensors: tuple[TensorMeta, ...],
        bucket_bytes: int,
        timeout_s: float,
    ) -> PushSession:
        """Open a push: pick the receivers, rank them 1..N, build the plan, start the fan-out."""
        with self._cond:
            self._reap_locked()
            now = self._clock()
            aborted_previous = None
            if self._push is not None:
                age = now - self._push.begun_at
                # A push whose commit already waits for its receivers is never superseded: that wait is
                # itself bounded by push_timeout_s, so the learner just asks again a moment later.
                if age < self.config.push_timeout_s or self._push.commit_started:
                    step = "its commit is in progress" if self._push.commit_started else "commit it first"
                    raise PreconditionFailed(
                        f"push {self._push.push_id!r} (version {self._push.plan.version}) is still open "
                        f"({age:.1f} s old); {step}"
                    )
                aborted_previous = self._push.push_id
                self._abort_locked(self._push, f"no commit within push_timeout_s ({age:.1f} s)")
            current = self._current_version
            if version == current + 1:
                mode, chosen = NEW, self._registry.live()
            elif version == current:
                mode, chosen = RESYNC, [r for r in self._registry.live() if r.needs_sync(current)]
            else:
                raise PreconditionFailed(
                    f"version: must be {current + 1} (new policy) or {current} (resync), got {version}"
                )
            receivers = [Receiver(r.replica_id, r.address, rank) for rank, r in enumerate(chosen, start=1)]
            plan = PushPlan(
                push_id=f"push-v{version}-{uuid.uuid4().hex[:8]}",
                version=version,
                store_address=store_address,
                world_size=len(receivers) + 1,
                transport=transport,
                tensors=tuple(tensors),
                bucket_bytes=bucket_bytes,
                timeout_s=timeout_s or self.config.push_timeout_s,
            )
            session = PushSession(plan, mode, receivers, now, self._notify, self.config.push_timeout_s)
            self._push = session
            self.events.write(
                "push_begun", push_id=plan.push_id, version=version, mode=mode,
                receivers=[r.replica_id for r in receivers], world_size=plan.world_size,
                current_version=current, aborted_previous=aborted_previous,
            )  # fmt: skip
            session.start()
            return session

    def commit_push(self, push_id: str, sender_ok: bool, error: str = "") -> CommitResult:
        """Wait (bounded) for the receivers' acks, drop the failed ones, commit the version."""
        with self._cond:
            session = self._open_push(push_id)
            if session.commit_started:
                raise PreconditionFailed(f"push_id: a commit of {push_id!r} is already in progress")
            session.commit_started = True
            if not sender_ok:
                self._bury_unreachable_locked(session.outcomes_so_far())
                self._abort_locked(session, f"sender failed: {error or 'no detail'}")
                return CommitResult(
                    False, self._current_version, [], [r.replica_id for r in session.receivers]
                )
            session_left_s = self.config.push_timeout_s - (self._clock() - session.begun_at)
        outcomes = session.wait(session_left_s)  # outside the lock: leases keep flowing meanwhile
        with self._cond:
            if self._push is not session:
                raise PreconditionFailed(
                    f"push_id: push {push_id!r} was aborted while waiting for its receivers"
                )
            self._push = None
            version = session.plan.version
            acked = [r.replica_id for r in session.receivers if outcomes[r.replica_id].ok]
            dropped = [r.replica_id for r in session.receivers if not outcomes[r.replica_id].ok]
            for replica_id in acked:
                replica = self._registry.get(replica_id)
                replica.weight_version, replica.force_sync = version, False
            for replica_id in dropped:
                self._registry.get(replica_id).force_sync = True
                self.events.write(
                    "replica_dropped", push_id=push_id, replica_id=replica_id, version=version,
                    error=outcomes[replica_id].error,
                )  # fmt: skip
            self._bury_unreachable_locked(outcomes)
            if session.mode == NEW:
                self._current_version = max(self._current_version, version)  # versions only grow
            seconds = self._clock() - session.begun_at
            self._pushes_committed += 1
            self.metrics.pushes_committed.inc()
            self.metrics.replicas_dropped.inc(len(dropped))
            self.metrics.push_seconds.observe(max(0.0, seconds))
            self.events.write(
                "push_committed", push_id=push_id, version=self._current_version, mode=session.mode,
                acked=acked, dropped=dropped, seconds=seconds,
            )  # fmt: skip
            self._changed()
            return CommitResult(True, self._current_version, acked, dropped)

    def learner_heartbeat(self, step: int, version: int, consumed: int) -> LearnerPulse:
        """Record the learner's progress; ask for a resync push when a live replica needs one."""
        with self._cond:
            self._reap_locked()
            now = self._clock()
            self._learner = LearnerProgress(step, version, consumed, now)
            push_open = self._push is not None and now - self._push.begun_at < self.config.push_timeout_s
            current = self._current_version
            lagging = any(r.needs_sync(current) for r in self._registry.live())
            return LearnerPulse(lagging and not push_open, current)

    # ---- internals (call with the lock held) ----------------------------------------------------------

    def _open_push(self, push_id: str) -> PushSession:
        if self._push is None or self._push.push_id != push_id:
            open_id = f" (the open push is {self._push.push_id!r})" if self._push else " (no push is open)"
            raise PreconditionFailed(f"push_id: {push_id!r} is not the open push{open_id}")
        return self._push

    def _bury_unreachable_locked(self, outcomes: dict) -> None:
        """A receiver nothing listens for any more is dead now, not after the heartbeat time-out: the retry
        of this push must not pick it again, and its leases return their quota at once. If it was only
        unreachable for a moment, its next heartbeat revives it (it then needs a resync)."""
        for replica_id, outcome in outcomes.items():
            replica = self._registry.get(replica_id)
            if not outcome.unreachable or not replica.alive:
                continue
            replica.alive = False
            leases = self._leases.expire_replica(replica_id, "unreachable")
            self.events.write(
                "replica_dead", replica_id=replica_id, silent_s=replica.heartbeat_age(self._clock()),
                leases_expired=len(leases), reason="unreachable",
            )  # fmt: skip
            self._log_expired(leases, "unreachable")

    def _abort_locked(self, session: PushSession, reason: str) -> None:
        # A receiver may have loaded part of the weights in flight: treat them all as possibly mixed.
        for receiver in session.receivers:
            self._registry.get(receiver.replica_id).force_sync = True
        self._push = None
        self.events.write(
            "push_aborted",
            push_id=session.push_id,
            version=session.plan.version,
            mode=session.mode,
            reason=reason,
        )
        self._changed()
