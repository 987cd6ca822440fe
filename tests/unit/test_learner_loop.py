"""The learner loop's parts without a network: the teacher annotation under faults (`LearnerLoop.annotate`:
retried with backoff, then the batch goes on without teacher log-probs, recorded, never an exception), the
prefetch of the next batch, which groups make a batch (written order, or the oldest held first), and the
order of background pushes and checkpoints."""

from types import SimpleNamespace

import grpc
import pytest

from asyncrl.core.config.schema import AsyncRLConfig
from asyncrl.core.runtime.events import MemoryEvents
from asyncrl.learner.checkpoint_saver import CheckpointSaver
from asyncrl.learner.intake import lookahead_groups
from asyncrl.learner.learner_metrics import LearnerMetrics
from asyncrl.learner.loop import LearnerLoop
from asyncrl.v1 import teacher_pb2
from tests.unit.test_trainer import batch


class Failure(grpc.RpcError):
    def __init__(self, code):
        self._code = code

    def code(self):
        return self._code

    def details(self):
        return f"simulated {self._code.name}"


class Teacher:
    """Answers Score from a script: a status code to raise, or None to answer properly."""

    def __init__(self, script):
        self.script, self.calls = list(script), 0

    def Score(self, request, timeout):
        self.calls += 1
        code = self.script.pop(0) if self.script else None
        if code is not None:
            raise Failure(code)
        return teacher_pb2.ScoreResponse(sequences=[
            teacher_pb2.ScoredSequence(logp_teacher=[-0.5] * (len(s.token_ids) - s.response_start))
            for s in request.sequences
        ])


def loop_with(teacher) -> tuple[LearnerLoop, MemoryEvents, LearnerMetrics]:
    config = AsyncRLConfig.model_validate({"teacher": {"score_attempts": 3, "retry_backoff_s": 0.0}})
    events, metrics = MemoryEvents(), LearnerMetrics()
    loop = LearnerLoop(learner=config.learner, groups_per_step=8, lookahead=8, trainer=None, buffer=None,
                       controller_stub=None, publisher=None, evaluate=None, events=events, metrics=metrics, limits=None,
                       teacher_stub=teacher, teacher=config.teacher)
    return loop, events, metrics


@pytest.mark.parametrize("script, calls, annotated", [
    ([None], 1, True),
    ([grpc.StatusCode.UNAVAILABLE, None], 2, True),
    ([grpc.StatusCode.UNAVAILABLE] * 3, 3, False),
    ([grpc.StatusCode.DEADLINE_EXCEEDED] * 5, 3, False),
    ([grpc.StatusCode.INVALID_ARGUMENT], 1, False),  # the same request would fail again: no retry
])
def test_annotation_retries_then_goes_on_without_the_teacher(script, calls, annotated):
    teacher = Teacher(script)
    loop, events, metrics = loop_with(teacher)
    b = batch()
    b.logp_teacher = None
    loop.annotate(b)
    assert teacher.calls == calls
    assert (b.logp_teacher is not None) == annotated
    failures = events.of_kind("teacher_unavailable")
    assert len(failures) == (0 if annotated else 1)
    assert metrics.teacher_failures._value.get() == (0 if annotated else 1)
    if annotated:
        assert (b.logp_teacher[b.response_mask > 0] == -0.5).all()


def prefetching_loop(oldest_first: bool = False, controller_stub=None, eta=None, stale_groups="drop",
                     canonical_order=False):
    """A loop of 2 groups of 2 per step over an in-memory buffer, at version 3, with the checks of a 20-token
    vocabulary (no trainer: a dense policy's routing shape is None); batches in written order, or with
    `oldest_first` the oldest of up to (η + 1) x 2 = 6 groups held (η = 2)."""
    from types import SimpleNamespace

    from asyncrl.core.buffer.memory import MemoryBuffer
    from asyncrl.core.buffer.trajectory_checks import TrajectoryLimits

    config = AsyncRLConfig.model_validate({"sampling": {"group_size": 2}, "controller": {"eta": 2},
                                           "learner": {"batch_size": 4, "oldest_first": oldest_first,
                                                       "stale_groups": stale_groups}})
    events, metrics = MemoryEvents(), LearnerMetrics()
    loop = LearnerLoop(learner=config.learner, groups_per_step=2,
                       lookahead=lookahead_groups(config.learner.oldest_first, config.controller.eta, 2),
                       trainer=SimpleNamespace(replay=SimpleNamespace(shape=None)),
                       buffer=MemoryBuffer(), controller_stub=controller_stub, publisher=None, evaluate=None, events=events,
                       metrics=metrics, limits=TrajectoryLimits(20, 16, 5, 2, 10.0), eta=eta,
                       canonical_order=canonical_order)
    loop.progress.version = 3
    return loop, events, metrics


