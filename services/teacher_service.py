"""Teacher service: `Score` returns log pi_teacher of the given tokens, one scalar per response position."""

from __future__ import annotations

import logging
import time

import torch
from asyncrl.services.validation import check_token_ids
from prometheus_client import CollectorRegistry, Counter, Histogram
from transformers import AutoConfig

from asyncrl.core.engines.factory import make_engine
from asyncrl.core.grpc_util import InvalidArgument, abort_invalid, build_server, require, wait_until_stopped
from asyncrl.core.metrics import serve_metrics
from asyncrl.v1 import teacher_pb2, teacher_pb2_grpc

log = logging.getLogger("asyncrl.teacher")
SERVICE = "asyncrl.v1.Teacher"
MAX_SEQUENCES = 4096


class TeacherServicer(teacher_pb2_grpc.TeacherServicer):
    def __init__(self, engine, vocab_size: int):
        self.engine = engine
        self.vocab_size = vocab_size
        self.registry = CollectorRegistry()
        self.sequences = Counter("asyncrl_teacher_sequences_scored", "Sequences scored", registry=self.registry)
        self.tokens = Counter("asyncrl_teacher_tokens_scored", "Response tokens scored", registry=self.registry)
        self.seconds = Histogram("asyncrl_teacher_score_seconds", "Score RPC time", registry=self.registry)

    def Score(self, request, context):
        try:
            require(len(request.sequences) > 0, "sequences", "must not be empty")
            require(len(request.sequences) <= MAX_SEQUENCES, "sequences",
                    f"at most {MAX_SEQUENCES} per call, got {len(request.sequences)}")
            for i, seq in enumerate(request.sequences):
                check_token_ids(seq.token_ids, self.vocab_size, f"sequences[{i}].token_ids")
                require(1 <= seq.response_start <= len(seq.token_ids), f"sequences[{i}].response_start",
                        f"must be in [1, {len(seq.token_ids)}], got {seq.response_start}")
        except InvalidArgument as err:
            abort_invalid(context, err)
        start = time.perf_counter()
        scores = self.engine.score([list(s.token_ids) for s in request.sequences],
                                   [s.response_start for s in request.sequences])
        self.seconds.observe(time.perf_counter() - start)
        self.sequences.inc(len(scores))
        self.tokens.inc(sum(len(s) for s in scores))
        return teacher_pb2.ScoreResponse(sequences=[teacher_pb2.ScoredSequence(logp_teacher=s) for s in scores])


def create_server(config, engine=None):
    """The Teacher gRPC server (not started); `server.servicer` is the TeacherServicer."""
    tcfg = config.teacher
    engine = engine or make_engine(tcfg.engine, tcfg.model_path, config.model.dtype, seed=config.seed)
    servicer = TeacherServicer(engine, AutoConfig.from_pretrained(tcfg.model_path).vocab_size)
    server, port, _health = build_server(
        tcfg.host, tcfg.port, [lambda s: teacher_pb2_grpc.add_TeacherServicer_to_server(servicer, s)], [SERVICE]
    )
    server.servicer = servicer
    return server, port


def serve(config) -> None:
    if config.teacher.engine.threads:
        torch.set_num_threads(config.teacher.engine.threads)
    server, port = create_server(config)
    server.start()
    metrics_port = serve_metrics(config.teacher.host, config.teacher.metrics_port, server.servicer.registry)
    print(f"asyncrl-teacher listening grpc={config.teacher.host}:{port} "
          f"metrics={config.teacher.host}:{metrics_port}", flush=True)
    wait_until_stopped(server, on_stop=server.servicer.engine.close)
