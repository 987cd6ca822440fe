"""Giving freed memory back to the system (glibc `malloc_trim`), for a learner whose threads free large copies.

glibc keeps what a thread frees in that thread's arena, cut up, rather than returning it: one run's freed
activations, or a merged export's host copy of the whole policy freed on a checkpoint thread, otherwise stay
resident, and the next allocation, of other shapes on another thread, takes more.
"""

from __future__ import annotations

import ctypes


def trim_heap() -> None:
    """Give every arena's free pages back (bench/shared_base_memory.py: four runs sharing one base peaked at
    1.71x one run's memory untrimmed, 1.26x trimmed after each run's work). A no-op where glibc is not the
    allocator."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _glibc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim  # noqa: B018 - present only in glibc
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _glibc()
