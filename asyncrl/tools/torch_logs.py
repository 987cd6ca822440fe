"""torch's C++ log level for every process of an `asyncrl` command."""

from __future__ import annotations

import os


def quiet_torch_cpp_logs() -> None:
    """torch.distributed's C++ warnings (a socket poll that timed out, a peer's store gone at the end of a run)
    come with a stack trace of twenty frames each: errors only, unless set. Read when torch loads, so set before
    a process imports it, and before `up` starts processes that do (they inherit it)."""
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
