"""Sparse delta pushes: a bucket travels as the elements that changed since the version every receiver holds.

At RL learning rates most elements of a bfloat16 copy do not change from one step to the next (0.43% of
SmolLM2-135M's at lr 1e-6: docs/benchmarks.md, "How much of a bfloat16 push changes per step"), so over a
thin link a push of (index, value) pairs takes a fraction of a dense one's time.

A plan with `sparse_deltas` opens with a header broadcast, `[base_version, n_0, ..., n_{K-1}]`: the version
the deltas apply to (-1: none, every bucket dense) and per bucket the number of changed elements (-1: the
bucket travels dense, when its pairs would not be smaller). A sparse bucket's payload is one byte buffer:
the int32 indices (padded to 8 bytes), then the values in the bucket's dtype. Elements compare by their bits,
so a receiver that holds the base exactly ends with exactly the sender's bytes; the checksum in the store
(`WeightPushPlan.checksum_in_store`) proves it before anything is served. A receiver that does not hold the
base takes part in the broadcast, keeps nothing and fails the push (`BaseMissing`): the controller resyncs
it with a dense push.

Pure tensor functions; `push.transfer` calls them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asyncrl.push.flat import FlatWeights

DENSE = -1
"""A header count: this bucket travels whole."""
NO_BASE = -1
"""The header's base version when the push carries no delta."""
_INDEX_BYTES = 4
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class BaseMissing(RuntimeError):
    """A delta push arrived at a receiver that does not hold the version it applies to."""


@dataclass
class Base:
    """The weights a receiver (or the sender) holds, as the pushes of `version` left them."""

    weights: FlatWeights
    version: int


def _index_section(count: int) -> int:
    return -(-count * _INDEX_BYTES // 8) * 8


def payload_bytes(count: int, dtype: torch.dtype) -> int:
    """The size of a sparse bucket's payload of `count` changed elements."""
    return _index_section(count) + count * dtype.itemsize


def encode(new: torch.Tensor, base: torch.Tensor) -> tuple[int, torch.Tensor | None]:
    """A flat bucket against the same bucket of the base: (changed count, payload), or (DENSE, None) when the
    pairs would take as many bytes as the bucket itself."""
    if new.shape != base.shape or new.dtype != base.dtype:
        raise ValueError(f"bucket of {new.dtype} x {new.numel()} against a base of {base.dtype} x {base.numel()}")
    index = changed(new, base)
    count = index.numel()
    if payload_bytes(count, new.dtype) >= new.numel() * new.element_size():
        return DENSE, None
    payload = torch.empty(payload_bytes(count, new.dtype), dtype=torch.uint8, device=new.device)
    indices, values = split(payload, count, new.dtype)
    indices.copy_(index)
    torch.index_select(new, 0, index, out=values)
    return count, payload


def changed(new: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """The indices (int64, ascending) of the elements whose bits differ. Narrow elements are compared 8 bytes at
    a time first, then within the words that differ: at a few percent changed that is about 2.5x faster than
    comparing element by element (the word compare and its nonzero read a quarter as many entries)."""
    bits = _BITS[new.element_size()]
    lanes = 8 // new.element_size()
    whole = new.numel() // lanes * lanes
    aligned = all(t.storage_offset() * t.element_size() % 8 == 0 for t in (new, base))
    if lanes == 1 or whole == 0 or not aligned:
        return torch.ne(new.view(bits), base.view(bits)).nonzero().view(-1)
    words = torch.ne(new[:whole].view(torch.int64), base[:whole].view(torch.int64)).nonzero().view(-1)
    in_words = torch.ne(new[:whole].view(bits).view(-1, lanes)[words], base[:whole].view(bits).view(-1, lanes)[words])
    rows, lane = in_words.nonzero().unbind(1)
    index = words[rows] * lanes + lane
    tail = torch.ne(new[whole:].view(bits), base[whole:].view(bits)).nonzero().view(-1) + whole
    return torch.cat([index, tail])


def split(payload: torch.Tensor, count: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A payload's int32 indices and its values (views)."""
    section = _index_section(count)
    return payload[: count * _INDEX_BYTES].view(torch.int32), payload[section:].view(dtype)


def apply(payload: torch.Tensor, count: int, out: torch.Tensor) -> None:
    """Write a sparse bucket's changed elements into `out`, which holds the base's bucket."""
    indices, values = split(payload, count, out.dtype)
    if indices.numel() and int(indices.max()) >= out.numel():
        raise ValueError(f"a delta index {int(indices.max())} past the bucket's {out.numel()} elements")
    out.index_copy_(0, indices.long(), values)


def header(base_version: int, counts: list[int]) -> torch.Tensor:
    return torch.tensor([base_version, *counts], dtype=torch.int64)


def read_header(tensor: torch.Tensor, numels: list[int]) -> tuple[int, list[int]]:
    """(base version, counts) of a received header, for buckets of `numels` elements; counts that no payload
    of those buckets can have are refused (before anything is allocated for them)."""
    values = tensor.tolist()
    base_version, counts = values[0], values[1:]
    fits = len(counts) == len(numels) and all(DENSE <= c <= n for c, n in zip(counts, numels))
    if not fits or base_version < NO_BASE or (base_version == NO_BASE and any(c != DENSE for c in counts)):
        raise ValueError(f"a delta header that does not fit the plan's {len(numels)} buckets: {values[:8]}")
    return base_version, counts


def empty_header(buckets: int) -> torch.Tensor:
    """Where a receiver takes the header broadcast."""
    return torch.empty(buckets + 1, dtype=torch.int64)