def group(name: str, version: int = 3, logp: float = -0.5, prompt_index: int = 0):
    from asyncrl.v1 import trajectory_pb2

    return trajectory_pb2.TrajectoryGroup(group_id=name, prompt_index=prompt_index, trajectories=[
        trajectory_pb2.Trajectory(trajectory_id=f"{name}/{j}", group_id=name, prompt_token_ids=[1, 4],
                                  response_token_ids=[5, 2], logp_behav=[logp, -0.1], weight_version=[version] * 2,
                                  reward=float(j))
        for j in range(2)
    ])


def held(collected: tuple[list, list]) -> list:
    """What `collect` returned, the batch then the rest, as one list."""
    batch, rest = collected
    return batch + rest


def test_prefetch_reads_checks_and_assembles_the_next_batch_on_its_thread(monkeypatch):
    """`learner.prefetch`: while a batch trains, the next one is read, inspected and assembled on the prefetch
    thread; read and not yet trained its entries are pending (a restarted learner takes them back); the loop
    then admits them without inspecting them again, and the batch waits for `train_on` (used when it gets
    exactly those entries)."""
    import threading

    import asyncrl.learner.intake as intake_module

    threads = []

    def assemble(entries, shape):
        threads.append(threading.current_thread().name)
        return real_assemble(entries, shape)

    real_assemble = intake_module.assemble
    monkeypatch.setattr(intake_module, "assemble", assemble)
    loop, _, _ = prefetching_loop()
    ids = [loop.buffer.put(group("a")), loop.buffer.put(group("b"))]
    loop.buffer.put(group("c"))  # beyond the next batch: not read
    loop.intake.start_prefetch([])
    got = loop.intake.take_prefetched()
    assert [e.entry_id for e in got] == ids
    assert [e.entry_id for e in loop.buffer.all_pending()] == ids
    assert threads and threads[0].startswith("prefetch")
    assert loop.intake._ready is not None and loop.intake._ready.entry_ids == ids and len(loop.intake._ready) == 4

    monkeypatch.setattr(loop.intake, "_inspect", lambda entry: pytest.fail("inspected twice"))
    assert [e.entry_id for e in held(loop.intake.collect(got))] == ids
    assert set(loop.intake._inspections) == set(ids)  # kept while the entries are held
    loop.intake.mark_trained(["a", "b"], ids)
    assert loop.intake._inspections == {}


def test_a_failed_prefetch_read_is_only_a_warning():
    loop, _, _ = prefetching_loop()

    class Broken:
        def get(self, groups, timeout_s):
            raise ConnectionError("redis went away")

    loop.intake.buffer = Broken()
    loop.intake.start_prefetch([])
    assert loop.intake.take_prefetched() == [] and loop.intake._ready is None
    assert loop.intake.take_prefetched() == []  # nothing in flight


def test_a_bad_group_read_ahead_is_refused_by_the_loop_not_by_the_prefetch_thread():
    """The prefetch thread has no side effects: a poisoned group it read is dead-lettered with its reason when
    the loop admits it, no batch is assembled ahead, and the good entries still make the batch."""
    loop, events, metrics = prefetching_loop()
    good = loop.buffer.put(group("good"))
    bad = loop.buffer.put(group("bad", logp=float("nan")))
    loop.intake.start_prefetch([])
    got = loop.intake.take_prefetched()
    assert loop.intake._ready is None
    assert loop.buffer.dead_letters() == [] and events.of_kind("group_rejected") == []
    late = loop.buffer.put(group("late"))
    assert [e.entry_id for e in held(loop.intake.collect(got))] == [good, late]
    (letter,) = loop.buffer.dead_letters()
    assert letter.entry_id == bad and "logp_behav holds a non-finite" in letter.reason
    assert metrics.dead_letters._value.get() == 1


