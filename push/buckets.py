"""Bucketing: many tensors travel as a few flat buffers, one collective call per bucket.

Pure functions. A bucket holds consecutive tensors of one dtype whose bytes add up to at most
`bucket_bytes` (a single tensor larger than that gets a bucket of its own). Sender and receiver compute the
same layout from the same ordered metadata, so only the flat bytes cross the wire.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asyncrl.core.wire.push_contract import TensorMeta


@dataclass(frozen=True)
class Bucket:
    dtype: str
    members: tuple[int, ...]  # indices into the tensor list
    numel: int


def plan_buckets(metas: tuple[TensorMeta, ...] | list[TensorMeta], bucket_bytes: int) -> list[Bucket]:
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    buckets: list[Bucket] = []
    cur: list[int] = []
    cur_dtype, cur_bytes, cur_numel = None, 0, 0
    for i, meta in enumerate(metas):
        fits = cur and meta.dtype == cur_dtype and cur_bytes + meta.nbytes <= bucket_bytes
        if cur and not fits:
            buckets.append(Bucket(cur_dtype, tuple(cur), cur_numel))
            cur, cur_bytes, cur_numel = [], 0, 0
        cur.append(i)
        cur_dtype = meta.dtype
        cur_bytes += meta.nbytes
        cur_numel += meta.numel
    if cur:
        buckets.append(Bucket(cur_dtype, tuple(cur), cur_numel))
    return buckets


def pack(bucket: Bucket, tensors, out: torch.Tensor | None = None) -> torch.Tensor:
    """Concatenate the bucket's tensors (`tensors[i]` for each member index i) into one flat buffer,
    written into `out` when given."""
    parts = [tensors[i].detach().reshape(-1) for i in bucket.members]
    if out is None:
        return torch.cat(parts)
    torch.cat(parts, out=out[: bucket.numel])
    return out[: bucket.numel]


def unpack(bucket: Bucket, flat: torch.Tensor, metas) -> list[tuple[str, torch.Tensor]]:
    """Split a flat buffer back into named tensors (views into `flat`)."""
    out, offset = [], 0
    for i in bucket.members:
        meta = metas[i]
        out.append((meta.name, flat[offset : offset + meta.numel].view(meta.shape)))
        offset += meta.numel
    return out
