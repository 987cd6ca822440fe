"""Prompt groups as dense ids, computed once per batch.

`group_index` may hold any ids (prompt indices, hashes); every group statistic needs them as 0..G-1.
`torch.unique` costs a device sync and a sort, so `build_advantages` makes one `Groups` and hands it to every
helper instead of each helper calling unique again.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Groups:
    inverse: Tensor
    """[N] long: the dense group id (0..count-1) of each sequence."""
    count: int
    """G: number of distinct groups."""

    @staticmethod
    def of(group_index: Tensor) -> Groups:
        _, inverse = torch.unique(group_index, return_inverse=True)
        return Groups(inverse=inverse, count=int(inverse.max().item()) + 1 if inverse.numel() else 0)

    @staticmethod
    def whole_batch(num_sequences: int, device: torch.device | str = "cpu") -> Groups:
        """Every sequence in one group (batch-level statistics)."""
        return Groups(inverse=torch.zeros(num_sequences, dtype=torch.long, device=device),
                      count=1 if num_sequences else 0)

    def sum(self, values: Tensor) -> Tensor:
        """[G, ...]: per-group sums of per-sequence values [N, ...]."""
        out = torch.zeros((self.count, *values.shape[1:]), dtype=values.dtype, device=values.device)
        return out.index_add_(0, self.inverse, values)

    def sizes(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """[G]: members per group."""
        return self.sum(torch.ones(self.inverse.shape[0], dtype=dtype, device=self.inverse.device))

    def mean_per_sequence(self, values: Tensor) -> Tensor:
        """[N]: the mean of each sequence's group."""
        return (self.sum(values) / self.sizes(values.dtype).clamp_min(1))[self.inverse]