def test_what_depends_on_the_loop_is_decided_when_an_entry_is_admitted():
    """A group's newest version is held against the learner's version when the loop admits it (not when the
    prefetch thread read it), and a group trained meanwhile is a duplicate then."""
    loop, events, _ = prefetching_loop()
    future = loop.buffer.put(group("future", version=4))
    twice = loop.buffer.put(group("twice"))
    loop.intake.start_prefetch([])
    got = loop.intake.take_prefetched()
    loop.intake.trained["twice"] = None  # trained by the step that ran while the prefetch read it
    ok = loop.buffer.put(group("ok"))
    ok2 = loop.buffer.put(group("ok2"))
    assert [e.entry_id for e in held(loop.intake.collect(got))] == [ok, ok2]
    reasons = {e["entry_id"]: e["reason"] for e in events.of_kind("group_rejected")}
    assert "weight_version 4 is from the future (current version 3)" in reasons[future]
    assert "was already trained" in reasons[twice]

    loop, _, _ = prefetching_loop()
    future = loop.buffer.put(group("future", version=4))
    loop.intake.start_prefetch([])
    got = loop.intake.take_prefetched()
    loop.progress.version = 4  # the step that ran meanwhile made version 4
    other = loop.buffer.put(group("other", version=4))
    assert [e.entry_id for e in held(loop.intake.collect(got))] == [future, other]


class Publisher:
    """Records the push calls; a background push 'completes' when finished."""

    def __init__(self, calls):
        self.calls, self._in_flight = calls, None

    def _result(self, version, background):
        from asyncrl.push.sender import PushResult

        return PushResult(version=version, committed=True, receivers=2, acked=["a", "b"], dropped=[], bytes_sent=100,
                          broadcast_s=0.001, total_s=0.002, attempts=1, new_group=False, background=background)

    def start(self, version, last=False):
        assert self._in_flight is None, "one push at a time"
        self.calls.append(("start", version, "last") if last else ("start", version))
        self._in_flight = version

    def finish(self):
        version, self._in_flight = self._in_flight, None
        if version is None:
            return None
        self.calls.append(("finish", version))
        return self._result(version, True)

    def push(self, version, last=False):
        assert self._in_flight is None, "one push at a time"
        self.calls.append(("push", version, "last") if last else ("push", version))
        return self._result(version, False)


def test_background_pushes_are_finished_before_the_next_push_and_before_a_checkpoint():
    """`learner.push_in_background`: push i+1 starts only after push i is finished and recorded; a checkpoint
    waits for the push of its version (a learner restarted from it must find that version committed)."""
    from asyncrl.core.buffer.memory import MemoryBuffer

    calls = []

    class Checkpointer:
        def save(self, model, optimizer, meta, covered):
            calls.append(("save", meta.version))
            return "ckpt"

    loop, events, metrics = loop_with(None)
    loop.publisher, loop.buffer = Publisher(calls), MemoryBuffer()
    loop.saver = CheckpointSaver(Checkpointer(), loop.buffer, events, metrics, background=False)
    loop.trainer = type("T", (), {"model": None, "optimizer": None})()
    loop.publish(1)
    loop.publish(2)
    loop.progress.step = loop.progress.version = 2
    loop.save()
    assert calls == [("start", 1), ("finish", 1), ("start", 2), ("finish", 2), ("save", 2)]
    assert [e["version"] for e in events.of_kind("push")] == [1, 2]
    assert all(e["background"] for e in events.of_kind("push"))
    assert metrics.push_seconds._sum.get() > 0

    loop.config.push_in_background = False
    calls.clear()
    loop.publish(3)
    assert calls == [("push", 3)] and events.of_kind("push")[-1]["background"] is False
    loop.publish(4, last=True)  # the run's last: the publisher reserves no push after it
    assert calls[-1] == ("push", 4, "last")


