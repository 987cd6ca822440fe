"""The production `WeightNotifier` (`asyncrl.controller.push`): tell one replica over gRPC to join a push
(`Rollout.UpdateWeights`). The controller's logic takes the notifier as a parameter, so its unit tests run
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
