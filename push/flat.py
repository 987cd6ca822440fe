"""Weights laid out the way they travel: one contiguous buffer per bucket, every tensor a view into it.

Packing a bucket (sender) and copying it out of a staging buffer (receiver) are two full passes over the
model's bytes, on the same cores the transfer itself needs. With the tensors living in bucket-shaped
buffers neither pass is needed:
- sender: `bind_parameters` moves the learner's parameters into a `FlatWeights` once; from then on every
  bucket *is* a buffer, and `send_weights` broadcasts it as it is (it detects adjacent views);
- receiver: `receive_weights(..., into=flat)` lands each broadcast straight in `flat`'s buffers; an engine
  then points its parameters at those views (`modeling.rebind_parameters`): the swap moves pointers, not bytes.
"""

from __future__ import annotations

import torch

from asyncrl.core.model.modeling import rebind_parameters
from asyncrl.core.wire.push_contract import TensorMeta, tensor_metas
from asyncrl.push.buckets import Bucket, plan_buckets


class FlatWeights:
    """Bucket-shaped storage for `metas` (in order) on `device`."""

    def __init__(self, metas: tuple[TensorMeta, ...], bucket_bytes: int, device: torch.device | str = "cpu"):
        self.metas = tuple(metas)
        self.bucket_bytes = bucket_bytes
        self.buckets: list[Bucket] = plan_buckets(self.metas, bucket_bytes)
        self.buffers: list[torch.Tensor] = [
            torch.empty(b.numel, dtype=self.metas[b.members[0]].torch_dtype, device=device) for b in self.buckets
        ]
        self.views: dict[str, torch.Tensor] = {}
        for bucket, buffer in zip(self.buckets, self.buffers):
            offset = 0
            for i in bucket.members:
                meta = self.metas[i]
                self.views[meta.name] = buffer[offset : offset + meta.numel].view(meta.shape)
                offset += meta.numel

    def matches(self, metas: tuple[TensorMeta, ...], bucket_bytes: int) -> bool:
        """Whether this storage has exactly the layout a push of `metas` in `bucket_bytes` buckets uses."""
        return self.bucket_bytes == bucket_bytes and self.metas == tuple(metas)

    def named(self) -> list[tuple[str, torch.Tensor]]:
        return [(m.name, self.views[m.name]) for m in self.metas]


@torch.no_grad()
def bind_parameters(model: torch.nn.Module, named: list[tuple[str, torch.Tensor]], bucket_bytes: int,
                    slots: dict[str, torch.Tensor] | None = None) -> FlatWeights:  # fmt: skip
    """Move `named` (e.g. `modeling.named_weights(model)`) into bucket-shaped storage: copy once, rebind.
    `slots`: the weight objects by the names in `named`, when those are not the model's state-dict names (a
    LoRA adapter's parameters under peft's saved names)."""
    device = named[0][1].device if named else "cpu"
    flat = FlatWeights(tensor_metas(named), bucket_bytes, device)
    for name, tensor in named:
        flat.views[name].copy_(tensor)
    rebind_parameters(model, flat.views, slots)
    return flat


def adjacent_run(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """The flat 1-D view covering `tensors` when they sit back to back, in order, in one contiguous storage
    (as `FlatWeights` lays them out); None otherwise (the caller packs)."""
    first = tensors[0]
    if not all(t.is_contiguous() and t.dtype == first.dtype and t.device == first.device for t in tensors):
        return None
    storage = first.untyped_storage()
    expected = first.data_ptr()
    for t in tensors:
        if t.untyped_storage().data_ptr() != storage.data_ptr() or t.data_ptr() != expected:
            return None
        expected += t.numel() * t.element_size()
    numel = sum(t.numel() for t in tensors)
    return torch.empty(0, dtype=first.dtype, device=first.device).set_(
        storage, first.storage_offset(), (numel,)
    )
