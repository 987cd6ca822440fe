"""A push's bytes over a broadcast group (`push.broadcast`), bucket by bucket: the sender's side (whole, or as
sparse deltas: `push.deltas`) and the receivers' (into staging, into storage of the push's layout, or into the
copy a delta applies to). Sending and unpacking bucket k+1 overlap the transfer of bucket k.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from asyncrl.core.wire.push_contract import TensorMeta
from asyncrl.push import deltas
from asyncrl.push.broadcast import BroadcastGroup
from asyncrl.push.buckets import pack, plan_buckets, unpack
from asyncrl.push.deltas import DENSE, Base, BaseMissing
from asyncrl.push.flat import FlatWeights, adjacent_run
from asyncrl.push.plan import PushPlan
from asyncrl.push.staging import STAGING


class _NothingSent:
    """The wait of a bucket whose delta is empty (the sender skips its broadcast)."""

    def wait(self):
        pass


_NOTHING_SENT = _NothingSent()


def send_weights(group: BroadcastGroup, named_tensors: Iterable[tuple[str, torch.Tensor]], plan: PushPlan) -> int:
    """Rank 0: broadcast all tensors bucket by bucket, in plan order; packing bucket k+1 overlaps the
    transfer of bucket k. Returns bytes sent."""
    tensors = [t for _, t in named_tensors]
    if len(tensors) != len(plan.tensors):
        raise ValueError(f"plan lists {len(plan.tensors)} tensors, got {len(tensors)}")
    sent, in_flight = 0, []
    with STAGING.lease() as staging:
        for k, bucket in enumerate(plan_buckets(plan.tensors, plan.bucket_bytes)):
            dtype = plan.tensors[bucket.members[0]].torch_dtype
            # .to() is a no-op for tensors already on the group's device (the CPU/gloo case).
            members = {i: tensors[i].detach().to(group.device) for i in bucket.members}
            flat = adjacent_run([members[i] for i in bucket.members])
            if flat is None or flat.dtype != dtype:
                flat = pack(bucket, members, out=staging.get(group.device, dtype, bucket.numel, k % 2))
            for work, _ in in_flight:
                work.wait()
            # Each tensor stays referenced here until its broadcast is waited for.
            in_flight = [(group.broadcast_async(flat), flat)]
            sent += flat.numel() * flat.element_size()
        for work, _ in in_flight:
            work.wait()
    return sent


def send_delta(group: BroadcastGroup, weights: FlatWeights, plan: PushPlan, base: Base | None) -> int:
    """Rank 0 of a plan with `sparse_deltas`: the header, then each bucket of `weights` as the elements changed
    since `base` (None: every bucket whole) or whole where that is smaller (`push.deltas`). Returns bytes sent."""
    if not weights.matches(plan.tensors, plan.bucket_bytes):
        raise ValueError(f"push {plan.push_id}: the weights do not have the plan's layout")
    held = base is not None and base.weights.matches(plan.tensors, plan.bucket_bytes)
    encoded = ([deltas.encode(new, old) for new, old in zip(weights.buffers, base.weights.buffers)] if held
               else [(DENSE, None)] * len(weights.buffers))
    counts = [count for count, _ in encoded]
    any_sparse = any(count != DENSE for count in counts)
    head = deltas.header(base.version if held and any_sparse else deltas.NO_BASE, counts).to(group.device)
    group.broadcast(head)
    sent, in_flight = head.numel() * head.element_size(), None
    for buffer, (_, payload) in zip(weights.buffers, encoded):
        tensor = buffer if payload is None else payload
        if tensor.numel() == 0:  # a bucket nothing changed in: its count says so, no broadcast
            continue
        if in_flight is not None:
            in_flight.wait()
        in_flight = group.broadcast_async(tensor)
        sent += tensor.numel() * tensor.element_size()
    if in_flight is not None:
        in_flight.wait()
    return sent


class KeptWeights:
    """What the last push left at a receiver that reads pushes bucket by bucket (a copy the engine does not
    serve from): a delta push applies to it, in place."""

    def __init__(self) -> None:
        self._kept: Base | None = None

    def receive(self, group: BroadcastGroup, plan: PushPlan) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """`receive_weights` into the kept copy (views that stay valid); it counts as `plan`'s version once
        every bucket came, and as none meanwhile. A plan without sparse deltas keeps nothing: its buckets are
        views into staging, as `receive_weights` gives them."""
        kept, self._kept = self._kept, None
        if not plan.sparse_deltas:
            yield from receive_weights(group, plan)
            return
        if kept is None or not kept.weights.matches(plan.tensors, plan.bucket_bytes):
            kept = Base(FlatWeights(plan.tensors, plan.bucket_bytes, group.device), deltas.NO_BASE)
        yield from receive_weights(group, plan, into=kept.weights, base=kept)
        self._kept = Base(kept.weights, plan.version)


def receive_weights(
    group: BroadcastGroup, plan: PushPlan, into: FlatWeights | None = None, base: Base | None = None
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Other ranks: yield the named tensors of each bucket. The next bucket is already arriving while the
    caller handles this one.

    Without `into` the tensors are views into a reused staging buffer, valid until the next iteration (copy
    them out). With `into` (a `FlatWeights` with the plan's layout, on the group's device) every bucket lands
    directly in its buffers and the views stay valid: no copy at all.

    A plan with `sparse_deltas` may send buckets as changes to `base` (what this rank holds; it may be `into`
    itself, changed in place). Without the base its header names, this rank takes the whole push, yields
    nothing and raises `BaseMissing`, `into` untouched.
    """
    metas: tuple[TensorMeta, ...] = plan.tensors
    buckets = plan_buckets(metas, plan.bucket_bytes)
    if into is not None and not into.matches(metas, plan.bucket_bytes):
        raise ValueError(f"push {plan.push_id}: the receive buffers do not have the plan's layout")
    counts, base_version, held = [DENSE] * len(buckets), deltas.NO_BASE, True
    if plan.sparse_deltas:
        head = deltas.empty_header(len(buckets)).to(group.device)
        group.broadcast(head)
        base_version, counts = deltas.read_header(head.cpu(), [b.numel for b in buckets])
        held = base_version == deltas.NO_BASE or (
            base is not None and base.version == base_version and base.weights.matches(metas, plan.bucket_bytes))
    with STAGING.lease() as staging:

        def data_buffer(k):
            bucket = buckets[k]
            if into is not None and held:
                return into.buffers[k]
            return staging.get(group.device, metas[bucket.members[0]].torch_dtype, bucket.numel, k % 2)

        def start(k):
            dtype = metas[buckets[k].members[0]].torch_dtype
            incoming = (data_buffer(k) if counts[k] == DENSE else
                        staging.get(group.device, torch.uint8, deltas.payload_bytes(counts[k], dtype), k % 2))
            return incoming, (group.broadcast_async(incoming) if incoming.numel() else _NOTHING_SENT)

        pending = start(0) if buckets else None
        for k, bucket in enumerate(buckets):
            incoming, work = pending
            work.wait()
            pending = start(k + 1) if k + 1 < len(buckets) else None
            if not held:
                continue
            flat = incoming
            if counts[k] != DENSE:
                flat = data_buffer(k)
                if flat.data_ptr() != base.weights.buffers[k].data_ptr():
                    flat.copy_(base.weights.buffers[k])
                deltas.apply(incoming, counts[k], flat)
            yield unpack(bucket, flat, metas)
        group.finish()
    if not held:
        have = "none" if base is None else f"version {base.version}"
        raise BaseMissing(f"push {plan.push_id} (version {plan.version}) changes version {base_version}; "
                          f"this receiver holds {have}")
