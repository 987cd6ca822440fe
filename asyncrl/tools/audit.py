"""Audit of a run from its event logs: the η rule held at every admission and at every training (no group trained
more than η versions after its oldest token), versions only grew, every
trajectory group written was trained exactly once (or is still in the buffer, or dead-lettered with its
reason: none lost, none twice), every lease was completed by its holder, and the policy never fell back (a
learner starting over without resuming from a checkpoint). A run passes only when it is also whole: it reached
the steps its learner was started for, and the controller reset its timeline only when a learner resuming
from a checkpoint asked for it (a reset nobody resumed for is someone else moving the run back).

A resumed run (`up --resume`, or a learner restarted alone) appends to the same logs. Its learner continues
from a checkpoint at step s and trains again what it had trained after s: the audit counts against the
surviving policy, so the learner's `trained`/`step` records after step s that precede the `resumed` record are
void, and each fresh controller start or timeline reset begins a new epoch of version ordering (the version
restarts at the checkpoint's). A controller restored from its saved state continues its epoch.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from asyncrl.core.records import Record
from asyncrl.core.records.controller import (
    ControllerStarted,
    LeaseCompleted,
    LeaseExpired,
    LeaseGranted,
    PushCommitted,
    QuotaReturned,
    TimelineReset,
)
from asyncrl.core.records.learner import (
    Eval,
    FinalBuffer,
    LearnerDied,
    LearnerLost,
    LearnerStarted,
    Resumed,
    Step,
    Trained,
)
from asyncrl.core.records.rollout import GroupRejected, GroupSkipped, GroupWritten
from asyncrl.core.runtime.events import read_records


@dataclass
class AuditReport:
    leases_granted: int = 0
    eta_violations: list = field(default_factory=list)
    versions_committed: list = field(default_factory=list)
    version_errors: list = field(default_factory=list)
    groups_written: int = 0
    groups_trained: int = 0
    trained_twice: list = field(default_factory=list)
    trained_unwritten: list = field(default_factory=list)
    written_by_dead_replica: list = field(default_factory=list)
    lost: list = field(default_factory=list)
    left_in_buffer: int = 0
    written_after_end: int = 0
    rejected: int = 0
    skipped_uniform: int = 0
    """Groups a replica did not write because their rewards were all equal (`sampling.drop_uniform_groups`)."""
    skipped_unplayable: int = 0
    """Groups a replica did not write because an episode of theirs ended before the model's first turn."""
    staleness_hist: dict = field(default_factory=dict)
    fell_back: list = field(default_factory=list)
    """Learner steps that start over (a step number not one past the last) without a `resumed` record: older
    weights trained under the run's newer version numbers."""
    stolen_leases: list = field(default_factory=list)
    """Leases completed by a replica other than the one they were granted to."""
    open_leases: int = 0
    """Leases neither completed nor expired in the log (in flight when the run stopped)."""
    trained_beyond_eta: list = field(default_factory=list)
    """Groups trained more than η versions after their oldest token: {group_id, version, oldest}."""
    learner_deaths: list = field(default_factory=list)
    """Each learner death `up` recorded (`learner_died`): its exit status, cause and what `up` did."""
    prompts_dropped: int = 0
    """Groups the learner dropped for their age whose prompt it asked to generate again (`quota_returned`)."""
    prompts_regenerated: int = 0
    """Leases granted for such a prompt (the rest were still queued when the run stopped)."""
    regenerated_unasked: list = field(default_factory=list)
    """Leases granted as a dropped prompt generated again that no drop asked for: {lease_id, prompt}."""
    resets_unasked: list = field(default_factory=list)
    """Timeline resets of the controller that no learner resuming from that version asked for."""
    last_step: int = 0
    """The last learner step of the surviving timeline."""
    total_steps: int | None = None
    """The steps the run's last learner was started for (None: a log from before learners recorded it)."""

    @property
    def ok(self) -> bool:
        return not self.failures()

    @property
    def intact(self) -> bool:
        """Nothing lost, nothing twice, η held, no one else moved the run, however far it got."""
        return not self.broken()

    def failures(self) -> list[str]:
        """Why the audit fails, one line per reason (empty: it passes): what broke, then a run that ended short
        of its steps."""
        short = self.total_steps is not None and self.last_step < self.total_steps
        return self.broken() + ([f"the run ended at step {self.last_step} of {self.total_steps}"] if short else [])

    def broken(self) -> list[str]:
        """What broke, one line per reason; a learner death that ended the run is named with its cause."""
        checks = [(self.eta_violations, "admissions broke the η rule"), (self.version_errors, "versions went back"),
                  (self.trained_twice, "groups trained twice"),
                  (self.trained_unwritten, "groups trained that no one wrote"), (self.lost, "groups lost"),
                  (self.fell_back, "learner steps fell back without resuming"),
                  (self.stolen_leases, "leases completed by another replica"),
                  (self.trained_beyond_eta, "groups trained more than η versions after their oldest token"),
                  (self.regenerated_unasked, "prompts generated again that no dropped group asked for"),
                  ]  # fmt: skip
        out = [f"{len(found)} {what}" for found, what in checks if found]
        if self.resets_unasked:
            out.append(f"{len(self.resets_unasked)} timeline resets no resuming learner asked for "
                       f"(the first: {self.resets_unasked[0]})")
        if self.groups_trained == 0:
            out.append("no group was trained")
        final = [d for d in self.learner_deaths if d["action"].startswith("not restarted")]
        short = self.total_steps is not None and self.last_step < self.total_steps
        if (out or short) and final:
            out.append(f"the learner died (exit {final[-1]['exit_code']}, {final[-1]['cause']}), "
                       f"{final[-1]['action']}")
        return out

    def headline(self) -> str:
        return (f"{self.leases_granted} leases, {len(self.eta_violations)} η violations; "
                f"{len(self.versions_committed)} versions committed, {len(self.version_errors)} ordering errors; "
                f"{self.groups_written} groups written, {self.groups_trained} trained, "
                f"{len(self.trained_twice)} twice, {len(self.lost)} lost, {self.rejected} dead-lettered, "
                f"{self.left_in_buffer} left in buffer; {len(self.fell_back)} fall-backs, "
                f"{len(self.stolen_leases)} stolen leases, {len(self.trained_beyond_eta)} trained beyond η"
                + (f"; {self.skipped_uniform} groups with uniform rewards not written" if self.skipped_uniform else "")
                + (f"; {self.skipped_unplayable} groups not written (an environment failed at an episode's start)"
                   if self.skipped_unplayable else "")
                + (f"; {self.prompts_dropped} stale groups dropped, {self.prompts_regenerated} of their prompts "
                   "generated again" if self.prompts_dropped else ""))

    def as_dict(self) -> dict:
        return {"ok": self.ok, "intact": self.intact, "headline": self.headline(), "leases_granted": self.leases_granted,
                "eta_violations": self.eta_violations[:20], "versions_committed": self.versions_committed[-5:],
                "version_errors": self.version_errors[:20], "groups_written": self.groups_written,
                "groups_trained": self.groups_trained, "trained_twice": self.trained_twice[:20],
                "trained_unwritten": self.trained_unwritten[:20],
                "written_by_dead_replica": self.written_by_dead_replica[:20], "lost": self.lost[:20],
                "left_in_buffer": self.left_in_buffer, "written_after_end": self.written_after_end,
                "rejected": self.rejected, "skipped_uniform": self.skipped_uniform,
                "skipped_unplayable": self.skipped_unplayable, "staleness_hist": self.staleness_hist, "fell_back": self.fell_back[:20],
                "stolen_leases": self.stolen_leases[:20], "open_leases": self.open_leases,
                "trained_beyond_eta": self.trained_beyond_eta[:20], "learner_deaths": self.learner_deaths,
                "prompts_dropped": self.prompts_dropped, "prompts_regenerated": self.prompts_regenerated,
                "regenerated_unasked": self.regenerated_unasked[:20], "resets_unasked": self.resets_unasked[:20],
                "last_step": self.last_step, "total_steps": self.total_steps, "failures": self.failures()}


