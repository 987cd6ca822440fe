"""Batch-invariant computations: each output row is the same bits whatever else is in the batch, and
attention's output for a query is the same whatever the KV length, padding or cache layout around it.

What varies on a CPU without them (measured on the development machine, torch 2.13, MKL):
- A GEMM's row depends on how many rows it runs with: `A[:m] @ W` differs from `(A @ W)[:m]` by about 1e-6
  for small m (the kernel picks another blocking, and with two threads another split). Padded to a multiple of
  `ROW_TILE` rows (at least `ROW_TILE`) the same row gives the same bits for every m and thread count, as long
  as the inner dimension is short: on a Xeon with AVX-512 (family 6 model 167) a product over 896 or 2048
  inputs still changed with the rows and the threads (MKL splits a long reduction its own way), where one
  over 512 did not. So the reduction is cut into `INNER_TILE`-long products, added in order.
- `silu` and `sigmoid` compute the last elements of a tensor with a scalar routine and the rest with a vector
  one, so an element's value depends on its position in the tensor; `exp`, division and addition do not.
- Attention reduces over the keys with a kernel whose summation order depends on the number of keys, so a
  decode step over a cache of t keys and the learner's full forward over L keys add in different orders.
  Here the softmax denominator and the weighted sum of values are sequential sums over the keys in position
  order (`cumsum`), so a masked key (padding on either side, the causal future) adds an exact zero wherever
  it sits, and every query sees its own keys summed in the same order.

Row-wise reductions over a fixed width (RMSNorm's mean, log-softmax, softmax, sorting, cumulative sums) are
invariant already and are left alone; the parity tests (tests/unit/test_batch_invariance.py) check the whole
forward.
"""

from __future__ import annotations

import torch

ROW_TILE = 16
"""GEMM rows are padded to a multiple of this (and at least this)."""

INNER_TILE = 256
"""A GEMM's reduction runs as products over at most this many inputs, summed in order."""

_ATTENTION_CHUNK_ELEMENTS = 1 << 22
"""The [queries, keys, head_dim] products are built this many elements at a time (16 MiB in float32)."""


def tile_rows(rows: int) -> int:
    """`rows` rounded up to a multiple of ROW_TILE, at least ROW_TILE."""
    return max(ROW_TILE, -(-rows // ROW_TILE) * ROW_TILE)


def invariant_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [M, K] @ b [K, N], each row of the result independent of M and of the thread count."""
    m, inner = a.shape
    a = a.contiguous()
    padded = tile_rows(m)
    if padded != m:
        a = torch.cat([a, a.new_zeros(padded - m, inner)])
    out = torch.mm(a[:, :INNER_TILE], b[:INNER_TILE])
    for lo in range(INNER_TILE, inner, INNER_TILE):
        out.addmm_(a[:, lo:lo + INNER_TILE], b[lo:lo + INNER_TILE])  # in order; 1.1-1.4x faster than mm, then add_
    return out[:m]


def invariant_sigmoid(x: torch.Tensor) -> torch.Tensor:
    """1 / (1 + exp(-x)) from element-wise operations whose result does not depend on the element's place."""
    return torch.reciprocal(torch.exp(-x) + 1)


def invariant_silu(x: torch.Tensor) -> torch.Tensor:
    """x / (1 + exp(-x)) (torch's formula), element by element as above."""
    return x / (torch.exp(-x) + 1)


def invariant_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, additive_mask,
                        scaling: float) -> torch.Tensor:
    """Softmax attention [B, H, Lq, D] of query [B, H, Lq, D] over key/value [B, Hkv, Lk, D] (grouped-query
    heads repeated), `additive_mask` broadcastable to [B, H, Lq, Lk] (0 where allowed, a huge negative number
    where masked, as Hugging Face's eager mask) or None (every key allowed). Computed in float32."""
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    q, k, v = query.float(), key.float(), value.float()
    batch, heads, queries, dim = q.shape
    keys = k.shape[2]
    per_query = batch * heads * keys * dim
    step = max(1, _ATTENTION_CHUNK_ELEMENTS // max(1, per_query))
    parts = []
    for lo in range(0, queries, step):
        hi = min(queries, lo + step)
        mask, first, last = None, 0, keys
        if additive_mask is not None:
            mask = additive_mask[..., lo:hi, :] if additive_mask.shape[-2] > 1 else additive_mask
            first, last = _allowed_span(mask)
            mask = mask[..., first:last]
        parts.append(_attend(q[:, :, lo:hi], k[:, :, first:last], v[:, :, first:last], mask, scaling))
    return torch.cat(parts, dim=2) if len(parts) > 1 else parts[0]


def _allowed_span(mask: torch.Tensor) -> tuple[int, int]:
    """The keys [first, last) outside which every query of `mask` is masked (the causal future of a prefill's
    first queries, padding on the left of every row): they would only add exact zeros, first or last, to the
    sequential sums, so they are left out."""
    allowed = (mask > torch.finfo(torch.float32).min / 2).flatten(0, -2).any(0).nonzero()
    if allowed.numel() == 0:
        return 0, mask.shape[-1]
    return int(allowed[0]), int(allowed[-1]) + 1


def _attend(q, k, v, mask, scaling):
    # Scores: one product per (query, key) reduced over head_dim, a fixed-width row reduction.
    scores = (q.unsqueeze(3) * k.unsqueeze(2)).sum(-1) * scaling  # [B, H, q, Lk]
    if mask is not None:
        scores = scores + mask.float()
    top = scores.amax(-1, keepdim=True)  # a maximum is exact in any order
    weights = torch.exp(scores - top)  # masked keys: exactly 0
    # Sequential sums over the keys in position order: zeros anywhere leave them unchanged.
    total = weights.cumsum(-1)[..., -1:]
    summed = (weights.unsqueeze(-1) * v.unsqueeze(2)).cumsum(-2)[..., -1, :]  # [B, H, q, D]
    return summed / total