def test_status_reports_go_in_the_background_and_their_failures_surface_at_the_next_step():
    """After a step the heartbeat (and the buffer gauges) go on the status thread; the controller's request
    for a resync is taken once by the loop; a report that failed raises at the next step; the final report is
    best effort."""
    import threading

    from asyncrl.learner.progress import LearnerProgress
    from asyncrl.learner.status_report import StatusReporter
    from asyncrl.v1 import controller_pb2

    class Controller:
        def __init__(self):
            self.requests, self.fail, self.sync = [], None, False
            self.sent = threading.Event()

        def LearnerHeartbeat(self, request, timeout):
            self.requests.append(request)
            self.sent.set()
            if self.fail is not None:
                raise self.fail
            return controller_pb2.LearnerHeartbeatResponse(sync_requested=self.sync)

    controller, gauges = Controller(), []
    reporter = StatusReporter(controller, total_steps=10, observe_gauges=lambda: gauges.append(1), interval_s=0)
    progress = LearnerProgress(step=3, version=3, consumed=192, busy_fraction=0.75)
    # The step's metrics as the trainer writes them: the figures are read by their declared metric keys.
    progress.take_figures({"time/step_s": 0.5, "reward/mean": 0.5, "length/correct_mean": 11.0,
                           "length/truncated_frac": 0.25, "loss/total": 1.0})
    controller.sync = True
    reporter.after_step(progress)
    assert controller.sent.wait(10)
    reporter._sent.result()
    # The figures the step had go out by name, with the loop's own (wall time, busy share); one it lacked (no
    # incorrect response, no evaluation yet) is absent.
    assert controller.requests[-1].step == 3 and gauges
    assert dict(controller.requests[-1].figures) == {"reward_mean": 0.5, "length_correct_mean": 11.0,
                                                     "truncated_fraction": 0.25, "step_seconds": 0.0,
                                                     "busy_fraction": 0.75}
    assert reporter.take_sync_request() and not reporter.take_sync_request()

    controller.fail = Failure(grpc.StatusCode.UNAVAILABLE)
    reporter.after_step(LearnerProgress(step=4, version=4))
    assert isinstance(reporter._sent.exception(timeout=10), Failure)
    with pytest.raises(Failure):
        reporter.after_step(LearnerProgress(step=5, version=5))
    reporter.finish(LearnerProgress(step=5, version=5))  # logs, does not raise
    assert controller.requests[-1].step == 5


def test_status_reports_go_at_most_once_per_interval_with_the_newest_figures_and_none_are_left_behind():
    """learner.status_interval_s 1, on a fake clock: step 1 is reported at once; steps 2 and 3 end while the
    status thread waits out the interval, which then reports step 3's figures (the newest); with nothing newer
    after another interval the thread stops, and step 4, ending a whole interval later, is reported at once;
    `finish` reports the last step whatever the clock says, and step 5, still waiting then, is not sent."""
    import threading
    import time

    from asyncrl.learner.progress import LearnerProgress
    from asyncrl.learner.status_report import StatusReporter
    from asyncrl.v1 import controller_pb2

    class Controller:
        def __init__(self):
            self.steps = []

        def LearnerHeartbeat(self, request, timeout):
            self.steps.append(request.step)
            return controller_pb2.LearnerHeartbeatResponse()

    now, sleeping, wake = [0.0], threading.Semaphore(0), threading.Semaphore(0)

    def sleep(seconds: float) -> None:  # the status thread's wait: it goes on when the test says so
        sleeping.release()
        assert wake.acquire(timeout=10)
        now[0] += seconds

    def waits() -> None:  # the status thread is waiting out an interval
        assert sleeping.acquire(timeout=10)

    controller, gauges = Controller(), []
    reporter = StatusReporter(controller, total_steps=10, observe_gauges=lambda: gauges.append(now[0]),
                              interval_s=1.0, clock=lambda: now[0], sleep=sleep)
    reporter.after_step(LearnerProgress(step=1, version=1))
    waits()
    assert controller.steps == [1]
    reporter.after_step(LearnerProgress(step=2, version=2))
    reporter.after_step(LearnerProgress(step=3, version=3))
    wake.release()
    waits()  # step 3 sent at t = 1, now waiting until t = 2
    assert controller.steps == [1, 3] and gauges == [0.0, 1.0]
    wake.release()  # t = 2: nothing newer, the thread stops
    reporter._sent.result(timeout=10)
    reporter.after_step(LearnerProgress(step=4, version=4))
    waits()
    assert controller.steps == [1, 3, 4]
    reporter.after_step(LearnerProgress(step=5, version=5))  # waits for t = 3 ...
    finishing = threading.Thread(target=reporter.finish, args=(LearnerProgress(step=6, version=6),))
    finishing.start()  # ... but the last figures supersede it
    wait_until = time.monotonic() + 10
    while reporter._latest is not None:
        assert time.monotonic() < wait_until
        time.sleep(0.01)
    wake.release()
    finishing.join(10)
    assert controller.steps == [1, 3, 4, 6]


