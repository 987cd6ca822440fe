"""Teacher annotation on the producer side: a replica's annotator fills every trajectory's logp_teacher from
a real Teacher server (the same values the learner would get), and a teacher that is gone leaves the group
untouched and counted, never raised."""

from __future__ import annotations

import torch

from asyncrl.core.buffer.trajectory_checks import TrajectoryLimits, check_trajectory_group
from asyncrl.core.engines.base import Generation
from asyncrl.core.model.modeling import load_causal_lm, sequence_logprobs
from asyncrl.rollout.annotation import TeacherAnnotator
from asyncrl.rollout.rollout_metrics import RolloutMetrics
from asyncrl.rollout.trajectories import build_group
from asyncrl.services import teacher_service
from asyncrl.v1 import teacher_pb2_grpc
from tests.integration.test_services import local_config, started  # noqa: F401 - the fixture

PROMPT = [1, 5, 6, 14]
RESPONSES = [[7, 8, 9], [10, 11], [12]]


def group():
    gens = [Generation(token_ids=r, logp_behav=[-1.0] * len(r), weight_version=[0] * len(r), finished=True)
            for r in RESPONSES]
    return build_group(group_id="g", prompt_index=0, prompt_token_ids=PROMPT, generations=gens,
                       rewards=[1.0, 0.0, 0.0], replica_id="r", lease_id="l", metadata={})


def test_the_annotator_fills_logp_teacher_from_a_real_teacher(tiny_model_dir, started):  # noqa: F811
    cfg = local_config(tiny_model_dir)
    _server, channel = started(teacher_service.create_server(cfg))
    metrics = RolloutMetrics("r")
    annotator = TeacherAnnotator(teacher_pb2_grpc.TeacherStub(channel), cfg.teacher, metrics)
    g = group()
    assert annotator.annotate([g])
    teacher = load_causal_lm(tiny_model_dir.teacher).eval()
    expected, _ = sequence_logprobs(teacher, [PROMPT + r for r in RESPONSES], [len(PROMPT)] * 3, None, pad_id=0)
    for row, traj in enumerate(g.trajectories):
        got = torch.tensor(list(traj.logp_teacher))
        assert len(got) == len(RESPONSES[row])
        assert torch.allclose(got, expected[row, : len(got)], atol=1e-4)
    limits = TrajectoryLimits(vocab_size=64, max_sequence_tokens=64, max_response_tokens=8, group_size=3,
                              max_abs_reward=10.0)
    check_trajectory_group(g, limits)  # the annotated group passes the buffer's checks
    assert metrics.teacher_seconds._sum.get() > 0


def test_a_teacher_that_is_gone_leaves_the_group_unannotated(tiny_model_dir, started):  # noqa: F811
    cfg = local_config(tiny_model_dir)
    server, channel = started(teacher_service.create_server(cfg))
    server.stop(0).wait()
    teacher_cfg = cfg.teacher.model_copy(update={"score_attempts": 2, "retry_backoff_s": 0.01, "score_timeout_s": 2})
    metrics = RolloutMetrics("r")
    g = group()
    assert not TeacherAnnotator(teacher_pb2_grpc.TeacherStub(channel), teacher_cfg, metrics).annotate([g])
    assert all(len(t.logp_teacher) == 0 for t in g.trajectories)
    assert metrics.teacher_failures._value.get() == 1


def test_a_replica_waits_for_a_teacher_that_is_still_starting_before_it_takes_leases(tiny_model_dir):
    """`wait_ready` returns once the teacher answers (started 0.5 s after the wait began), and the first
    annotation then succeeds; a teacher that never comes is given up after teacher.score_timeout_s; a replica
    stopping meanwhile does not wait on."""
    import threading
    import time

    from asyncrl.core.wire.grpc_util import channel as grpc_channel
    from asyncrl.tools.processes import free_port
    from tests.conftest import TEST_AUTH

    cfg = local_config(tiny_model_dir)
    cfg.teacher.port = free_port()
    teacher_channel = grpc_channel(cfg.teacher.address, TEST_AUTH, patient=True)
    annotator = TeacherAnnotator(teacher_pb2_grpc.TeacherStub(teacher_channel), cfg.teacher, RolloutMetrics("r"),
                                 teacher_channel)
    servers = []

    def start_teacher():
        server, _port = teacher_service.create_server(cfg)
        server.start()
        servers.append(server)

    threading.Timer(0.5, start_teacher).start()
    try:
        started_at = time.monotonic()
        assert annotator.wait_ready(threading.Event())
        assert time.monotonic() - started_at >= 0.4
        assert annotator.annotate([group()])
    finally:
        time.sleep(0.3)  # the readiness watch lets go of the channel before it closes
        teacher_channel.close()
        for server in servers:
            server.stop(0).wait()

    gone = cfg.teacher.model_copy(update={"port": free_port(), "score_timeout_s": 1.0})
    never = grpc_channel(gone.address, TEST_AUTH, patient=True)
    waiting = TeacherAnnotator(teacher_pb2_grpc.TeacherStub(never), gone, RolloutMetrics("r"), never)
    started_at = time.monotonic()
    assert not waiting.wait_ready(threading.Event())
    assert 0.9 <= time.monotonic() - started_at < 3
    stop = threading.Event()
    stop.set()
    started_at = time.monotonic()
    assert not waiting.wait_ready(stop) and time.monotonic() - started_at < 0.5
    time.sleep(0.3)
    never.close()
