"""The learner loop's parts without a network: the teacher annotation under faults (`LearnerLoop.annotate`:
retried with backoff, then the batch goes on without teacher log-probs, recorded, never an exception), the
prefetch of the next batch, and the order of background pushes and checkpoints."""

import grpc
import pytest

from asyncrl.controller.event_records import MemoryEvents
from asyncrl.core.config import AsyncRLConfig
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
    loop = LearnerLoop(config=config, trainer=None, buffer=None, controller_stub=None, publisher=None,
                       evaluate=None, events=events, metrics=metrics, limits=None, teacher_stub=teacher)
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


def test_prefetch_reads_the_next_entries_and_leaves_them_pending():
    """`learner.prefetch`: the next batch's entries are read on a thread while a batch trains; read and not yet
    trained they are pending (a restarted learner takes them back), and a failed read is only a warning."""
    from asyncrl.core.buffer.memory import MemoryBuffer
    from asyncrl.v1 import trajectory_pb2

    loop, _, _ = loop_with(None)
    buffer = loop.buffer = MemoryBuffer()
    ids = [buffer.put(trajectory_pb2.TrajectoryGroup(group_id=f"g{i}")) for i in range(3)]
    loop._start_prefetch(2)
    got = loop._take_prefetched()
    assert [e.entry_id for e in got] == ids[:2]
    assert [e.entry_id for e in buffer.all_pending()] == ids[:2]
    assert loop._take_prefetched() == []  # nothing in flight

    class Broken:
        def get(self, groups, timeout_s):
            raise ConnectionError("redis went away")

    loop.buffer = Broken()
    loop._start_prefetch(1)
    assert loop._take_prefetched() == []


class Publisher:
    """Records the push calls; a background push 'completes' when finished."""

    def __init__(self, calls):
        self.calls, self._in_flight = calls, None

    def _result(self, version, background):
        from asyncrl.learner.publisher import PushResult

        return PushResult(version, True, 2, ["a", "b"], [], 100, 0.001, 0.002, 1, False, background)

    def start(self, version):
        assert self._in_flight is None, "one push at a time"
        self.calls.append(("start", version))
        self._in_flight = version

    def finish(self):
        version, self._in_flight = self._in_flight, None
        if version is None:
            return None
        self.calls.append(("finish", version))
        return self._result(version, True)

    def push(self, version):
        assert self._in_flight is None, "one push at a time"
        self.calls.append(("push", version))
        return self._result(version, False)


def test_background_pushes_are_finished_before_the_next_push_and_before_a_checkpoint():
    """`learner.push_in_background`: push i+1 starts only after push i is finished and recorded; a checkpoint
    waits for the push of its version (a learner restarted from it must find that version committed)."""
    from asyncrl.core.buffer.memory import MemoryBuffer

    calls = []

    class Checkpointer:
        def save(self, model, optimizer, meta):
            calls.append(("save", meta.version))
            return "ckpt"

    loop, events, metrics = loop_with(None)
    loop.publisher, loop.checkpointer, loop.buffer = Publisher(calls), Checkpointer(), MemoryBuffer()
    loop.trainer = type("T", (), {"model": None, "optimizer": None})()
    loop.publish(1)
    loop.publish(2)
    loop.progress.step = loop.progress.version = 2
    loop.save()
    assert calls == [("start", 1), ("finish", 1), ("start", 2), ("finish", 2), ("save", 2)]
    assert [e["version"] for e in events.of_kind("push")] == [1, 2]
    assert all(e["background"] for e in events.of_kind("push"))
    assert metrics.push_seconds._sum.get() > 0

    loop.config.learner.push_in_background = False
    calls.clear()
    loop.publish(3)
    assert calls == [("push", 3)] and events.of_kind("push")[-1]["background"] is False


def test_status_reports_go_in_the_background_and_their_failures_surface_at_the_next_step():
    """After a step the heartbeat (and the buffer gauges) go on the status thread; the controller's request
    for a resync is taken once by the loop; a report that failed raises at the next step; the final report is
    best effort."""
    import threading

    from asyncrl.learner.loop import LearnerProgress
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
    reporter = StatusReporter(controller, total_steps=10, observe_gauges=lambda: gauges.append(1))
    progress = LearnerProgress(step=3, version=3, consumed=192, last_reward_mean=0.5)
    controller.sync = True
    reporter.after_step(progress)
    assert controller.sent.wait(10)
    reporter._sent.result()
    assert controller.requests[-1].step == 3 and controller.requests[-1].HasField("reward_mean") and gauges
    assert reporter.take_sync_request() and not reporter.take_sync_request()

    controller.fail = Failure(grpc.StatusCode.UNAVAILABLE)
    reporter.after_step(LearnerProgress(step=4, version=4))
    assert isinstance(reporter._sent.exception(timeout=10), Failure)
    with pytest.raises(Failure):
        reporter.after_step(LearnerProgress(step=5, version=5))
    reporter.finish(LearnerProgress(step=5, version=5))  # logs, does not raise
    assert controller.requests[-1].step == 5