def take_batch(loop, carry):
    """One step's batch as the loop takes it: (the batch's entries, the carried rest)."""
    batch, rest = loop.intake.collect(carry)
    loop.intake.mark_trained([e.group.group_id for e in batch], [e.entry_id for e in batch])
    return batch, rest


@pytest.mark.parametrize("oldest_first, first_batch_versions", [(False, [3, 3]), (True, [1, 3])])
def test_a_group_written_late_is_trained_first_when_the_learner_takes_the_oldest(oldest_first,
                                                                                first_batch_versions):
    """Written after four newer groups, a group of version 1 at learner version 3 (η = 2, staleness 2: its
    last admissible step) waits two steps behind them in written order (staleness 4 > η); oldest first it
    makes this step's batch. The rest is carried, admitted again without a second inspection."""
    loop, _, _ = prefetching_loop(oldest_first)
    for i in range(4):
        loop.buffer.put(group(f"new{i}", version=3, prompt_index=10 + i))
    loop.buffer.put(group("late", version=1, prompt_index=2))
    loop.intake.start_prefetch([])
    batch, rest = take_batch(loop, loop.intake.take_prefetched())
    assert [e.group.trajectories[0].weight_version[0] for e in batch] == first_batch_versions
    if oldest_first:
        assert [e.group.group_id for e in batch] == ["late", "new0"]
        assert [e.group.group_id for e in rest] == ["new1", "new2", "new3"]
        loop.intake._inspect = lambda entry: pytest.fail("a carried group inspected again")
        batch, rest = take_batch(loop, rest)
        assert [e.group.group_id for e in batch] == ["new1", "new2"] and len(rest) == 1


@pytest.mark.parametrize("canonical_order, first_batch", [(False, ["b", "a"]), (True, ["a", "b"])])
def test_a_reproducible_run_trains_each_batch_in_prompt_order_whatever_order_it_arrived_in(canonical_order,
                                                                                            first_batch):
    """`model.determinism` reproducible: the same groups make the same gradient whichever replica wrote first
    (a batch is its groups in `age` order: version, then prompt position); otherwise written order."""
    loop, _, _ = prefetching_loop(canonical_order=canonical_order)
    loop.buffer.put(group("b", prompt_index=7))
    loop.buffer.put(group("a", prompt_index=6))
    loop.buffer.put(group("c", prompt_index=5))
    loop.intake.start_prefetch([])
    batch, _ = take_batch(loop, loop.intake.take_prefetched())
    assert [e.group.group_id for e in batch] == first_batch


def test_oldest_first_reads_what_was_written_since_the_prefetch_and_keeps_copies_apart():
    """`collect` reads, without waiting, what arrived after the prefetch read (a late group among it goes
    first); a second copy of a group id never shares a batch with the first and is refused once it is
    trained."""
    loop, events, _ = prefetching_loop(oldest_first=True)
    first = loop.buffer.put(group("g", version=3, prompt_index=5))
    loop.buffer.put(group("h", version=3, prompt_index=6))
    loop.intake.start_prefetch([])
    prefetched = loop.intake.take_prefetched()
    loop.buffer.put(group("late", version=2, prompt_index=1))
    copy = loop.buffer.put(group("g", version=3, prompt_index=5))
    batch, rest = take_batch(loop, prefetched)
    assert [e.group.group_id for e in batch] == ["late", "g"] and batch[1].entry_id == first
    assert [e.entry_id for e in rest] == [copy, prefetched[1].entry_id]  # the copy (prompt 5), then h (6)
    loop.buffer.put(group("i", version=3, prompt_index=7))
    batch, rest = take_batch(loop, rest)
    assert [e.group.group_id for e in batch] == ["h", "i"] and rest == []  # the copy was refused, not trained
    (rejected,) = events.of_kind("group_rejected")
    assert rejected["entry_id"] == copy and "already trained" in rejected["reason"]


