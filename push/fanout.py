"""The controller's fan-out of a push it orders: one `Rollout.UpdateWeights(plan, rank, order_mac)` call per
receiver (`ReplicaChannels.update_weights`, the production `WeightNotifier` of `push.session`), over a channel
kept per replica address. The coordinator takes the notifier as a parameter, so its unit tests run without a
network; the controller's service edge hands it this one."""

from __future__ import annotations

import importlib
import logging
import threading

import grpc

from asyncrl.core.wire.auth import Auth
from asyncrl.core.wire.grpc_util import channel
from asyncrl.push.plan import PushPlan
from asyncrl.push.session import ReceiverAnswer, ReceiverUnreachable
from asyncrl.push.store_rights import member_plan
from asyncrl.v1 import rollout_pb2, rollout_pb2_grpc

log = logging.getLogger(__name__)

STORE_CLIENT_MODULE = "asyncrl.push.broadcast"
"""Where `report_unreachable` lives: torch.distributed's store client, which the controller needs for nothing
else. Imported on a thread once the server is built (`preload_store_client`), not before it serves: loading
torch held up a restarted controller's first answer by about a second."""

TELL_SENDER_TIMEOUT_S = 2.0
"""How long the controller tries to reach the learner's rendezvous store to report a receiver that is gone: a
store it cannot reach must not hold that receiver's outcome (and the commit waiting for it) any longer."""


def preload_store_client() -> None:
    """Import `STORE_CLIENT_MODULE` on a daemon thread (a report that needs it first waits for that import)."""
    threading.Thread(target=importlib.import_module, args=(STORE_CLIENT_MODULE,), name="preload-store-client",
                     daemon=True).start()


class UpdateWeightsFailed(RuntimeError):
    """A replica answered UpdateWeights with an error (or never answered)."""


class ReplicaChannels:
    """One client channel per replica address, kept across pushes: a new channel costs a connection set-up
    (and a TLS handshake) per push, several milliseconds next to a small push. A channel whose replica is
    gone is dropped on the first UNAVAILABLE."""

    def __init__(self, auth: Auth):
        self._auth = auth
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()

    def get(self, address: str) -> grpc.Channel:
        with self._lock:
            ch = self._channels.get(address)
            if ch is None:
                ch = self._channels[address] = channel(address, self._auth)
            return ch

    def drop(self, address: str) -> None:
        with self._lock:
            ch = self._channels.pop(address, None)
        if ch is not None:
            ch.close()

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for ch in channels:
            ch.close()

    @staticmethod
    def _tell_sender(plan: PushPlan, rank: int, timeout_s: float) -> None:
        """A receiver whose process is gone will never join the push: say so in the sender's store, so the
        learner calls this push off at once instead of waiting `join_timeout_s` for it (and retries without
        it). Best effort: the sender's join time-out still ends the wait."""
        try:
            importlib.import_module(STORE_CLIENT_MODULE).report_unreachable(plan, rank, timeout_s)
        except Exception as err:  # noqa: BLE001 - e.g. the learner's store is not reachable from here
            log.warning("push %s: could not tell the sender that rank %d is gone: %s", plan.push_id, rank, err)

    def update_weights(self, address: str, plan: PushPlan, rank: int, timeout_s: float,
                       order_mac: bytes) -> ReceiverAnswer:  # fmt: skip
        """The production `WeightNotifier`: `Rollout.UpdateWeights(plan, rank, order_mac)` on `address`, the plan
        carrying that rank's member key (`store_rights.member_plan`), never the store's own; returns the weight
        version the replica reports and the checksum of the adapter it serves."""
        stub = rollout_pb2_grpc.RolloutStub(self.get(address))
        request = rollout_pb2.UpdateWeightsRequest(plan=member_plan(plan, rank).to_proto(), rank=rank,
                                                   order_mac=order_mac)  # fmt: skip
        try:
            response = stub.UpdateWeights(request, timeout=timeout_s)
        except grpc.RpcError as err:
            message = f"{address}: {err.code().name}: {err.details()}"
            # UNAVAILABLE: nothing listens at the address any more, i.e. the process is gone.
            if err.code() == grpc.StatusCode.UNAVAILABLE:
                self.drop(address)
                self._tell_sender(plan, rank, min(timeout_s, TELL_SENDER_TIMEOUT_S))
                raise ReceiverUnreachable(message) from None
            raise UpdateWeightsFailed(message) from None
        return ReceiverAnswer(response.weight_version, response.adapter_checksum)
