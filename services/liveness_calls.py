"""The controller's liveness probes: ask the holder of a replica id, or of the learner's seat, to prove it is
still there (`Rollout.GetStatus`, `Learner.GetStatus` with a challenge)."""

from __future__ import annotations

import grpc

from asyncrl.core.wire.auth import Auth
from asyncrl.core.wire.grpc_util import channel, dial
from asyncrl.v1 import learner_pb2, learner_pb2_grpc, rollout_pb2, rollout_pb2_grpc


def grpc_liveness_answer(address: str, challenge: bytes, *, auth: Auth, timeout_s: float = 2.0) -> bytes:
    """Ask the replica at `address` to answer `challenge` (`Rollout.GetStatus`); b"" when nothing answers in
    time (the process is gone or hung) or it answers without a key."""
    answer = _challenge(address, auth, lambda ch: rollout_pb2_grpc.RolloutStub(ch).GetStatus(
        rollout_pb2.RolloutStatusRequest(challenge=challenge), timeout=timeout_s))
    return answer or b""


def grpc_learner_liveness_answer(address: str, challenge: bytes, *, auth: Auth,
                                 timeout_s: float = 2.0) -> bytes | None:
    """Ask the learner at `address` to answer `challenge` (`Learner.GetStatus`): its answer; b"" when it
    answers without the seat's key or nothing listens there; None when no answer came (it may live, out of
    the controller's reach)."""
    return _challenge(address, auth, lambda ch: learner_pb2_grpc.LearnerStub(ch).GetStatus(
        learner_pb2.LearnerStatusRequest(challenge=challenge), timeout=timeout_s))


def _challenge(address: str, auth: Auth, ask) -> bytes | None:
    # A plain TCP connection first, cheaper than a gRPC channel: a refused one means no process listens there
    # any more (gone), one that times out says nothing about the holder (unknown). Then the call itself: a
    # server that does not know it is not the holder; any other failure (a hung process, a failed TLS
    # handshake) says nothing either.
    reach = dial(address, timeout_s=1.0)
    if reach is not True:
        return b"" if reach is False else None
    with channel(address, auth) as ch:
        try:
            return ask(ch).challenge_mac
        except grpc.RpcError as err:
            return b"" if err.code() == grpc.StatusCode.UNIMPLEMENTED else None
