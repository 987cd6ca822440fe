"""Teacher annotation on the producer side: a replica's annotator fills every trajectory's logp_teacher from
a real Teacher server (the same values the learner would get), and a teacher that is gone leaves the group
untouched and counted, never raised."""

from __future__ import annotations

import torch

from asyncrl.core.engines.base import Generation
from asyncrl.core.modeling import load_causal_lm, sequence_logprobs
from asyncrl.core.trajectory_checks import TrajectoryLimits, check_trajectory_group
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
