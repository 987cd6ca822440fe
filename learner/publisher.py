"""The learner's side of the weight push: Begin (controller picks receivers and the broadcast group) ->
broadcast as rank 0 -> Commit (controller waits for the receivers' acks and commits the version).

When the controller answers Begin with `in_band` (the push reuses a group whose members all follow it), the
learner orders the push itself: it writes the signed order into its store, where the members wait, and after
the broadcast collects their signed acks from the store and hands them to Commit (`weights.in_band`). With
`weight_transport.reserve_next`, each commit also asks for the next push's plan; when the controller reserves
one, the next push of that version starts from it without a Begin, and any other push names it unused.

Two ways to push:
- `push(version)`: now, from the live weights, returning when committed (the first push, resyncs);
- `start(version)` then `finish()`: the weights are copied into a snapshot (one memcpy of the bucket
  buffers), and Begin/broadcast/Commit run on a background thread from that snapshot while the next step
  trains and updates the live weights in place. `finish` waits for it and returns its result. One push at a
  time: the controller has one open push, and the snapshot is reused.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass

import grpc
import torch

from asyncrl.core.grpc_util import address_refuses
from asyncrl.core.modeling import named_weights
from asyncrl.core.ports import listening
from asyncrl.core.weights.flat import FlatWeights, bind_parameters
from asyncrl.core.weights.groups import BroadcastGroups, publish_manifest
from asyncrl.core.weights.in_band import collect_acks, order_key, publish_order
from asyncrl.core.weights.manifest import decode_plan
from asyncrl.core.weights.plan import tensor_metas
from asyncrl.core.weights.rendezvous import ReceiversMissing
from asyncrl.core.weights.transport import host_store, push_store, send_weights
from asyncrl.learner.one_at_a_time import OneAtATime
from asyncrl.v1 import controller_pb2

log = logging.getLogger(__name__)
GONE_DIAL_S = 0.5
"""How long the learner tries to reach an in-band receiver that does not join before the answer counts as none."""


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
    new_group: bool = False
    """This push formed a broadcast group (the first one, or after a membership change)."""
    background: bool = False
    """Sent from a snapshot on the background thread while the learner trained on."""
    delta: bool = False
    """Sent as a delta against the previous push (`weight_transport.delta_codec`); `bytes_sent` is then the
    compressed size."""
    in_band: bool = False
    """Ordered by the learner through its store, not by the controller (`weights.in_band`)."""
    begin_s: float = 0.0
    """BeginWeightPush's round trip (of the last attempt, as the phases below)."""
    acks_s: float = 0.0
    """In-band: waiting for the receivers' acks after the broadcast (they receive, load and answer)."""
    commit_s: float = 0.0
    """CommitWeightPush's round trip; controller-ordered, it includes waiting for the receivers' answers.
    (`broadcast_s` is the join handshake, the broadcast and deleting the previous push's keys.)"""
    reserved: bool = False
    """Its plan came with the previous push's commit (`weight_transport.reserve_next`): no Begin."""