def check_eta(report: AuditReport, controller: list[Record]) -> None:
    for ev in controller:
        if not isinstance(ev, LeaseGranted):
            continue
        report.leases_granted += 1
        if ev.eta is None:
            continue
        # The rule for the last trajectory admitted by this lease: floor((N_r - 1) / B) <= i + η.
        if (ev.admitted_after - 1) // ev.batch_size > ev.version + ev.eta:
            report.eta_violations.append({"lease_id": ev.lease_id, "admitted_after": ev.admitted_after,
                                          "version": ev.version, "eta": ev.eta})


def check_leases(report: AuditReport, controller: list[Record]) -> None:
    """Every completion came from the lease's holder; count leases still open at the end of the log."""
    holder = {ev.lease_id: ev.replica_id for ev in controller if isinstance(ev, LeaseGranted)}
    ended = set()
    for ev in controller:
        if isinstance(ev, (LeaseCompleted, LeaseExpired)):
            ended.add(ev.lease_id)
            if isinstance(ev, LeaseCompleted) and holder.get(ev.lease_id, ev.replica_id) != ev.replica_id:
                report.stolen_leases.append({"lease_id": ev.lease_id, "holder": holder[ev.lease_id],
                                             "completed_by": ev.replica_id})
    report.open_leases = len(set(holder) - ended)


