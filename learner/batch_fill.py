"""Which groups make a batch when groups differ in size (`controller.difficulty.hard_group_size`): a batch holds
exactly `learner.batch_size` trajectories, the budget of a step, taken from the front of the learner's order as
far as it can.

The pick is the shortest prefix of the order that holds groups adding up to the batch exactly, and within it
the earliest groups that do: each group is taken when the groups after it in the prefix can still complete the
batch. With every group of one size that is the first B / G groups, as before. Sizes are whole groups of G and a
hard group divides B (checked at load), so whenever the groups held add up to B or more, some of them add up to
B exactly: take all the hard groups that fit in B and fill with groups of G.
"""

from __future__ import annotations


def pick(sizes: list[int], total: int) -> list[int] | None:
    """Indices (ascending) of the groups of `sizes`, in order of preference, that add up to `total` exactly,
    from the shortest prefix that can; None when no subset does."""
    if total <= 0:
        return [] if total == 0 else None
    full = (1 << (total + 1)) - 1
    reach, end = 1, None  # bit s set: some subset of the prefix adds up to s
    for i, size in enumerate(sizes):
        reach = (reach | (reach << size)) & full
        if reach >> total & 1:
            end = i + 1
            break
    if end is None:
        return None
    # Sums the groups after each position (within the prefix) can make, to take the earliest groups first.
    after = [0] * (end + 1)
    after[end] = 1
    for i in range(end - 1, -1, -1):
        after[i] = (after[i + 1] | (after[i + 1] << sizes[i])) & full
    chosen, left = [], total
    for i in range(end):
        if sizes[i] <= left and after[i + 1] >> (left - sizes[i]) & 1:
            chosen.append(i)
            left -= sizes[i]
    return chosen
