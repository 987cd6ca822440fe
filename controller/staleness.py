"""The staleness bound (AReaL): the one admission rule of the controller.

A trajectory is admitted only if `floor((N_r - 1) / B) <= i + η`, where `N_r` counts the trajectories admitted
so far *including* this one, `B` is the learner's batch size (trajectories per step), `i` the current policy
version and `η` the maximum staleness. Read it as: trajectory number `N_r` (1-based) will be consumed by
learner step `floor((N_r - 1) / B)`, and at that step the policy that generated it may be at most `η` versions
old. η = 0 is synchronous training (exactly B trajectories per version); η = None is unbounded.

A lease admits `n_new` trajectories at once, so the rule is checked for the *last* of them (the largest
`N_r`); the earlier ones then satisfy it too because the left-hand side only grows with `N_r`.
"""

from __future__ import annotations


def admissible(admitted: int, n_new: int, batch_size: int, version: int, eta: int | None) -> bool:
    """True when admitting `n_new` more trajectories on top of `admitted` keeps the bound at `version`."""
    _check(n_new >= 1, "n_new", n_new)
    _check(admitted >= 0, "admitted", admitted)
    _check(batch_size >= 1, "batch_size", batch_size)
    if eta is None:
        return True
    last = admitted + n_new
    return (last - 1) // batch_size <= version + eta


def max_admissible(version: int, batch_size: int, eta: int | None) -> int | None:
    """The largest total `N_r` the bound allows at `version`: `(i + η + 1) * B` (None = unbounded).

    Derivation: floor((N - 1) / B) <= k  <=>  N - 1 < (k + 1) * B  <=>  N <= (k + 1) * B, with k = i + η.
    """
    _check(batch_size >= 1, "batch_size", batch_size)
    if eta is None:
        return None
    return (version + eta + 1) * batch_size


def _check(ok: bool, name: str, value: int) -> None:
    if not ok:
        raise ValueError(f"{name} out of range: {value}")
