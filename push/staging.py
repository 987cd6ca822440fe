"""Staging buffers for packing (sender) and unpacking (receiver) buckets that are not laid out in place:
reused across pushes, leased per transfer (`push.transfer`)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch


class StagingBuffers:
    """Two staging buffers per (device, dtype): packing/unpacking one bucket overlaps the transfer of the
    other."""

    def __init__(self):
        self._buffers: dict[tuple, list[torch.Tensor]] = {}

    def get(self, device: torch.device, dtype: torch.dtype, numel: int, slot: int) -> torch.Tensor:
        pair = self._buffers.setdefault((str(device), dtype), [torch.empty(0, dtype=dtype, device=device)] * 2)
        if pair[slot].numel() < numel:
            pair[slot] = torch.empty(numel, dtype=dtype, device=device)
        return pair[slot][:numel]


class StagingPool:
    """Reusable staging buffers, so no push pays first-touch page faults for fresh multi-MiB buffers.

    Each transfer leases its own set for its duration: a process that sends and receives at once (tests,
    several engines in one process) never has two transfers writing the same buffer, and back-to-back
    pushes reuse the same memory.
    """

    def __init__(self):
        self._free: list[StagingBuffers] = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def lease(self) -> Iterator[StagingBuffers]:
        with self._lock:
            buffers = self._free.pop() if self._free else StagingBuffers()
        try:
            yield buffers
        finally:
            with self._lock:
                self._free.append(buffers)


STAGING = StagingPool()
"""The process's pool: every send and receive leases from it."""
