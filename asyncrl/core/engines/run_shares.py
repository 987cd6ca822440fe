"""Whose work a shared model runs next when several runs share the replicas: weighted fair shares.

Each run has a weight (`runs[].weight`, equal by default) and a virtual time: the work it was granted (decode
rows, `run_adapters.MergedDecodes`) divided by its weight. The next grant goes to the run with the smallest
virtual time among those asking (a run with a batch under way; its learner behind or its η reached, it has
none); ties go to the run added first. Over time each run that keeps asking gets capacity in proportion to
its weight, and a run that has no work lends its share to the others (nothing waits while any run has work).

A run that could not take work for a while (its learner behind, or just added) comes back at the virtual time
of the runs that kept going, never below it: it does not claim the capacity it lent, so its return never
starves another run. Pure: no clock, no lock, no network (its caller holds the lock).
"""

from __future__ import annotations

from collections.abc import Iterable


class RunShares:
    def __init__(self, weights: dict[str, float] | None = None):
        self._weight: dict[str, float] = {}
        """Run -> its weight, in the order runs were added."""
        self._virtual: dict[str, float] = {}
        """Run -> work granted / weight, raised to the floor when it comes back."""
        self._asking: set[str] = set()
        """The runs that could take work at the last pick."""
        self._system = 0.0
        """The virtual time of the last grant (where its run stood before it): where a run comes back when none
        of the runs that were asking still is."""
        for run, weight in (weights or {}).items():
            self.add(run, weight)

    def add(self, run: str, weight: float = 1.0) -> None:
        """A run joins, starting at the floor of the runs already asking (ValueError for a bad weight or name)."""
        if run in self._weight:
            raise ValueError(f"run {run!r} is already sharing the replicas")
        if not weight > 0:
            raise ValueError(f"run {run!r}: weight must be > 0, got {weight}")
        self._weight[run] = float(weight)
        self._virtual[run] = self._floor()

    def remove(self, run: str) -> None:
        """A run leaves (finished or removed): its share goes to the others at once."""
        self._weight.pop(run, None)
        self._virtual.pop(run, None)
        self._asking.discard(run)

    def pick(self, admissible: Iterable[str], among: Iterable[str] | None = None) -> str | None:
        """The run whose work goes next, among `admissible` (the runs asking now), or only among `among` (those
        of them ready this instant: a run between two steps of its batch is asking, not ready); None when none
        is. Runs not added are ignored."""
        asking = [run for run in self._weight if run in set(admissible)]
        floor = min((self._virtual[r] for r in asking if r in self._asking), default=self._system)
        for run in asking:
            if run not in self._asking:  # back after lending its share: no credit for the time away
                self._virtual[run] = max(self._virtual[run], floor)
        self._asking = set(asking)
        ready = asking if among is None else [run for run in asking if run in set(among)]
        return min(ready, key=lambda r: self._virtual[r], default=None)

    def granted(self, run: str, work: float) -> None:
        """`run` was granted `work`: its virtual time moves by work / weight."""
        self._system = self._virtual[run]
        self._virtual[run] += work / self._weight[run]

    def shares(self) -> dict[str, float]:
        """Run -> the fraction of the replicas' capacity it is owed while every run asks."""
        total = sum(self._weight.values())
        return {run: weight / total for run, weight in self._weight.items()}

    def _floor(self) -> float:
        """The smallest virtual time among the runs asking (among all runs when none asks; 0 with no run)."""
        pool = [r for r in self._asking if r in self._virtual] or list(self._virtual)
        return min((self._virtual[r] for r in pool), default=0.0)
