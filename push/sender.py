"""The learner's side of the weight push: a plan (BeginWeightPush, or the one the last commit reserved) ->
broadcast as rank 0 -> CommitWeightPush (the controller waits for the receivers' answers, or checks the acks
the learner relays, and commits the version).

A reserved plan is in-band (`push.in_band`): the learner writes the signed order into its store, where the
group's members wait, and after the broadcast collects their signed acks from the store and hands them to
the commit. Every commit of a learner that offers in-band orders asks for the next push's plan; when the
controller reserves one, the next push of that version starts from it without a Begin, and any other push
names it unused in its Begin.

Two ways to push:
- `push(version)`: now, from the live weights, returning when committed (the first push, resyncs);
- `start(version)` then `finish()`: the weights are copied into a snapshot (one memcpy of the bucket
  buffers), and the push runs on a background thread from that snapshot while the next step trains and
  updates the live weights in place. `finish` waits for it and returns its result. One push at a time: the
  controller holds one push, and the snapshot is reused.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc
import torch

from asyncrl.core.checks.weights_checksum import weights_checksum
from asyncrl.core.lora.spec import AdapterSpec
from asyncrl.core.model.modeling import named_weights
from asyncrl.core.runtime.one_at_a_time import OneAtATime
from asyncrl.core.wire.grpc_util import address_refuses
from asyncrl.core.wire.ports import listening
from asyncrl.core.wire.push_contract import tensor_metas
from asyncrl.core.wire.slow_calls import said_if_slow
from asyncrl.push.broadcast import host_store, open_push, push_store
from asyncrl.push.deltas import Base
from asyncrl.push.flat import FlatWeights, bind_parameters
from asyncrl.push.groups import BroadcastGroups, publish_manifest
from asyncrl.push.in_band import collect_acks, order_key, publish_order
from asyncrl.push.plan import PushOffer, PushPlan
from asyncrl.push.rendezvous import ReceiversMissing, publish_checksum
from asyncrl.push.transfer import send_delta, send_weights
from asyncrl.v1 import controller_pb2

log = logging.getLogger(__name__)
GONE_DIAL_S = 0.5
"""How long the learner tries to reach an in-band receiver that does not join before the answer counts as none."""


@dataclass(frozen=True, kw_only=True)
class PushResult:
    version: int
    committed: bool
    receivers: int
    acked: list[str]
    dropped: list[str]
    bytes_sent: int
    broadcast_s: float
    """The join handshake, the broadcast and deleting the previous push's keys."""
    total_s: float
    attempts: int
    new_group: bool = False
    """This push formed a broadcast group (the first one, or after a membership change)."""
    background: bool = False
    """Sent from a snapshot on the background thread while the learner trained on."""
    in_band: bool = False
    """Ordered by the learner through its store, from the plan the previous commit reserved (no Begin)."""
    begin_s: float = 0.0
    """BeginWeightPush's round trip (of the last attempt, as the phases below; 0 for a reserved plan)."""
    acks_s: float = 0.0
    """In-band: waiting for the receivers' acks after the broadcast (they receive, load and answer)."""
    commit_s: float = 0.0
    """CommitWeightPush's round trip; controller-ordered, it includes waiting for the receivers' answers."""


@dataclass(frozen=True, kw_only=True)
class Sent:
    """What the broadcast of one attempt did, as the commit reports it."""

    ok: bool = True
    error: str = ""
    bytes_sent: int = 0
    missing_ranks: list[int] = dataclasses.field(default_factory=list)
    """Ranks that never joined: the controller holds them back, so the retry goes without them."""
    acks: list = dataclasses.field(default_factory=list)
    broadcast_s: float = 0.0
    acks_s: float = 0.0


