"""A replica's session with the controller: registration, heartbeats, re-registration after a
controller restart."""

from __future__ import annotations

import logging
import threading
import time

import grpc

from asyncrl.v1 import controller_pb2

log = logging.getLogger(__name__)


class HeldLeases:
    """The leases a replica still works on (granted, not yet completed or given up): its heartbeats report
    them, so the controller expires any other lease of the replica instead of keeping it alive."""

    def __init__(self, clock=time.monotonic):
        self._lock = threading.Lock()
        self._since: dict[str, float] = {}
        self._clock = clock

    def add(self, lease_id: str) -> None:
        with self._lock:
            self._since.setdefault(lease_id, self._clock())

    def discard(self, lease_id: str) -> None:
        with self._lock:
            self._since.pop(lease_id, None)

    def snapshot(self) -> list[str]:
        with self._lock:
            return sorted(self._since)

    def oldest_age_s(self) -> float:
        """How long the oldest lease still held has been held (0 when none is)."""
        with self._lock:
            return self._clock() - min(self._since.values()) if self._since else 0.0


class LoopStuck(RuntimeError):
    """A lease held past `rollout.lease_deadline_s`: the rollout loop no longer moves."""


class ReplicaSession:
    def __init__(self, controller_stub, address: str, engine, engine_type: str, replica_id: str = "",
                 held: HeldLeases | None = None, on_registered=None, lease_deadline_s: float = 0.0,
                 in_band_pushes: bool = False):
        self._stub = controller_stub
        self.in_band_pushes = in_band_pushes
        """Registered as following the broadcast groups it joins: true when its Rollout service has a
        `PushListener` (`rollout_service.create_server` with a push key)."""
        self.lease_deadline_s = lease_deadline_s
        """`rollout.lease_deadline_s`: `heartbeat_forever` raises `LoopStuck` for a lease held longer (0 = never)."""
        self._on_registered = on_registered
        """Called with the granted replica id after every registration (the metrics' `replica` label)."""
        self.held = held or HeldLeases()
        self._address = address
        self._engine = engine
        self._engine_type = engine_type
        self.replica_id = replica_id
        self.needs_sync = False
        self._held_back_for = ""
        """The push problem last reported in the log (one warning per hold-back reason)."""
        self.heartbeat_interval_s = 1.0
        self.push_key = b""
        """Secret of the current registration: pushes must be signed with it (empty until registered)."""

    def register(self) -> None:
        resp = self._stub.RegisterReplica(
            controller_pb2.RegisterReplicaRequest(
                address=self._address,
                replica_id=self.replica_id,
                weight_version=self._engine.weight_version,
                engine=self._engine_type,
                push_key=self.push_key,  # registering again from the same process: we hold the id
                in_band_pushes=self.in_band_pushes,
            ),
            timeout=30,
        )
        self.replica_id = resp.replica_id
        self.push_key = resp.push_key
        self.needs_sync = resp.needs_sync
        self.heartbeat_interval_s = resp.heartbeat_interval_s or self.heartbeat_interval_s
        log.info("registered as %s (controller version %d, needs_sync=%s)", self.replica_id,
                 resp.current_version, resp.needs_sync)
        if self._on_registered is not None:
            self._on_registered(self.replica_id)

    def heartbeat(self) -> None:
        try:
            request = controller_pb2.HeartbeatRequest(
                replica_id=self.replica_id, weight_version=self._engine.weight_version,
                held_leases=controller_pb2.HeldLeases(lease_ids=self.held.snapshot()),
                adapter_checksum=self._engine.adapter_checksum,
            )
            resp = self._stub.Heartbeat(request, timeout=max(5.0, self.heartbeat_interval_s * 3))
            self.needs_sync = resp.needs_sync
            self._report_held_back(resp)
        except grpc.RpcError as err:
            if err.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
                # The controller does not know us (it restarted, or declared us dead): join again.
                try:
                    self.register()
                except grpc.RpcError as again:  # the next heartbeat tries again
                    log.warning("registering again failed: %s", again.details())
            else:
                log.warning("heartbeat failed: %s", err.details())

    def _report_held_back(self, resp) -> None:
        """Say once per hold-back why the controller leaves this replica out of its pushes: the replica's own
        log is where its operator looks first (usually a wrong rollout.advertise_host)."""
        problem = resp.push_problem if resp.held_back_s > 0 else ""
        if problem and problem != self._held_back_for:
            log.warning("the controller leaves this replica (%s) out of weight pushes for %.0f s more, so it "
                        "gets no leases: %s. Is this replica reachable at the address it registered "
                        "(rollout.advertise_host, rollout.host, rollout.port)?", self.replica_id, resp.held_back_s,
                        problem)  # fmt: skip
        self._held_back_for = problem

    def heartbeat_forever(self, stop: threading.Event) -> None:
        """Heartbeat until `stop`. Raises `LoopStuck` rather than keep alive a lease held past the deadline:
        heartbeats from a replica whose loop is stuck would hold that lease's quota, and the run, forever."""
        while not stop.wait(self.heartbeat_interval_s):
            self.check_not_stuck()
            self.heartbeat()

    def check_not_stuck(self) -> None:
        age = self.held.oldest_age_s()
        if self.lease_deadline_s > 0 and age > self.lease_deadline_s:
            raise LoopStuck(f"a lease has been held for {age:.0f} s, past rollout.lease_deadline_s "
                            f"({self.lease_deadline_s:g} s): the rollout loop is stuck (an engine or a call that "
                            "never returns); exiting so that this replica is restarted and the lease's quota "
                            "returns")