def check_eta_at_training(report: AuditReport, controller: list[Record], learner: list[Record],
                          written: dict[str, GroupWritten]) -> None:
    """No group was trained more than η versions after its oldest token (the η of the run's last controller
    start; none: no bound)."""
    starts = [ev for ev in controller if isinstance(ev, ControllerStarted)]
    eta = starts[-1].eta if starts else None
    if eta is None:
        return
    for ev in learner:
        if not isinstance(ev, Trained):
            continue
        for group_id in ev.group_ids:
            group = written.get(group_id)
            if group is not None and group.min_version >= 0 and ev.version - group.min_version > eta:
                report.trained_beyond_eta.append({"group_id": group_id, "version": ev.version,
                                                  "oldest": group.min_version})


def check_regenerated(report: AuditReport, controller: list[Record]) -> None:
    """Every lease granted as a dropped group's prompt generated again follows a drop of that prompt, one lease
    per drop (a fresh controller start forgets the prompts still queued: a restored one keeps them)."""
    asked: Counter = Counter()
    for ev in controller:
        if isinstance(ev, ControllerStarted) and ev.restored is None:
            asked.clear()
        elif isinstance(ev, QuotaReturned) and ev.prompt_index is not None:
            report.prompts_dropped += 1
            asked[ev.prompt_index] += 1
        elif isinstance(ev, LeaseGranted) and ev.regenerated:
            if asked[ev.sample_index] > 0:
                asked[ev.sample_index] -= 1
                report.prompts_regenerated += 1
            else:
                report.regenerated_unasked.append({"lease_id": ev.lease_id, "prompt": ev.sample_index})


RESTARTS = (Resumed, LearnerLost)
"""Learner records that take the run back to a checkpoint's step: a learner process starting from it, and
`up` recording that the last learner process ended without its closing records (`asyncrl.tools.run_end`)."""


def check_resets(report: AuditReport, controller: list[Record], learner: list[Record]) -> None:
    """Each reset of the controller's timeline to a version answers a learner that started from that version
    (its `resumed` record, written before it asks); one learner start answers one reset."""
    asked = Counter(ev.version for ev in learner if isinstance(ev, Resumed))
    for ev in controller:
        if not isinstance(ev, TimelineReset):
            continue
        if asked[ev.version]:
            asked[ev.version] -= 1
        else:
            report.resets_unasked.append(f"version {ev.previous_version} -> {ev.version}")


def check_whole(report: AuditReport, learner_log: list[Record], learner: list[Record]) -> None:
    """How far the surviving timeline got (its last step, or the checkpoint a restart went back to), against
    the steps its last learner was started for."""
    ends = [ev.step for ev in learner if isinstance(ev, Step)] + [ev.from_step for ev in learner
                                                                 if isinstance(ev, RESTARTS)]
    report.last_step = max(ends, default=0)
    goals = [ev.total_steps for ev in learner_log if isinstance(ev, LearnerStarted)]
    report.total_steps = goals[-1] if goals else None


def check_fall_back(report: AuditReport, learner: list[Record]) -> None:
    """The learner's step numbers only go on by one, except right after a `RESTARTS` record (from its step)."""
    last = 0
    for ev in learner:
        if isinstance(ev, RESTARTS):
            last = ev.from_step
        elif isinstance(ev, Step):
            if ev.step != last + 1:
                report.fell_back.append(f"step {ev.step} (version {ev.version}) after step {last} without resuming")
            last = ev.step


def surviving(learner: list[Record]) -> list[Record]:
    """The learner's records of the surviving timeline: a `resumed` or `learner_lost` record (from step s) voids
    the earlier `trained` records of steps >= s and `step`/`eval` records of steps > s."""
    kept: list[Record] = []
    for ev in learner:
        if isinstance(ev, RESTARTS):
            s = ev.from_step
            kept = [e for e in kept if not (
                (isinstance(e, Trained) and e.step >= s) or (isinstance(e, (Step, Eval)) and e.step > s)
            )]  # fmt: skip
        kept.append(ev)
    return kept


def _epochs(events: list, starts: list[float]) -> list[list]:
    """Split time-ordered records at the controller's start times."""
    out: list[list] = [[] for _ in range(len(starts) + 1)]
    for ev in events:
        out[sum(ev.t >= s for s in starts)].append(ev)
    return out