class WeightPublisher:
    """Every commit names the checksum of what the push carried (a receiver that received something else failed
    the push). `named`/`adapter`: a LoRA learner's adapter parameters (peft's saved names) and the adapter's
    shape: only those travel. Default: every weight of `model` (`modeling.named_weights`). `wire_dtype`: the
    dtype the weights travel in when it is not theirs (float32 master weights of a half-precision run: the
    engines' dtype, half the bytes, and the rounding the learner's forwards use)."""

    def __init__(self, controller_stub, model, transport_cfg, push_timeout_s: float, max_attempts: int = 3,
                 named: list | None = None, adapter: AdapterSpec | None = None,
                 wire_dtype: torch.dtype | None = None):  # fmt: skip
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
        named = named_weights(model) if named is None else named
        self.adapter = adapter
        self.flat = bind_parameters(model, named, int(transport_cfg.bucket_mb * 2**20),
                                    slots=None if adapter is None else dict(named))
        # The manifest goes into our store once; plans name its digest and receivers read it once.
        self.metas = tensor_metas(named)
        self._wire: FlatWeights | None = None
        """The weights rounded to `wire_dtype`, refreshed before each push (None: they travel as they are)."""
        if wire_dtype is not None and any(m.torch_dtype != wire_dtype for m in self.metas):
            wire_name = str(wire_dtype).removeprefix("torch.")
            self.metas = tuple(dataclasses.replace(m, dtype=wire_name) if m.torch_dtype.is_floating_point else m
                               for m in self.metas)
            self._wire = FlatWeights(self.metas, self.flat.bucket_bytes, self.flat.buffers[0].device)
        if transport_cfg.sparse_deltas and any(m.torch_dtype.itemsize >= 4 and m.torch_dtype.is_floating_point
                                               for m in self.metas):
            log.warning("learner.weight_transport.sparse_deltas: weights travel in 32-bit floats, where nearly every "
                        "element changes each step, so most buckets will go whole; deltas pay with a half-precision "
                        "wire (model.dtype: bfloat16; docs/deploy.md, \"Networks\")")
        self.groups = BroadcastGroups(self.store)
        self.offer = PushOffer(
            store_address=self.store_address, store_key=self.store.key, transport=transport_cfg.type,
            manifest_digest=publish_manifest(self.store, self.metas, adapter),
            bucket_bytes=int(transport_cfg.bucket_mb * 2**20), timeout_s=transport_cfg.timeout_s,
            join_timeout_s=transport_cfg.join_timeout_s, in_band=transport_cfg.in_band, checksum_in_store=True,
            sparse_deltas=transport_cfg.sparse_deltas,
        )  # fmt: skip
        self._base: Base | None = None
        """With sparse deltas: what the last committed push sent, which every member of its group holds."""
        self._base_group = ""
        self._snapshot: FlatWeights | None = None
        self._background = OneAtATime("push")
        self._hasher = ThreadPoolExecutor(1, thread_name_prefix="push-checksum")
        """Hashes a push's weights while they travel (hashlib lets go of the GIL): the commit needs the
        checksum, the broadcast does not."""
        self._keys = OrderKeys(self.store)
        self._reserved: controller_pb2.BeginWeightPushResponse | None = None
        """The next push's plan, reserved by the controller at the last commit; unused until a push of its
        version takes it (any other push's Begin names it unused)."""

    @property
    def manifest_digest(self) -> str:
        return self.offer.manifest_digest

    def push(self, version: int, last: bool = False) -> PushResult:
        """Publish the live model as `version` (current+1) or resync it to out-of-date replicas (current).
        `last`: no push follows (the run's last): none is reserved after it."""
        if self._background.running:
            raise RuntimeError("a background push is in flight: finish() it first")
        if self._wire is None:
            return self._push(version, self.flat, False, last)
        self._round_into(self._wire)
        return self._push(version, self._wire, False, last)

    def start(self, version: int, last: bool = False) -> None:
        """Snapshot the live weights and push them as `version` on the background thread (`last` as in `push`)."""
        if self._background.running:
            raise RuntimeError("a background push is in flight: finish() it first")
        if self._snapshot is None:
            self._snapshot = FlatWeights(self.metas, self.flat.bucket_bytes, self.flat.buffers[0].device)
        if self._wire is not None:
            self._round_into(self._snapshot)
        else:
            with torch.no_grad():
                for live, copy in zip(self.flat.buffers, self._snapshot.buffers):
                    copy.copy_(live)
        self._background.start(self._push, version, self._snapshot, True, last)

    @torch.no_grad()
    def _round_into(self, target: FlatWeights) -> None:
        """The live weights copied into `target`'s buffers, rounded to its dtypes."""
        for name, view in target.views.items():
            view.copy_(self.flat.views[name])

    def finish(self) -> PushResult | None:
        """Wait for the background push (None when there is none); raises what it raised."""
        return self._background.wait()

    def close(self) -> None:
        """Wait for the background push and leave the group. A reservation still held stays with the controller
        until the next Begin, a new learner's included, aborts it (its receivers then get a resync)."""
        self._background.shutdown()
        self._hasher.shutdown()
        self.groups.close()

    def _push(self, version: int, weights: FlatWeights, background: bool, last: bool) -> PushResult:
        start = time.perf_counter()
        # What every receiver must end up serving, full weights or an adapter (the weights sent do not change
        # meanwhile): a receiver whose checksum differs failed the push. Hashed while the push travels.
        hashing = self._hasher.submit(weights_checksum, weights.named())
        for attempt in range(1, self.max_attempts + 1):
            t_begin = time.perf_counter()
            ticket = self._ticket(version)
            begin_s = 0.0 if ticket.in_band else time.perf_counter() - t_begin
            sent = self._send(ticket, weights, hashing) if ticket.plan.world_size > 1 else Sent()
            t_commit = time.perf_counter()
            commit = self._commit(ticket, sent, last, t_commit - start, hashing.result())
            if commit is None or not commit.committed:
                continue
            now = time.perf_counter()
            self._reserved = commit.next_push if commit.HasField("next_push") else None
            if ticket.plan.world_size > 1:
                self._keys.moved_on(ticket)
            self._keep_base(ticket.plan, weights, version, held_by_all=not commit.dropped)
            return PushResult(
                version=version, committed=True, receivers=ticket.plan.world_size - 1, acked=list(commit.acked),
                dropped=list(commit.dropped), bytes_sent=sent.bytes_sent, broadcast_s=sent.broadcast_s,
                total_s=now - start, attempts=attempt, new_group=ticket.plan.new_group, background=background,
                in_band=ticket.in_band, begin_s=begin_s, acks_s=sent.acks_s, commit_s=now - t_commit,
            )  # fmt: skip
        raise RuntimeError(f"weight push of version {version} not committed after {self.max_attempts} attempts")

    def _ticket(self, version: int) -> controller_pb2.BeginWeightPushResponse:
        """The plan of this attempt: the reserved one when it is for `version` (the learner orders it in-band),
        else BeginWeightPush's answer, naming a reservation it leaves unused."""
        held, self._reserved = self._reserved, None
        if held is not None and held.plan.version == version and self.cfg.in_band:
            return held
        request = self.offer.to_proto(version=version, unused_push_id=held.plan.push_id if held is not None else "")
        with said_if_slow(f"the controller's BeginWeightPush (version {version})", logger=log):
            return self.stub.BeginWeightPush(request, timeout=self.cfg.timeout_s + 30)

    def _send(self, ticket: controller_pb2.BeginWeightPushResponse, weights: FlatWeights, hashing) -> Sent:
        """Order the push (in-band: into the store), broadcast it, say what was sent (its checksum, in the
        push's store: the receivers compare before they serve), and collect the in-band acks."""
        plan = PushPlan.from_proto(ticket.plan)
        open_push(self.store, plan)  # before its order is published (the join opens it too, too late for that)
        if ticket.in_band:
            self._keys.order(plan, ticket)
        plan = dataclasses.replace(plan, tensors=self.metas)
        t0 = time.perf_counter()
        # In-band, no controller call fails for a receiver whose process is gone: we dial it ourselves.
        gone = receiver_gone(list(ticket.receiver_addresses)) if ticket.in_band else None
        try:
            with self.groups.member(plan, 0, gone=gone) as group:
                if plan.sparse_deltas:
                    nbytes = send_delta(group, weights, plan, self._base_of(plan))
                else:
                    nbytes = send_weights(group, weights.named(), plan)
                publish_checksum(push_store(self.store, plan), hashing.result())
        except Exception as err:  # noqa: BLE001 - reported to the controller, then retried
            error = f"{type(err).__name__}: {err}"
            log.warning("push %s (version %d) failed on the sender: %s", plan.push_id, plan.version, error)
            # Ranks that joined without the reused group just need the new group the retry forms.
            missing = list(err.ranks) if isinstance(err, ReceiversMissing) and err.absent else []
            return Sent(ok=False, error=error, missing_ranks=missing, broadcast_s=time.perf_counter() - t0)
        broadcast_s = time.perf_counter() - t0
        if not ticket.in_band:
            return Sent(bytes_sent=nbytes, broadcast_s=broadcast_s)
        # Every receiver acks once its weights are in; a silent one is dropped by the controller.
        acks = collect_acks(push_store(self.store, plan), plan.world_size, plan.timeout_s, gone)
        return Sent(bytes_sent=nbytes, acks=acks, broadcast_s=broadcast_s,
                    acks_s=time.perf_counter() - t0 - broadcast_s)  # fmt: skip

    def _base_of(self, plan: PushPlan) -> Base | None:
        """What every receiver of `plan` holds: the last committed push's weights when `plan` goes to that
        push's group again (a group is kept only while its membership holds; a receiver that failed a push
        leaves it). A receiver without it still fails the push alone (`deltas.BaseMissing`)."""
        same_group = plan.group_id and plan.group_id == self._base_group and not plan.new_group
        return self._base if same_group else None

    @torch.no_grad()
    def _keep_base(self, plan, weights: FlatWeights, version: int, held_by_all: bool) -> None:
        """After a commit of `plan` (its `WeightPushPlan`): keep what it sent as the next delta's base when
        every receiver took it."""
        if not (plan.sparse_deltas and plan.world_size > 1 and held_by_all and plan.group_id):
            self._base, self._base_group = None, ""
            return
        if self._base is None or not self._base.weights.matches(weights.metas, weights.bucket_bytes):
            self._base = Base(FlatWeights(weights.metas, weights.bucket_bytes, weights.buffers[0].device), version)
        for kept, sent in zip(self._base.weights.buffers, weights.buffers):
            kept.copy_(sent)
        self._base.version, self._base_group = version, plan.group_id

    def _commit(self, ticket, sent: Sent, last: bool, learner_seconds: float, checksum: str = ""):
        """CommitWeightPush; None when the controller no longer knows the push (it restarted, or aborted it)."""
        request = controller_pb2.CommitWeightPushRequest(
            push_id=ticket.plan.push_id, sender_ok=sent.ok, error=sent.error, missing_ranks=sent.missing_ranks,
            acks=sent.acks, reserve_next=self.cfg.in_band and not last, push_seconds=learner_seconds,
            adapter_checksum=checksum,
        )  # fmt: skip
        try:
            with said_if_slow(f"the controller's CommitWeightPush (version {ticket.plan.version})", logger=log):
                return self.stub.CommitWeightPush(request, timeout=self.commit_deadline_s)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            log.warning("push %s (version %d) not committed: %s", ticket.plan.push_id, ticket.plan.version,
                        err.details())
            return None


