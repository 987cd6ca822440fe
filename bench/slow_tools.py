"""The agent demo's `add` tool with a heavy-tailed latency (bench/agentic_speedup.py): each call sleeps a
lognormal time, median 50 ms, 99th percentile 2 s, as a search, a sandbox or a remote API call does."""

import math
import random

MEDIAN_S, P99_S = 0.05, 2.0
MU, SIGMA = math.log(MEDIAN_S), math.log(P99_S / MEDIAN_S) / 2.3263  # z of the 99th percentile


def add(a: int, b: int) -> int:
    """Add two integers, slowly.

    Args:
        a: The first addend.
        b: The second addend.
    """
    import time

    time.sleep(random.lognormvariate(MU, SIGMA))
    return int(a) + int(b)
