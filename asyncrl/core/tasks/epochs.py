"""Epochs over a fixed pool of training prompts: prompt index k is row `perm_e[k mod n]` of epoch `e = k div n`,
`perm_e` a permutation seeded by (seed, e). Every epoch visits every row once, in a new order, and every
process agrees on index k without talking to another."""

from __future__ import annotations

import numpy as np

EPOCH_STREAM = 1
"""Sub-stream of the seeded generator for the epochs' orders (a task's other draws use other sub-streams)."""


class EpochOrder:
    def __init__(self, seed: int, rows: int):
        self.seed, self.rows = int(seed), int(rows)
        self._orders: dict[int, np.ndarray] = {}

    def position(self, index: int) -> tuple[int, int]:
        """(epoch, row) of training prompt `index`."""
        if index < 0:
            raise ValueError(f"prompt index must be >= 0, got {index}")
        epoch, k = divmod(index, self.rows)
        order = self._orders.get(epoch)
        if order is None:
            order = np.random.default_rng([self.seed, EPOCH_STREAM, epoch]).permutation(self.rows)
            self._orders = {epoch: order}  # one epoch at a time: replicas move forward through the stream
        return epoch, int(order[k])

    def row(self, index: int) -> int:
        """Row of training prompt `index`."""
        return self.position(index)[1]
