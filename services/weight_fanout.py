"""The controller's gRPC client of the replicas: the production `WeightNotifier` (`asyncrl.controller.push`)
that tells one replica to join a push (`Rollout.UpdateWeights`), and the liveness probe that asks the holder
of a replica id to prove it is still there (`Rollout.GetStatus` with a challenge). The controller's logic takes the notifier as a parameter, so its unit tests run
without a network; this is the gRPC client that `controller_service` hands it."""

from __future__ import annotations

import grpc

from asyncrl.controller.push import ReceiverUnreachable
from asyncrl.core.auth import Auth
from asyncrl.core.grpc_util import channel
from asyncrl.core.weights.manifest import encode_plan
from asyncrl.core.weights.plan import PushPlan
from asyncrl.v1 import rollout_pb2, rollout_pb2_grpc


class UpdateWeightsFailed(RuntimeError):
    """A replica answered UpdateWeights with an error (or never answered)."""


def grpc_update_weights(address: str, plan: PushPlan, rank: int, timeout_s: float, order_mac: bytes, *,
                        auth: Auth) -> int:
    """Call `Rollout.UpdateWeights(plan, rank, order_mac)` on `address`; returns the weight version the replica
    reports."""
    # A fresh channel per push: receivers change between pushes and a push is rare next to its payload.
    with channel(address, auth) as ch:
        stub = rollout_pb2_grpc.RolloutStub(ch)
        request = rollout_pb2.UpdateWeightsRequest(plan=encode_plan(plan), rank=rank, order_mac=order_mac)
        try:
            response = stub.UpdateWeights(request, timeout=timeout_s)
        except grpc.RpcError as err:
            message = f"{address}: {err.code().name}: {err.details()}"
            # UNAVAILABLE: nothing listens at the address any more, i.e. the process is gone.
            failure = ReceiverUnreachable if err.code() == grpc.StatusCode.UNAVAILABLE else UpdateWeightsFailed
            raise failure(message) from None
    return response.weight_version


def grpc_liveness_answer(address: str, challenge: bytes, *, auth: Auth, timeout_s: float = 2.0) -> bytes:
    """Ask the replica at `address` to answer `challenge` (`Rollout.GetStatus`); b"" when nothing answers in
    time (the process is gone or hung) or it answers without a key."""
    with channel(address, auth) as ch:
        try:
            status = rollout_pb2_grpc.RolloutStub(ch).GetStatus(rollout_pb2.RolloutStatusRequest(challenge=challenge),
                                                                timeout=timeout_s)
        except grpc.RpcError:
            return b""
    return status.challenge_mac
