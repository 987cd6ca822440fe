"""Where the learner's batches come from: entries read from the buffer, admitted or dead-lettered, and the
next batch read, inspected and assembled on a thread while the current one trains (`learner.prefetch`).

Which entries make a batch (`learner.oldest_first`, with a bounded η): the learner holds every group waiting
in the buffer (`lookahead` groups at most, all that admission lets exist ahead of it) and trains the oldest
first, by the version of their oldest token, so a group written late is not queued behind newer ones and
stays within η at training. Otherwise, and at η 0, the order they were written.

Admission is decided on the loop's thread, with everything that depends on the learner's state (its current
version against the group's newest and oldest tokens, the groups it trained, a reset timeline); the prefetch
thread only
runs what needs nothing but the entry, and has no side effects. A bad entry is dead-lettered with its reason
and acked: never trained on, and never a crash (it would stay pending and crash every restart again).

η at read: admission keeps N_r within (i + η + 1) · B, which bounds staleness only for groups trained in the
order they were admitted. A group written late (its replica slow, a tool call long) can reach the learner more
than η versions after its oldest token. With `learner.stale_groups: drop` such a group is dead-lettered with
that reason, its quota given back and its prompt queued to be generated again (`return_quota`: the
controller's `ReturnQuota`, before the dead letter, so a crash in between repeats the return, which the
controller takes once), so fresh trajectories are admitted in its place: nothing trained is older than η.
With `hold`, `collect` first waits for the leases whose groups would otherwise go stale (`learner.stale_hold`);
a group stale all the same (written after its lease expired) is dropped as under `drop`.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from asyncrl.core.buffer.trajectory_checks import BadGroup, TrajectoryLimits, check_trajectory_group
from asyncrl.core.records.rollout import GroupRejected
from asyncrl.learner.batch import MalformedGroup, TrainBatch, assemble, check_group
from asyncrl.learner.batch_fill import pick
from asyncrl.learner.stale_hold import StaleHold
from asyncrl.learner.timeline import TimelineFilter

log = logging.getLogger("asyncrl.learner")
TRAINED_GROUPS_REMEMBERED = 1_000_000
PREFETCH_WAIT_S = 0.005
"""How long the prefetch's read waits for entries not yet written (the loop's own read waits longer)."""

STALE = "staleness: "
"""How the reason of a group dropped for its age begins."""

Inspection = tuple[str | None, int]
"""What the checks that need nothing but the entry say of it: (its problem or None, its newest token version)."""


@dataclass
class ReadAhead:
    """What the prefetch thread hands back to the loop."""

    entries: list
    """The entries it read (delivered to this learner: pending until acked)."""
    inspections: dict[str, Inspection] = field(default_factory=dict)
    """Entry id -> its inspection (an entry missing here is inspected on the loop's thread)."""
    batch: TrainBatch | None = None
    """The next batch assembled from the carried entries and these, when they make it whole and all passed."""


class BatchIntake:
    def __init__(self, *, buffer, events, metrics, limits: TrajectoryLimits, batch_size: int, groups_per_step: int,
                 batch_timeout_s: float, prefetch: bool, routing_shape: Callable, version: Callable[[], int],
                 heartbeat: Callable[[], None], lookahead: int, max_staleness: int | None = None,
                 return_quota: Callable[..., None] | None = None, stale_policy: str = "drop",
                 hold: StaleHold | None = None, canonical_order: bool = False):
        self.buffer = buffer
        self.events = events
        self.metrics = metrics
        self.limits = limits
        """What a group must satisfy to be trained on (the rest is dead-lettered)."""
        self.groups_per_step = groups_per_step
        """B / G: the groups of a batch, at most (fewer when it holds hard prompts' larger groups)."""
        self.batch_size = batch_size
        """B: the trajectories of a batch, exactly (`batch_fill`)."""
        if lookahead < groups_per_step:
            raise ValueError(f"lookahead ({lookahead} groups) must hold a batch ({groups_per_step} groups)")
        self.lookahead = lookahead
        """Groups the learner holds to choose a batch from (`lookahead_groups`)."""
        self.oldest_first = lookahead > groups_per_step
        """Batches of the oldest groups held; False: each batch is the next groups written."""
        self.canonical_order = canonical_order
        """Each batch's groups in `age` order, not the order they arrived in (`model.determinism`: the same
        groups give the same gradient whichever replica wrote them first)."""
        self.batch_timeout_s = batch_timeout_s
        self._routing_shape = routing_shape
        """The learner's MoE routing shape (None: dense), asked when needed."""
        self._version = version
        """The learner's current weight version, asked at admission."""
        self._heartbeat = heartbeat
        """Called while `collect` waits for data."""
        self.trained: OrderedDict[str, None] = OrderedDict()
        """Group ids this process trained on (the last TRAINED_GROUPS_REMEMBERED): a second copy of one, e.g.
        from a buffer write retried after its reply was lost, is dead-lettered, not trained twice."""
        self.timeline: TimelineFilter | None = None
        """Set when the learner reset the run to its checkpoint: keeps the lost timeline's late groups out."""
        self._prefetch = ThreadPoolExecutor(1, thread_name_prefix="prefetch") if prefetch else None
        self._prefetched: Future | None = None
        self._inspections: dict[str, Inspection] = {}
        """Inspections the prefetch thread made, until their entry is admitted or refused."""
        self._ready: TrainBatch | None = None
        """The batch the prefetch thread assembled; used when the loop collects exactly its entries."""
        self.max_staleness = max_staleness
        """η: a group whose oldest token is more versions behind is stale (None: no bound)."""
        self._return_quota = return_quota
        """(entry id, trajectories, reason, prompt, lease id) -> the quota of a stale group dropped goes back to
        the controller, and its prompt is generated again."""
        self.stale_policy = stale_policy
        """`learner.stale_groups`: drop, hold (then drop what is stale all the same) or train (counted, trained)."""
        self.hold = hold
        """Waits before each step for the leases that would go stale (`hold`); None: no wait."""
        self.held_s = 0.0
        """Seconds the last `collect` waited in `hold`."""

    def _inspect(self, entry) -> Inspection:
        """The checks that need nothing but the entry (pure, so the prefetch thread runs them too)."""
        if entry.problem is not None:
            return entry.problem, -1
        try:
            newest = check_trajectory_group(entry.group, self.limits)
            shape = self._routing_shape()
            if shape is not None:  # the rest of check_group's structure checks are check_trajectory_group's too
                check_group(entry.group, shape)
            return None, newest
        except (BadGroup, MalformedGroup) as err:
            return str(err), -1

    def _from_the_future(self, entry, newest: int) -> str | None:
        version = self._version()
        if newest <= version:
            return None
        try:  # the check's own words, naming the trajectory
            check_trajectory_group(entry.group, self.limits.with_max_version(version))
        except BadGroup as err:
            return str(err)
        return f"weight_version: {newest} is from the future (current version {version})"

    def admit(self, entry) -> bool:
        """Whether `entry` may join a batch; anything else is dead-lettered with its reason and acked. What
        depends on the learner's state is decided here, after the inspection (made ahead, or now, and kept
        while the entry is held: a group carried over several steps is admitted again each time, checked once)."""
        reason = entry.problem
        if reason is None and self.timeline is not None:
            reason = self.timeline.refusal(entry)
        if reason is None and entry.group.group_id in self.trained:
            reason = f"group_id: {entry.group.group_id!r} was already trained (a duplicate write)"
        if reason is None:
            inspection = self._inspections.get(entry.entry_id)
            if inspection is None:
                inspection = self._inspections[entry.entry_id] = self._inspect(entry)
            problem, newest = inspection
            reason = problem or self._from_the_future(entry, newest) or self._too_old(entry)
            if reason is None:
                return True
        self._inspections.pop(entry.entry_id, None)
        log.log(logging.WARNING if reason.startswith(STALE) else logging.ERROR, "dead-lettering %s (group %r): %s",
                entry.entry_id, entry.group.group_id, reason)
        self.buffer.dead_letter(entry.entry_id, reason)
        self.events.write(GroupRejected(entry_id=entry.entry_id, group_id=entry.group.group_id, reason=reason))
        self.metrics.dead_letters.inc()
        return False

    def _too_old(self, entry) -> str | None:
        """Why `entry` is dropped for being older than η at the version that would train it now, its quota
        returned first; None when it is not (a stale group kept under `train_stale` is only counted)."""
        version, oldest = self._version(), age(entry)[0]
        if self.max_staleness is None or version - oldest <= self.max_staleness:
            return None
        self.metrics.stale_groups.inc()
        if self.stale_policy == "train":
            return None
        reason = (f"{STALE}its oldest token is from version {oldest}, {version - oldest} behind the learner's "
                  f"{version} (controller.eta {self.max_staleness}; learner.stale_groups: {self.stale_policy})")
        if self._return_quota is not None:
            group = entry.group
            prompt = group.sample_index if group.HasField("sample_index") else group.prompt_index
            self._return_quota(entry.entry_id, len(group.trajectories), reason, prompt, group.lease_id)
        return reason

    def collect(self, carry: list, stop=None) -> tuple[list, list]:
        """The admitted entries in hand: (the next batch, the rest, carried to later steps); no batch when `stop`
        is set meanwhile (the entries stay pending, unacked). With `hold`, after the leases whose groups would go
        stale at the next step have ended."""
        if self.hold is not None:
            self.held_s = self.hold.before_step(self._version(), stop)
        entries = [entry for entry in carry if self.admit(entry)]
        room = self.lookahead - len(entries)
        if self.oldest_first and room > 0:
            # What was written since the prefetch read, without waiting: one of them may be older than all
            # in hand (written late by a slow replica).
            entries.extend(entry for entry in self.buffer.get(room, timeout_s=0) if self.admit(entry))
        deadline = time.time() + self.batch_timeout_s
        split = self.split(entries)
        while split is None and not (stop is not None and stop.is_set()):
            if time.time() > deadline:
                held = sum(len(entry.group.trajectories) for entry in entries)
                raise TimeoutError(f"no full batch within {self.batch_timeout_s}s ({held}/{self.batch_size} "
                                   f"trajectories in {len(entries)} groups)")
            got = self.buffer.get(max(1, self.groups_per_step - len(entries)), timeout_s=1.0)
            entries.extend(entry for entry in got if self.admit(entry))
            split = self.split(entries)
            if split is None:
                self._heartbeat()
        return split or ([], entries)

    def split(self, entries: list) -> tuple[list, list] | None:
        """(the next batch, the rest) of `entries`, or None while they hold no batch: groups adding up to
        `batch_size` trajectories (`batch_fill.pick`), taken in written order, or (holding more than a batch
        to choose from) the oldest first, stable; a second copy of a group id never in the same batch as the
        first (it is refused as a duplicate once the first is trained)."""
        ordered = sorted(entries, key=age) if self.oldest_first else list(entries)
        eligible, ids = [], set()
        for at, entry in enumerate(ordered):
            if entry.group.group_id not in ids:
                eligible.append(at)
                ids.add(entry.group.group_id)
        chosen = pick([len(ordered[at].group.trajectories) for at in eligible], self.batch_size)
        if chosen is None:
            return None
        taken = {eligible[i] for i in chosen}
        batch = [ordered[at] for at in sorted(taken)]
        if self.canonical_order and not self.oldest_first:
            batch.sort(key=age)
        return batch, [entry for at, entry in enumerate(ordered) if at not in taken]

    def start_prefetch(self, carry: list) -> None:
        """Read, inspect and assemble the next batch (`carry` + what is missing) on a thread while this one
        trains. Admitting or refusing the entries stays with `collect`. Entries read and never trained (the
        learner stopped) stay pending, as any delivered entry does."""
        groups = self.lookahead - len(carry)
        if self._prefetch is not None and groups > 0:
            self._prefetched = self._prefetch.submit(self._read_ahead, list(carry), groups)

    def _read_ahead(self, carry: list, groups: int) -> ReadAhead:
        got = self.buffer.get(groups, PREFETCH_WAIT_S)
        ahead = ReadAhead(got)
        try:
            ahead.inspections = {entry.entry_id: self._inspect(entry) for entry in got}
            # The carried entries were admitted at the last step; of the new ones, those that passed. What
            # the loop decides on admission can still change the batch: then `batch_of` assembles it anew.
            held = carry + [entry for entry in got if ahead.inspections[entry.entry_id][0] is None]
            split = self.split(held)
            if split is not None:
                ahead.batch = assemble(split[0], self._routing_shape())
        except Exception as err:  # noqa: BLE001 - the entries go back to the loop, which inspects them itself
            log.warning("prefetch: inspecting %d entries failed: %s: %s", len(got), type(err).__name__, err)
            ahead.inspections, ahead.batch = {}, None
        return ahead

    def take_prefetched(self) -> list:
        """The entries the prefetch read ([] when none was in flight or the read failed); their inspections
        and the assembled batch are kept for `collect` and `batch_of`."""
        future, self._prefetched = self._prefetched, None
        if future is None:
            return []
        try:
            ahead = future.result()
        except Exception as err:  # noqa: BLE001 - the read is retried by `collect`; the entries stay pending
            log.warning("prefetch failed: %s: %s", type(err).__name__, err)
            return []
        self._inspections.update(ahead.inspections)
        self._ready = ahead.batch
        return ahead.entries

    def batch_of(self, entries: list) -> TrainBatch:
        """The training batch of `entries`: the one the prefetch thread assembled when it holds exactly them."""
        ready, self._ready = self._ready, None
        if ready is not None and ready.entry_ids == [entry.entry_id for entry in entries]:
            return ready
        return assemble(entries, self._routing_shape())

    def mark_trained(self, group_ids, entry_ids=()) -> None:
        for entry_id in entry_ids:
            self._inspections.pop(entry_id, None)
        for group_id in dict.fromkeys(group_ids):
            self.trained[group_id] = None
        while len(self.trained) > TRAINED_GROUPS_REMEMBERED:
            self.trained.popitem(last=False)


def age(entry) -> tuple[int, int]:
    """How old a group is: the version of its oldest token (what its staleness at training is measured from;
    a trajectory's first token is its oldest, versions only move forward while it generates), then its
    prompt index (admission order)."""
    return min(t.weight_version[0] for t in entry.group.trajectories), entry.group.prompt_index


def lookahead_groups(oldest_first: bool, eta: int | None, groups_per_step: int) -> int:
    """How many groups the learner holds to choose each batch from: with `learner.oldest_first` and a bounded
    η > 0, all that admission lets exist ahead of it ((η + 1) · B trajectories); else one batch."""
    if oldest_first and eta:
        return (eta + 1) * groups_per_step
    return groups_per_step