@pytest.mark.parametrize("eta, oldest_first, expected", [(4, True, 40), (2, True, 24), (0, True, 8),
                                                         (None, True, 8), (4, False, 8)])
def test_the_learner_holds_all_that_admission_lets_ahead_only_with_a_bound(eta, oldest_first, expected):


    config = AsyncRLConfig.model_validate({"controller": {"eta": eta}, "learner": {"oldest_first": oldest_first}})
    assert lookahead_groups(config.learner.oldest_first, config.controller.eta, 8) == expected


def test_holding_a_full_lookahead_the_learner_reads_nothing_more():
    """With all the groups it may hold in hand (the prefetch read 6 of 6), `collect` asks the buffer for none:
    Redis refuses a read of 0 entries (XREADGROUP COUNT must be positive)."""
    loop, _, _ = prefetching_loop(oldest_first=True)
    asked = []
    real_get = loop.buffer.get

    def get(max_groups, timeout_s):
        asked.append(max_groups)
        assert max_groups >= 1, "a read of no entries"
        return real_get(max_groups, timeout_s)

    loop.intake.buffer = loop.buffer = SimpleNamespace(get=get, dead_letter=loop.buffer.dead_letter, put=loop.buffer.put)
    for i in range(7):
        loop.buffer.put(group(f"g{i}", prompt_index=i))
    loop.intake.start_prefetch([])
    held = loop.intake.take_prefetched()
    assert len(held) == 6 and asked == [6]
    batch, rest = take_batch(loop, held)
    assert asked == [6] and [e.group.group_id for e in batch] == ["g0", "g1"] and len(rest) == 4


def test_evaluations_on_a_replica_are_recorded_at_their_step_one_at_a_time_and_fall_back_to_the_learner():
    """`learner.eval_by: replica`: the evaluation asked for at step 10 is recorded as step 10's when it
    finishes; one due while it runs is skipped; one that could not run on a replica runs on the learner."""
    import threading

    from asyncrl.learner.replica_eval import BackgroundEvaluations, NoReplica, ReplicaEvaluation

    gate = threading.Event()

    class Evaluator:
        def __init__(self):
            self.outcomes = [ReplicaEvaluation(0.5, "replica-1", (9, 10)), NoReplica("no live replica with current weights")]

        def evaluate(self):
            assert gate.wait(10)
            outcome = self.outcomes.pop(0)
            if isinstance(outcome, Exception):
                raise outcome
            return outcome

    loop, events, metrics = loop_with(None)
    loop.evaluate = lambda: {"accuracy": 0.25}  # the learner's own evaluation
    loop.replica_evals = BackgroundEvaluations(Evaluator())
    loop.progress.step = loop.progress.version = 10
    loop.periodic_eval()
    loop.progress.step = loop.progress.version = 20
    loop.periodic_eval()  # the one of step 10 still runs
    assert [e["step"] for e in events.of_kind("eval_skipped")] == [20]
    loop.take_replica_eval()
    assert events.of_kind("eval") == []  # not finished: nothing recorded, nothing waited for
    gate.set()
    loop.take_replica_eval(wait=True)
    [on_replica] = events.of_kind("eval")
    assert (on_replica["step"], on_replica["version"], on_replica["accuracy"], on_replica["by"]) == (10, 10, 0.5, "replica")
    assert on_replica["replica_id"] == "replica-1" and on_replica["weight_versions"] == [9, 10]
    assert loop.progress.last_eval_accuracy == 0.5 and metrics.eval_accuracy._value.get() == 0.5

    loop.progress.step = loop.progress.version = 30
    loop.periodic_eval()
    loop.take_replica_eval(wait=True)
    [fallback] = events.of_kind("eval_fallback")
    assert fallback["step"] == 30 and "no live replica" in fallback["error"]
    on_learner = events.of_kind("eval")[-1]
    assert (on_learner["step"], on_learner["accuracy"], on_learner["by"]) == (30, 0.25, "learner")


