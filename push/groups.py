"""Broadcast groups kept across pushes, and tensor manifests read once.

A group costs far more to form than a small push costs to send: gloo connects every pair of ranks through
the store (tens of milliseconds), NCCL builds a communicator (hundreds of milliseconds to seconds on GPUs).
So the controller gives each membership (the same receivers, ranks, sender store and transport) one group id
and reuses it for every push until a replica joins, leaves or fails (`push.coordinator`); every member keeps
the group it formed (`BroadcastGroups`, one per process side) and only forms a new one when a plan names
another. The join handshake still runs before every push: it is what tells a dead or group-less receiver
from a slow one, and it costs a few store round trips.

The tensor manifest also travels once: the sender publishes it in its store (`publish_manifest`), plans
name its digest, and each receiver reads it the first time it sees that digest (`ManifestCache`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator

from torch.distributed import DistNetworkError, TCPStore

from asyncrl.core.lora.spec import AdapterSpec
from asyncrl.core.wire.push_contract import TensorMeta
from asyncrl.push.broadcast import (
    BroadcastGroup,
    check_transport_here,
    connect_store,
    form_group,
    join_push,
    push_store,
)
from asyncrl.push.in_band import forget_acks
from asyncrl.push.manifest import manifest_bytes, parse_manifest
from asyncrl.push.plan import PushPlan
from asyncrl.push.rendezvous import SenderLost, forget, sent_checksum

MANIFEST_KEY = "manifest/{digest}"
MANIFESTS_KEPT = 4


class GroupLost(RuntimeError):
    """The plan reuses a group this sender does not hold (it restarted on the same store address): the push is
    called off so that the controller forms a new group."""


class BroadcastGroups:
    """The broadcast group one process holds between pushes, as the sender (`host_store` given) or as a
    receiver. One push at a time: `member` holds a lock for the whole push."""

    def __init__(self, host_store: TCPStore | None = None):
        self._host_store = host_store
        self._client: tuple[tuple[str, bytes], TCPStore] | None = None
        self._key: tuple | None = None
        self._group: BroadcastGroup | None = None
        self._lock = threading.Lock()
        self._finished_handshake: tuple | None = None
        """Sender: (store, world size) of the last push's handshake keys, deleted once the next push's broadcast
        is over."""
        self.formed = 0
        """Groups this process formed (a reused group is not counted again)."""

    def _root(self, plan: PushPlan, rank: int) -> TCPStore:
        if self._host_store is not None:
            return self._host_store
        if self._client is None or self._client[0] != plan.store:
            # A new sender or group (a member key is the group's): drop the old connection.
            self._client = (plan.store, connect_store(plan, rank))
        return self._client[1]

    @contextlib.contextmanager
    def member(self, plan: PushPlan, rank: int, join_timeout_s: float | None = None,
               gone: Callable[[int], bool] | None = None) -> Iterator[BroadcastGroup]:
        """Join `plan`'s push as `rank` (the handshake, then the held group or a newly formed one) and yield
        the group for the broadcast. A group of the push alone is closed afterwards; a failure drops the held
        group (it may be half-used), so the next plan must form a new one. `gone`: the sender's check of a
        receiver that does not join (`push.rendezvous.sender_join`)."""
        with self._lock:
            previous = self._finished_handshake
            try:
                with self._joined(plan, rank, join_timeout_s, gone) as group:
                    yield group
            finally:
                # The previous push's keys go once this one's broadcast is over (or called off): off the
                # critical path, while the receivers load and acknowledge.
                if rank == 0 and previous is not None:
                    forget(*previous)
                    forget_acks(*previous)

    @contextlib.contextmanager
    def _joined(self, plan: PushPlan, rank: int, join_timeout_s: float | None,
                gone: Callable[[int], bool] | None) -> Iterator[BroadcastGroup]:
        """`member`'s body, under its lock."""
        check_transport_here(plan)
        key = (plan.group_key, rank, plan.world_size, plan.store_address, plan.transport)
        reuse = self._key == key and self._group is not None
        if not reuse:
            self.close()
        root = self._root(plan, rank)
        holds_group = reuse or plan.new_group
        if rank == 0:
            # A push's handshake keys are deleted during the next push, not when it ends: the sender's
            # broadcast can complete (its bytes in the socket buffers) before a slow receiver has read the
            # verdict, and one that then finds no verdict would leave the collective and stall the others.
            # The next push begins only after this one's receivers answered.
            handshake = push_store(root, plan)
            self._finished_handshake = (handshake, plan.world_size)
            if not holds_group:
                handshake.set("verdict", f"abort: the sender does not hold group {plan.group_id!r}")
                raise GroupLost(f"push {plan.push_id}: the sender does not hold group {plan.group_id!r}")
        try:
            join_push(plan, rank, root, join_timeout_s, has_group=holds_group, gone=gone)
        except SenderLost:
            self._client = None  # its sender is gone: a new one (even at this address) needs a new connection
            raise
        except DistNetworkError:
            if rank == 0:
                raise
            # The connection kept from an earlier push is dead (a learner restarted at the same address, as a
            # container runtime restarts it): once more over a new one.
            self._client = None
            root = self._root(plan, rank)
            join_push(plan, rank, root, join_timeout_s, has_group=holds_group, gone=gone)
        group = self._group if reuse else form_group(plan, rank, root)
        if not reuse:
            self.formed += 1
            if plan.group_id:
                self._key, self._group = key, group
        try:
            yield group
        except BaseException:
            self.close()
            if not plan.group_id:
                group.close()
            raise
        if not plan.group_id:
            group.close()

    def sent_checksum(self, plan: PushPlan, rank: int) -> str:
        """Receiver `rank`, after `plan`'s broadcast: the checksum the sender wrote for it (within the plan's
        time-out; the sender deletes it during its next push, which waits for this receiver's answer)."""
        return sent_checksum(push_store(self._root(plan, rank), plan), plan.push_id, plan.timeout_s)

    def close(self) -> None:
        """Leave the held group (the other members notice at their next push's handshake or broadcast)."""
        if self._group is not None:
            self._group.close()
        self._key, self._group = None, None


def publish_manifest(store: TCPStore, metas: tuple[TensorMeta, ...], adapter: AdapterSpec | None = None) -> str:
    """Sender: put the manifest of `metas` (an adapter's, with `adapter`) in the store once; returns its digest
    (plans name it)."""
    data, digest = manifest_bytes(metas, adapter)
    store.set(MANIFEST_KEY.format(digest=digest), data)
    return digest


class ManifestCache:
    """Receiver: fills in the tensors of plans that name a manifest digest, reading each manifest from the
    sender's store the first time it is seen."""

    def __init__(self):
        self._known: dict[str, tuple[tuple[TensorMeta, ...], AdapterSpec | None]] = {}
        self._lock = threading.Lock()

    def resolve(self, plan: PushPlan, rank: int) -> PushPlan:
        """`plan` with the tensors its manifest lists, read as receiver `rank` when not known yet."""
        if plan.tensors or not plan.manifest_digest:
            return plan
        with self._lock:
            known = self._known.get(plan.manifest_digest)
            if known is None:
                store = connect_store(plan, rank, min(plan.timeout_s, 30.0))
                known = parse_manifest(store.get(MANIFEST_KEY.format(digest=plan.manifest_digest)),
                                       plan.manifest_digest)
                while len(self._known) >= MANIFESTS_KEPT:
                    self._known.pop(next(iter(self._known)))
                self._known[plan.manifest_digest] = known
        metas, adapter = known
        return dataclasses.replace(plan, tensors=metas, adapter=adapter)