def _check_versions(report: AuditReport, controller: list[Record], learner: list[Record],
                    rollouts: list[tuple[str, GroupWritten]]):  # fmt: skip
    # Resync pushes re-commit the current version; a new version is always exactly the previous + 1.
    # A new epoch of version ordering: a controller started afresh (not restored), or the learner resetting the
    # run to its checkpoint (versions start again from it).
    fresh = [ev.t for ev in controller if isinstance(ev, ControllerStarted) and not ev.restored]
    starts = sorted(fresh[1:] + [ev.t for ev in controller if isinstance(ev, TimelineReset)])
    commits = [ev for ev in controller if isinstance(ev, PushCommitted)]
    report.versions_committed = sorted({ev.version for ev in commits})
    for epoch in _epochs(commits, starts):
        for a, b in itertools.pairwise(ev.version for ev in epoch):
            if not a <= b <= a + 1:
                report.version_errors.append(f"controller committed {a} then {b}")
    steps = [ev.version for ev in learner if isinstance(ev, Step)]
    for a, b in itertools.pairwise(steps):
        if b <= a:
            report.version_errors.append(f"learner published {a} then {b}")
    # A replica's groups in the order their leases were granted: one running multi-turn episodes finishes a
    # group whose episodes ran long after groups leased later, so its writes need not follow its leases.
    granted = {ev.lease_id: ev.t for ev in controller if isinstance(ev, LeaseGranted)}
    for source in sorted({src for src, _ in rollouts}):
        for epoch in _epochs([ev for src, ev in rollouts if src == source], starts):
            epoch.sort(key=lambda ev: granted.get(ev.lease_id, ev.t))
            for a, b in itertools.pairwise(epoch):
                if b.lease_version < a.lease_version:
                    report.version_errors.append(f"{source}: lease version went {a.lease_version} -> "
                                                 f"{b.lease_version}")


def audit_run(run_dir: str | Path) -> AuditReport:
    report = AuditReport()
    controller = read_records(run_dir, "controller")
    learner_log = read_records(run_dir, "learner")
    learner = surviving(learner_log)
    rollout_logs = [(path.stem, read_records(run_dir, path.stem))
                    for path in sorted(Path(run_dir, "events").glob("rollout-*.jsonl"))]
    rollouts = [(stem, ev) for stem, log in rollout_logs for ev in log if isinstance(ev, GroupWritten)]
    skipped = [ev for _, log in rollout_logs for ev in log if isinstance(ev, GroupSkipped)]
    report.skipped_uniform = sum(ev.reason == "uniform" for ev in skipped)
    report.skipped_unplayable = len(skipped) - report.skipped_uniform
    check_eta(report, controller)
    _check_versions(report, controller, learner, rollouts)
    check_leases(report, controller)
    check_regenerated(report, controller)
    check_fall_back(report, learner_log)
    check_resets(report, controller, learner_log)
    check_whole(report, learner_log, learner)
    report.learner_deaths = [{"exit_code": ev.exit_code, "cause": ev.cause, "action": ev.action}
                             for ev in learner_log if isinstance(ev, LearnerDied)]

    written = {ev.group_id: ev for _source, ev in rollouts}
    report.groups_written = len(written)
    trained = Counter(g for ev in learner if isinstance(ev, Trained) for g in ev.group_ids)
    rejected = {ev.group_id for ev in learner if isinstance(ev, GroupRejected)}
    report.rejected = len(rejected)
    report.groups_trained = len(trained)
    report.trained_twice = sorted(g for g, n in trained.items() if n > 1)
    # A replica killed after writing a group but before logging it: the group was trained (exactly once,
    # checked above) and either its lease expired, or (logs from before the worker logged first) the lease
    # completed as written, which tells the same. Not an error, but listed.
    accounted = {f"{ev.replica_id}-{ev.lease_id}" for ev in controller if isinstance(ev, LeaseExpired)}
    accounted |= {f"{ev.replica_id}-{ev.lease_id}" for ev in controller
                  if isinstance(ev, LeaseCompleted) and ev.num_written > 0}  # fmt: skip
    unlogged = sorted(g for g in trained if g not in written)
    report.written_by_dead_replica = [g for g in unlogged if g in accounted]
    report.trained_unwritten = [g for g in unlogged if g not in accounted]
    final = [ev for ev in learner if isinstance(ev, FinalBuffer)]
    remaining = set(final[-1].entry_ids) if final else set()
    end_t = (final[-1].snapshot_t or final[-1].t) if final else float("inf")
    for group_id, ev in written.items():
        if group_id in trained or group_id in rejected:
            continue
        if ev.entry_id in remaining:
            report.left_in_buffer += 1
        elif ev.t >= end_t:
            report.written_after_end += 1
        else:
            report.lost.append(group_id)
    check_eta_at_training(report, controller, learner, written)
    hist: Counter = Counter()
    for ev in learner:
        if isinstance(ev, Step):
            hist.update({int(k): v for k, v in ev.metrics.get("staleness/hist", {}).items()})
    report.staleness_hist = {str(k): hist[k] for k in sorted(hist)}
    return report