class WeightPublisher:
    def __init__(self, controller_stub, model, transport_cfg, push_timeout_s: float, max_attempts: int = 3):
        self.stub = controller_stub
        # The controller's commit waits up to push_timeout_s for the receivers: our deadline must be longer.
        self.commit_deadline_s = push_timeout_s + 30
        self.model = model
        self.cfg = transport_cfg
        self.max_attempts = max_attempts
        with listening("learner.weight_transport.store_port", transport_cfg.host, transport_cfg.store_port):
            self.store = host_store(transport_cfg.host, transport_cfg.store_port, transport_cfg.timeout_s)
        self.store_address = f"{transport_cfg.host}:{self.store.port}"
        # The model's weights move (once) into bucket-shaped storage: every later push broadcasts the
        # buckets as they are, without packing (the optimizer updates them in place).
        self.flat = bind_parameters(model, named_weights(model), int(transport_cfg.bucket_mb * 2**20))
        # The manifest goes into our store once; plans name its digest and receivers read it once.
        self.metas = tensor_metas(named_weights(model))
        self.manifest_digest = publish_manifest(self.store, self.metas)
        self.groups = BroadcastGroups(self.store)
        self.delta_codec = "" if transport_cfg.delta_codec == "none" else transport_cfg.delta_codec
        self._snapshot: FlatWeights | None = None
        self._background = OneAtATime("push")
        self._order_key = ""
        """The last in-band order's key in our store, deleted when the next one is written (or at the commit
        after a push the controller ordered: `_moved_on`)."""
        self._wait_key = ""
        """Where the members of the group of the last committed push wait for the next in-band order."""
        self._stale_keys: list[str] = []
        """Keys nobody reads again once a push the controller ordered moved the members on: the wait key they
        left (a member may have woken its wait there, `in_band.WAKE`) and the last in-band order. Deleted at
        the next commit, when every such wake has landed (its thread writes it while the push that moved it
        on is still being committed)."""
        self._reserved: controller_pb2.BeginWeightPushResponse | None = None
        """The next push's plan, reserved by the controller at the last commit; unused until a push of its
        version takes it (any other push's Begin names it unused)."""

    def push(self, version: int, last: bool = False) -> PushResult:
        """Publish the live model as `version` (current+1) or resync it to out-of-date replicas (current).
        `last`: no push follows (the run's last): none is reserved after it."""
        if self._background.running:
            raise RuntimeError("a background push is in flight: finish() it first")
        return self._push(version, self.flat, False, last)

    def start(self, version: int, last: bool = False) -> None:
        """Snapshot the live weights and push them as `version` on the background thread (`last` as in `push`)."""
        if self._background.running:
            raise RuntimeError("a background push is in flight: finish() it first")
        if self._snapshot is None:
            self._snapshot = FlatWeights(self.flat.metas, self.flat.bucket_bytes, self.flat.buffers[0].device)
        with torch.no_grad():
            for live, copy in zip(self.flat.buffers, self._snapshot.buffers):
                copy.copy_(live)
        self._background.start(self._push, version, self._snapshot, True, last)

    def finish(self) -> PushResult | None:
        """Wait for the background push (None when there is none); raises what it raised."""
        return self._background.wait()

    def close(self) -> None:
        """Wait for the background push and leave the group. A reservation still held stays with the controller
        until the next Begin, a new learner's included, aborts it (its receivers then get a resync)."""
        self._background.shutdown()
        self.groups.close()

    def _push(self, version: int, weights: FlatWeights, background: bool, last: bool) -> PushResult:
        start = time.perf_counter()
        for attempt in range(1, self.max_attempts + 1):
            t_begin = time.perf_counter()
            held, self._reserved = self._reserved, None  # used now, or named unused in this Begin
            reserved = held is not None and held.plan.version == version and self.cfg.in_band
            begin = held if reserved else self._begin(version, held.plan.push_id if held is not None else "")
            begin_s = time.perf_counter() - t_begin
            push_id, world_size, new_group = begin.plan.push_id, begin.plan.world_size, begin.plan.new_group
            delta = bool(begin.plan.delta_base_push_id)
            ok, error, sent, t_bcast, missing, acks, acks_s = True, "", 0, 0.0, [], [], 0.0
            if world_size > 1:  # else no replica is live: the version is committed without a broadcast
                plan = decode_plan(begin.plan)
                if begin.in_band:
                    self._order(plan, begin)
                plan = dataclasses.replace(plan, tensors=self.metas)
                t0 = time.perf_counter()
                # In-band, no controller call fails for a receiver whose process is gone: we dial it ourselves.
                gone = receiver_gone(list(begin.receiver_addresses)) if begin.in_band else None
                try:
                    with self.groups.member(plan, 0, gone=gone) as group:
                        sent = send_weights(group, weights.named(), plan)
                except Exception as err:  # noqa: BLE001 - reported to the controller, then retried
                    ok, error = False, f"{type(err).__name__}: {err}"
                    # Ranks that never joined: the controller holds them back, so the retry goes without them
                    # (ranks that joined without the reused group just need the new group the retry forms).
                    missing = list(err.ranks) if isinstance(err, ReceiversMissing) and err.absent else []
                    log.warning("push %s (version %d) failed on the sender: %s", push_id, version, error)
                t_bcast = time.perf_counter() - t0
                if ok and begin.in_band:
                    # Every receiver acks once its weights are in; a silent one is dropped by the controller.
                    acks = collect_acks(push_store(self.store, plan), world_size, plan.timeout_s, gone)
                    acks_s = time.perf_counter() - t0 - t_bcast
            t_commit = time.perf_counter()
            try:
                commit = self.stub.CommitWeightPush(
                    controller_pb2.CommitWeightPushRequest(push_id=push_id, sender_ok=ok, error=error,
                                                           missing_ranks=missing, acks=acks,
                                                           reserve_next=self.cfg.in_band and self.cfg.reserve_next and not last,
                                                           push_seconds=t_commit - start),
                    timeout=self.commit_deadline_s,
                )
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.FAILED_PRECONDITION:
                    raise
                # The controller no longer knows this push (it restarted, or aborted it): begin again.
                log.warning("push %s (version %d) not committed: %s", push_id, version, err.details())
                continue
            if commit.committed:
                now = time.perf_counter()
                self._reserved = commit.next_push if commit.HasField("next_push") else None
                if world_size > 1:
                    self._moved_on(begin)
                return PushResult(version, True, world_size - 1, list(commit.acked), list(commit.dropped),
                                  sent, t_bcast, now - start, attempt, new_group, background, delta,
                                  begin.in_band, begin_s, acks_s, now - t_commit, reserved)
        raise RuntimeError(f"weight push of version {version} not committed after {self.max_attempts} attempts")

    def _begin(self, version: int, unused_push_id: str) -> controller_pb2.BeginWeightPushResponse:
        return self.stub.BeginWeightPush(
            controller_pb2.BeginWeightPushRequest(
                version=version, store_address=self.store_address, transport=self.cfg.type,
                manifest_digest=self.manifest_digest, bucket_bytes=int(self.cfg.bucket_mb * 2**20),
                timeout_s=self.cfg.timeout_s, join_timeout_s=self.cfg.join_timeout_s,
                delta_codec=self.delta_codec, delta_base_push_id=self.groups.delta_base() if self.delta_codec else "",
                in_band=self.cfg.in_band, unused_push_id=unused_push_id,
            ),
            timeout=self.cfg.timeout_s + 30,
        )

    def _moved_on(self, begin) -> None:
        """A push reached the members (committed): the keys left stale at an earlier commit go. After a push
        the controller ordered, the wait key the members left (no order reached them there) and the last
        in-band order (nobody reads it again; the next order would have deleted it) become stale."""
        for key in self._stale_keys:
            try:
                self.store.delete_key(key)
            except Exception as err:  # noqa: BLE001 - a key left over must never fail a committed push
                log.warning("could not delete %s from the learner's store: %s", key, err)
        self._stale_keys = []
        wait_key = order_key(begin.plan.group_id, begin.plan.push_id) if begin.plan.group_id else ""
        if not begin.in_band:
            self._stale_keys = [key for key in (self._wait_key, self._order_key) if key and key != wait_key]
            self._order_key = ""
        self._wait_key = wait_key

    def _order(self, plan, begin) -> None:
        """Write an in-band push's order where the group's members wait for it (deleting the previous one)."""
        if self._order_key:
            self.store.delete_key(self._order_key)
        self._order_key = publish_order(self.store, plan.group_id, begin.after_push_id, plan, list(begin.order_macs))


def receiver_gone(addresses: list[str]):
    """The sender's check of in-band receivers (rank r at `addresses[r - 1]`) that do not join: refused = gone."""

    def gone(rank: int) -> bool:
        return 1 <= rank <= len(addresses) and address_refuses(addresses[rank - 1], GONE_DIAL_S)

    return gone
