"""A batch of leases of different sizes generated in one engine call. The engines sample `n` per prompt for the
whole call; a lease of more than G trajectories (a hard prompt's larger group, `controller.difficulty
.hard_group_size`) is asked for as several requests of its prompt, G each and each seeded apart
(`subgroup_seed`), and their samples joined back into its one group."""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.core.determinism.seeds import subgroup_seed


def lease_size(lease, asked: int) -> int:
    """Trajectories to generate under `lease`: its `num_trajectories`, or what was asked for when it has none
    (a controller older than the field)."""
    return lease.num_trajectories or asked


@dataclass(frozen=True)
class SubGroups:
    sizes: tuple[int, ...]
    """Trajectories of each lease, in the batch's order."""
    group_size: int
    """G: samples per engine request."""

    def parts(self, size: int) -> int:
        return -(-size // self.group_size)

    def requests(self, items: list) -> list:
        """One entry per engine request: each lease's `items` entry once per part."""
        return [item for item, size in zip(items, self.sizes, strict=True) for _ in range(self.parts(size))]

    def seeds(self, seeds: list[int] | None) -> list[int] | None:
        """The requests' seeds from the leases' (None: unseeded)."""
        if seeds is None:
            return None
        return [subgroup_seed(seed, part) for seed, size in zip(seeds, self.sizes, strict=True)
                for part in range(self.parts(size))]

    def join(self, generated: list[list]) -> list[list]:
        """Each lease's group from the requests' samples: its parts in order, cut to its size."""
        out, at = [], 0
        for size in self.sizes:
            parts = self.parts(size)
            out.append([g for request in generated[at:at + parts] for g in request][:size])
            at += parts
        return out
