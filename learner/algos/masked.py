"""Masked reductions and input checks shared by the objective modules.

Padding positions may hold anything (0, -inf, garbage from a teacher), so values are selected with
`torch.where` before any arithmetic: a multiply-by-mask would turn inf * 0 into NaN, in the forward value and in
the gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor


def as_bool_mask(mask: Tensor) -> Tensor:
    """A float/bool/int response mask as bool."""
    return mask if mask.dtype == torch.bool else mask != 0


def masked_fill_zero(values: Tensor, mask: Tensor) -> Tensor:
    """`values` on valid positions, exactly 0 elsewhere (gradient-safe)."""
    return torch.where(mask, values, torch.zeros((), dtype=values.dtype, device=values.device))


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    masked = masked_fill_zero(values, mask)
    return masked.sum() if dim is None else masked.sum(dim=dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean over valid positions; 0 (not NaN) where there are none."""
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return masked_sum(values, mask, dim) / count.clamp_min(1).to(values.dtype)


def masked_max(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Max over valid positions; 0 where there are none."""
    if values.numel() == 0:  # amax refuses empty inputs; an empty batch reports 0
        return values.sum() * 0 if dim is None else values.sum(dim=dim) * 0
    low = torch.finfo(values.dtype).min
    filled = torch.where(mask, values, torch.full((), low, dtype=values.dtype, device=values.device))
    result = filled.amax() if dim is None else filled.amax(dim=dim)
    return torch.where(result == low, torch.zeros_like(result), result)


def masked_min(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Min over valid positions; 0 where there are none."""
    return -masked_max(-values, mask, dim)


def log_ratio(numerator: Tensor, denominator: Tensor, mask: Tensor) -> Tensor:
    """log(num / den) = numerator - denominator (log-probs), 0 on padding, not clamped."""
    return masked_fill_zero(numerator - denominator, mask)


def clamped_log_ratio(numerator: Tensor, denominator: Tensor, mask: Tensor, clamp: float) -> Tensor:
    """`log_ratio` clamped to +-clamp per token (what a per-token exponential takes)."""
    return log_ratio(numerator, denominator, mask).clamp(-clamp, clamp)


def check_token_tensor(name: str, tensor: Tensor | None, like: Tensor, hint: str = "") -> None:
    """Raise a clear ValueError when a per-token tensor is not aligned with the response mask."""
    if tensor is None:
        return
    if tuple(tensor.shape) != tuple(like.shape):
        raise ValueError(
            f"{name} has shape {tuple(tensor.shape)} but response_mask has shape {tuple(like.shape)}; "
            f"per-token tensors must be aligned to the response tokens [N, T]{hint}"
        )


def check_sequence_tensor(name: str, tensor: Tensor, num_sequences: int) -> None:
    if tensor.dim() != 1 or tensor.shape[0] != num_sequences:
        raise ValueError(f"{name} has shape {tuple(tensor.shape)}; expected [{num_sequences}] (one per sequence)")
