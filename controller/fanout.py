"""The production `WeightNotifier`: tell one replica over gRPC to join a push (`Rollout.UpdateWeights`).

The only place in `controller/` that speaks gRPC as a client; `ControllerState` takes the notifier as a
parameter so its unit tests run without a network.
"""

from __future__ import annotations

import grpc

from asyncrl.core.grpc_util import channel
from asyncrl.core.weights.manifest import encode_plan
from asyncrl.core.weights.plan import PushPlan
from asyncrl.v1 import rollout_pb2, rollout_pb2_grpc


class UpdateWeightsFailed(RuntimeError):
    """A replica answered UpdateWeights with an error (or never answered). `unreachable`: nothing listens at
    its address any more (gRPC UNAVAILABLE), i.e. the process is gone."""

    def __init__(self, message: str, unreachable: bool = False):
        super().__init__(message)
        self.unreachable = unreachable


def grpc_update_weights(address: str, plan: PushPlan, rank: int, timeout_s: float) -> int:
    """Call `Rollout.UpdateWeights(plan, rank)` on `address`; returns the weight version the replica reports."""
    # A fresh channel per push: receivers change between pushes and a push is rare next to its payload.
    with channel(address) as ch:
        stub = rollout_pb2_grpc.RolloutStub(ch)
        request = rollout_pb2.UpdateWeightsRequest(plan=encode_plan(plan), rank=rank)
        try:
            response = stub.UpdateWeights(request, timeout=timeout_s)
        except grpc.RpcError as err:
            raise UpdateWeightsFailed(f"{address}: {err.code().name}: {err.details()}",
                                      unreachable=err.code() == grpc.StatusCode.UNAVAILABLE) from None
    return response.weight_version