def test_an_evaluation_finished_on_a_replica_but_not_yet_taken_does_not_skip_the_next():
    """The evaluation of step 10 finished while step 20 trained: step 20's evaluation records it and starts its
    own, instead of skipping as if it still ran."""
    from asyncrl.learner.replica_eval import BackgroundEvaluations, ReplicaEvaluation

    class Evaluator:
        def evaluate(self):
            return ReplicaEvaluation(0.5, "replica-1", (10, 10))

    loop, events, _ = loop_with(None)
    loop.replica_evals = BackgroundEvaluations(Evaluator())
    loop.progress.step = loop.progress.version = 10
    loop.periodic_eval()
    loop.replica_evals._runs._job.result(timeout=10)  # over, its outcome not taken yet
    loop.progress.step = loop.progress.version = 20
    loop.periodic_eval()
    loop.take_replica_eval(wait=True)
    assert events.of_kind("eval_skipped") == []
    assert [e["step"] for e in events.of_kind("eval")] == [10, 20]


def test_a_resumed_learner_acknowledges_what_its_checkpoint_holds_before_taking_back_pending_entries(tmp_path):
    """The previous learner died between its checkpoint's rename and the acknowledgement: the entries the
    checkpoint names are acknowledged, not trained again, and their groups count as trained; the rest of what
    it had read comes back first."""
    import json

    from asyncrl.learner.checkpoint_index import COVERED, CheckpointMeta
    from asyncrl.v1 import controller_pb2

    heartbeat = controller_pb2.LearnerHeartbeatResponse(current_version=4)
    loop, events, _metrics = prefetching_loop(controller_stub=SimpleNamespace(
        LearnerHeartbeat=lambda request, timeout: heartbeat))
    for i in range(5):
        loop.buffer.put(group(f"g{i}"))
    delivered = [e.entry_id for e in loop.buffer.get(5, timeout_s=1.0)]
    (tmp_path / COVERED).write_text(json.dumps({"entry_ids": delivered[:3], "group_ids": ["g0", "g1", "g2"]}))
    loop.resume(CheckpointMeta(step=4, version=4, data_position=5, saved_unix_s=0.0), str(tmp_path))
    loop.config.total_steps = 4  # nothing left to train: the start alone is under test
    loop.evaluate = lambda: {"accuracy": 0.5}
    loop.publisher = SimpleNamespace(finish=lambda: None)  # no push in flight
    loop.run(stop=SimpleNamespace(is_set=lambda: False))
    assert events.of_kind("covered_acked")[0]["acked"] == 3
    assert events.of_kind("recovered_pending")[0]["entries"] == delivered[3:]
    assert sorted(events.of_kind("final_buffer")[0]["entry_ids"]) == sorted(delivered[3:])
    # A second copy of a group the checkpoint trained (a buffer write retried after its reply was lost) is
    # refused by the resumed learner as by the one that trained it.
    duplicate = loop.buffer.put(group("g1"))
    [entry] = loop.buffer.get(1, timeout_s=1.0)
    assert entry.entry_id == duplicate and not loop.intake.admit(entry)
    assert "already trained" in loop.buffer.dead_letters()[-1].reason


class AwaitingController:
    """The controller's side of `AwaitLeases` for a learner that holds: the leases of the asked version are out
    for `outstanding_calls` answers, then all ended."""

    def __init__(self, outstanding_calls: int):
        self.requests, self.outstanding_calls = [], outstanding_calls

    def AwaitLeases(self, request, timeout):
        from asyncrl.v1 import controller_pb2

        self.requests.append((request.version, request.wait_s))
        outstanding = int(len(self.requests) <= self.outstanding_calls)
        return controller_pb2.AwaitLeasesResponse(outstanding=outstanding, oldest_version=request.version)


