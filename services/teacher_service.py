"""Teacher service: the gRPC edge of `asyncrl.teacher.scorer.TeacherScorer`. `Score` returns log pi_teacher of
the given tokens, one scalar per response position."""

from __future__ import annotations

import torch
from transformers import AutoConfig

from asyncrl.core.checks.validation import InvalidArgument
from asyncrl.core.config.preflight import check_checkpoint
from asyncrl.core.engines.factory import make_engine
from asyncrl.core.runtime.announce import announce
from asyncrl.core.runtime.metrics import serve_metrics
from asyncrl.core.wire.auth import resolve_auth
from asyncrl.core.wire.grpc_util import abort_invalid, build_server, wait_until_stopped
from asyncrl.core.wire.ports import listening
from asyncrl.teacher.scorer import TeacherScorer
from asyncrl.v1 import teacher_pb2, teacher_pb2_grpc

SERVICE = "asyncrl.v1.Teacher"


class TeacherServicer(teacher_pb2_grpc.TeacherServicer):
    def __init__(self, scorer: TeacherScorer):
        self.scorer = scorer

    def Score(self, request, context):
        try:
            scores = self.scorer.score([list(s.token_ids) for s in request.sequences],
                                       [s.response_start for s in request.sequences])  # fmt: skip
        except InvalidArgument as err:
            abort_invalid(context, err)
        return teacher_pb2.ScoreResponse(sequences=[teacher_pb2.ScoredSequence(logp_teacher=s) for s in scores])


def create_server(config, engine=None):
    """The Teacher gRPC server (not started); `server.servicer.scorer` is the TeacherScorer."""
    tcfg = config.teacher
    check_checkpoint(tcfg.model_path, "teacher.model_path")
    engine = engine or make_engine(tcfg.engine, tcfg.model_path, config.model.dtype, seed=config.seed,
                                   determinism=config.model.determinism)
    model_config = AutoConfig.from_pretrained(tcfg.model_path)
    servicer = TeacherServicer(TeacherScorer(engine, model_config.vocab_size, model_config.max_position_embeddings,
                                             max_sequences=config.learner.batch_size))
    with listening("teacher.port", tcfg.host, tcfg.port):
        server, port, _health = build_server(
            tcfg.host, tcfg.port, [lambda s: teacher_pb2_grpc.add_TeacherServicer_to_server(servicer, s)],
            [SERVICE], resolve_auth(config.security), registry=servicer.scorer.metrics.registry,
        )
    server.servicer = servicer
    return server, port


def serve(config) -> None:
    if config.teacher.engine.threads:
        torch.set_num_threads(config.teacher.engine.threads)
    server, port = create_server(config)
    server.start()
    scorer = server.servicer.scorer
    with listening("teacher.metrics_port", config.teacher.host, config.teacher.metrics_port):
        metrics_port = serve_metrics(config.teacher.host, config.teacher.metrics_port, scorer.metrics.registry)
    announce(f"asyncrl-teacher listening grpc={config.teacher.host}:{port} "
             f"metrics={config.teacher.host}:{metrics_port}")  # fmt: skip
    wait_until_stopped(server, on_stop=scorer.close)