class OrderKeys:
    """The keys in-band orders leave in the learner's store, and when each goes.

    The order of the next in-band push is written where the group's members wait (`push.in_band`); writing
    the next one deletes it. After a push the controller ordered, the members wait on another key: the one they
    left (a member may have woken its wait there, `in_band.WAKE`) and the last in-band order are read by nobody
    again, and go at the next commit, when every such wake has landed (its thread writes it while the push
    that moved it on is still being committed)."""

    def __init__(self, store):
        self._store = store
        self._order_key = ""
        self._wait_key = ""
        """Where the members of the group of the last committed push wait for the next in-band order."""
        self._stale: list[str] = []

    def order(self, plan: PushPlan, ticket) -> None:
        """Write an in-band push's order where the group's members wait for it (deleting the previous one)."""
        if self._order_key:
            self._store.delete_key(self._order_key)
        self._order_key = publish_order(self._store, plan.group_id, ticket.after_push_id, plan,
                                        list(ticket.order_macs))

    def moved_on(self, ticket) -> None:
        """A push reached the members (committed): the keys left stale at an earlier commit go, and after a
        push the controller ordered, the wait key the members left and the last in-band order become stale."""
        for key in self._stale:
            try:
                self._store.delete_key(key)
            except Exception as err:  # noqa: BLE001 - a key left over must never fail a committed push
                log.warning("could not delete %s from the learner's store: %s", key, err)
        self._stale = []
        wait_key = order_key(ticket.plan.group_id, ticket.plan.push_id) if ticket.plan.group_id else ""
        if not ticket.in_band:
            self._stale = [key for key in (self._wait_key, self._order_key) if key and key != wait_key]
            self._order_key = ""
        self._wait_key = wait_key


def receiver_gone(addresses: list[str]):
    """The sender's check of in-band receivers (rank r at `addresses[r - 1]`) that do not join: refused = gone."""

    def gone(rank: int) -> bool:
        return 1 <= rank <= len(addresses) and address_refuses(addresses[rank - 1], GONE_DIAL_S)

    return gone