@pytest.mark.parametrize("policy", ["drop", "hold", "train"])
def test_a_group_older_than_eta_at_the_version_that_would_train_it_is_dropped_and_its_quota_returned(policy):
    """η at read (`learner.stale_groups`): at learner version 3 with η = 2, a group whose oldest token is from
    version 0 (staleness 3) is dead-lettered with its reason, its 2 trajectories' quota returned and its prompt
    (the group's sample_index: the prompt its samples were for) queued again before the dead letter; one from
    version 1 (staleness 2, its last admissible step) is trained. `hold` first waits, heartbeating, until the
    leases of version 1 (stale at the next step) have ended, then drops what is stale all the same. `train`
    counts it and trains it."""
    controller = AwaitingController(outstanding_calls=2)
    loop, events, metrics = prefetching_loop(eta=2, stale_groups=policy, controller_stub=controller)
    returned = []
    loop.intake._return_quota = lambda entry_id, n, reason, prompt, lease_id: returned.append(
        (entry_id, n, reason, len(loop.buffer.dead_letters()), prompt, lease_id))
    late = group("stale", version=0, prompt_index=0)
    late.sample_index, late.lease_id = 7, "lease-1"
    stale = loop.buffer.put(late)
    edge = loop.buffer.put(group("edge", version=1, prompt_index=1))
    fresh = loop.buffer.put(group("fresh", version=3, prompt_index=2))
    heartbeats = []
    loop.intake._heartbeat = lambda: heartbeats.append(1)  # a batch short of the dropped group reads on
    if loop.intake.hold is not None:
        loop.intake.hold._heartbeat = loop.intake._heartbeat
    entries = held(loop.intake.collect([]))
    assert metrics.stale_groups._value.get() == 1
    if policy == "hold":
        assert controller.requests == [(1, 2.0)] * 3 and len(heartbeats) == 2 + 1  # + 1: the short batch
        assert metrics.stale_hold_seconds._value.get() > 0
    else:
        assert controller.requests == [] and metrics.stale_hold_seconds._value.get() == 0
    if policy == "train":
        assert [e.entry_id for e in entries] == [stale, edge] and returned == []
        return
    assert [e.entry_id for e in entries] == [edge, fresh]
    reason = "staleness: its oldest token is from version 0, 3 behind the learner's 3 (controller.eta 2"
    assert returned == [(stale, 2, returned[0][2], 0, 7, "lease-1")]  # before the dead letter
    assert returned[0][2].startswith(reason) and f"learner.stale_groups: {policy}" in returned[0][2]
    (dead,) = loop.buffer.dead_letters()
    assert dead.entry_id == stale and dead.reason.startswith(reason)
    (rejected,) = events.of_kind("group_rejected")
    assert rejected["group_id"] == "stale" and rejected["reason"].startswith(reason)


def hard_group(name: str, version: int = 3, prompt_index: int = 0):
    """A hard prompt's larger group: 4 trajectories (hard_group_size, twice G = 2), sampled again."""
    g = group(name, version, prompt_index=prompt_index)
    for j in (2, 3):
        t = g.trajectories.add()
        t.CopyFrom(g.trajectories[0])
        t.trajectory_id = f"{name}/{j}"
    g.sample_index = 1
    return g


@pytest.mark.parametrize("oldest_first", [False, True])
def test_batches_hold_exactly_b_trajectories_when_hard_prompts_come_in_larger_groups(oldest_first):
    """B = 4, G = 2, hard groups of 4 (`controller.difficulty.hard_group_size`): a group of 2 and a hard group
    cannot share a batch (6 trajectories). Holding both, the learner trains the hard group, a whole batch, at
    once (it never waits while it holds one); the group of 2 waits for the next, which the group after it
    completes."""
    from asyncrl.core.buffer.trajectory_checks import TrajectoryLimits

    loop, _, _ = prefetching_loop(oldest_first)
    loop.intake.limits = TrajectoryLimits(20, 16, 5, 2, 10.0, hard_group_size=4)
    loop.buffer.put(group("a", prompt_index=1))
    loop.buffer.put(hard_group("hard", prompt_index=2))
    loop.buffer.put(group("b", prompt_index=3))
    batch, rest = take_batch(loop, [])
    assert [e.group.group_id for e in batch] == ["hard"] and len(loop.intake.batch_of(batch)) == 4
    batch, rest = take_batch(loop, rest)
    assert [e.group.group_id for e in batch] == ["a", "b"] and rest == []
    assert len(loop.intake.batch_of(batch)) == 4
