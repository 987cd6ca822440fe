"""The learner's side of the weight push: Begin (controller picks receivers) -> broadcast as rank 0 ->
Commit (controller waits for the receivers' acks and commits the version)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import grpc

from asyncrl.core.modeling import named_weights
from asyncrl.core.weights.flat import bind_parameters
from asyncrl.core.weights.manifest import decode_plan, encode_tensors
from asyncrl.core.weights.plan import tensor_metas
from asyncrl.core.weights.transport import host_store, make_group, send_weights
from asyncrl.v1 import controller_pb2

log = logging.getLogger(__name__)


@dataclass
class PushResult:
    version: int
    committed: bool
    receivers: int
    acked: list[str]
    dropped: list[str]
    bytes_sent: int
    broadcast_s: float
    total_s: float
    attempts: int


class WeightPublisher:
    def __init__(self, controller_stub, model, transport_cfg, push_timeout_s: float, max_attempts: int = 3):
        self.stub = controller_stub
        # The controller's commit waits up to push_timeout_s for the receivers: our deadline must be longer.
        self.commit_deadline_s = push_timeout_s + 30
        self.model = model
        self.cfg = transport_cfg
        self.max_attempts = max_attempts
        self.store = host_store(transport_cfg.host, transport_cfg.store_port, transport_cfg.timeout_s)
        self.store_address = f"{transport_cfg.host}:{self.store.port}"
        # The model's weights move (once) into bucket-shaped storage: every later push broadcasts the
        # buckets as they are, without packing (the optimizer updates them in place).
        self.flat = bind_parameters(model, named_weights(model), int(transport_cfg.bucket_mb * 2**20))
        self.specs = encode_tensors(tensor_metas(named_weights(model)))

    def push(self, version: int) -> PushResult:
        """Publish the model as `version` (current+1) or resync it to out-of-date replicas (current)."""
        start = time.perf_counter()
        for attempt in range(1, self.max_attempts + 1):
            begin = self.stub.BeginWeightPush(
                controller_pb2.BeginWeightPushRequest(
                    version=version, store_address=self.store_address, transport=self.cfg.type,
                    tensors=self.specs, bucket_bytes=int(self.cfg.bucket_mb * 2**20), timeout_s=self.cfg.timeout_s,
                    join_timeout_s=self.cfg.join_timeout_s,
                ),
                timeout=self.cfg.timeout_s + 30,
            )
            plan = decode_plan(begin.plan)
            ok, error, sent, t_bcast = True, "", 0, 0.0
            if plan.world_size > 1:
                t0 = time.perf_counter()
                try:
                    group = make_group(plan, 0, self.store)
                    sent = send_weights(group, named_weights(self.model), plan)
                    group.close()
                except Exception as err:  # noqa: BLE001 - reported to the controller, then retried
                    ok, error = False, f"{type(err).__name__}: {err}"
                    log.warning("push %s (version %d) failed on the sender: %s", plan.push_id, version, error)
                t_bcast = time.perf_counter() - t0
            try:
                commit = self.stub.CommitWeightPush(
                    controller_pb2.CommitWeightPushRequest(push_id=plan.push_id, sender_ok=ok, error=error),
                    timeout=self.commit_deadline_s,
                )
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.FAILED_PRECONDITION:
                    raise
                # The controller no longer knows this push (it restarted, or aborted it): begin again.
                log.warning("push %s (version %d) not committed: %s", plan.push_id, version, err.details())
                continue
            if commit.committed:
                return PushResult(version, True, plan.world_size - 1, list(commit.acked), list(commit.dropped),
                                  sent, t_bcast, time.perf_counter() - start, attempt)
        raise RuntimeError(f"weight push of version {version} not committed after {self.max_attempts} attempts")
