"""The learner's side of the run's learner seat (`asyncrl.controller.learner_seat`): `SeatedController` is the
controller's stub as the seated learner. `take_seat` registers (`Controller.RegisterLearner`) with the address
of this learner's status service; from then on every learner-only call carries the seat's key, and the status
service answers the controller's liveness challenges under it (`answer`), so no other process can take the
seat while this learner lives. A learner that lost its seat (another learner took over) gets PERMISSION_DENIED
on its next call and stops.
"""

from __future__ import annotations

import logging
import time

import grpc

from asyncrl.core.wire.auth import liveness_mac
from asyncrl.core.wire.learner_secret import new_nonce, seat_proof
from asyncrl.v1 import controller_pb2

log = logging.getLogger(__name__)

LEARNER_ONLY = ("BeginWeightPush", "CommitWeightPush", "LearnerHeartbeat", "ResetTimeline", "ReturnQuota",
                "AwaitLeases")


class SeatedController:
    """Wraps a `ControllerStub`: the learner-only calls get the seat's `learner_key`, the others pass through."""

    def __init__(self, stub, learner_secret: bytes | None = None):
        self._stub = stub
        self._secret = learner_secret
        """Proves this process is the run's learner at registration (`asyncrl.core.wire.learner_secret`)."""
        self.key = b""
        """Empty until `take_seat`."""

    def take_seat(self, address: str, patience_s: float, timeout_s: float = 30.0) -> int:
        """Register as the run's learner at `address` (host:port of the status service); returns the
        controller's current version. Raises the RpcError: ALREADY_EXISTS at once when a live learner holds the
        seat; UNAVAILABLE after `patience_s` of retries while the controller cannot challenge the holder, which
        still heartbeats (the seat passes once that has been silent for controller.heartbeat_timeout_s)."""
        deadline = time.monotonic() + patience_s
        while True:
            try:
                reply = self._stub.RegisterLearner(self._registration(address), timeout=timeout_s)
                break
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() >= deadline:
                    raise
                log.warning("the run's learner seat is not free yet, retrying: %s", err.details())
                time.sleep(1.0)
        self.key = reply.learner_key
        log.info("took the run's learner seat at %s (controller at version %d)", address, reply.current_version)
        return reply.current_version

    def _registration(self, address: str) -> controller_pb2.RegisterLearnerRequest:
        """A fresh proof for every attempt: the controller takes each one once."""
        if self._secret is None:
            return controller_pb2.RegisterLearnerRequest(address=address)
        issued, nonce = int(time.time()), new_nonce()
        return controller_pb2.RegisterLearnerRequest(address=address, proof_unix_s=issued, proof_nonce=nonce,
                                                     seat_proof=seat_proof(self._secret, address, issued, nonce))

    def answer(self, challenge: bytes) -> bytes:
        """This learner's answer to a liveness challenge (empty before it holds the seat)."""
        return liveness_mac(self.key, challenge) if self.key and challenge else b""

    def __getattr__(self, name: str):
        method = getattr(self._stub, name)
        if name not in LEARNER_ONLY:
            return method

        def with_key(request, *args, **kwargs):
            request.learner_key = self.key
            return method(request, *args, **kwargs)

        return with_key
