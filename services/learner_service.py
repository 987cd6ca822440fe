"""Learner service: builds the learner's loop from the config (`asyncrl.learner`), runs it, and serves a small
gRPC status edge and /metrics beside it."""

from __future__ import annotations

import functools
import json
import logging
import signal
import threading
from pathlib import Path

import torch

from asyncrl.core.auth import resolve_auth
from asyncrl.core.buffer import make_buffer
from asyncrl.core.config import dump_config
from asyncrl.core.events import EventLog
from asyncrl.core.grpc_util import build_server, wait_for_channel
from asyncrl.core.metrics import serve_metrics
from asyncrl.core.modeling import load_causal_lm, pad_token_id
from asyncrl.core.preflight import check_checkpoint
from asyncrl.core.sampling import SamplingParams
from asyncrl.core.tasks import task_for_run
from asyncrl.core.trajectory_checks import checkpoint_limits
from asyncrl.learner.checkpoint import Checkpointer, load_checkpoint, resume_path
from asyncrl.learner.held_out import evaluate_held_out
from asyncrl.learner.learner_metrics import LearnerMetrics
from asyncrl.learner.loop import LearnerLoop, LearnerProgress
from asyncrl.learner.publisher import WeightPublisher
from asyncrl.learner.tracking import MetricSinks
from asyncrl.learner.trainer import Trainer
from asyncrl.v1 import controller_pb2_grpc, learner_pb2, learner_pb2_grpc, teacher_pb2_grpc

log = logging.getLogger("asyncrl.learner")
SERVICE = "asyncrl.v1.Learner"


class LearnerServicer(learner_pb2_grpc.LearnerServicer):
    def __init__(self, progress: LearnerProgress):
        self.progress = progress

    def GetStatus(self, request, context):
        p = self.progress
        return learner_pb2.LearnerStatus(step=p.step, version=p.version, consumed=p.consumed,
                                         last_reward_mean=p.last_reward_mean,
                                         last_eval_accuracy=p.last_eval_accuracy, last_step_s=p.last_step_s)


def create_server(config, progress: LearnerProgress | None = None, registry=None):
    """The Learner status gRPC server (not started); `server.servicer.progress` is live progress; its RPCs are
    counted in `registry` (the learner's metrics) when given."""
    servicer = LearnerServicer(progress or LearnerProgress())
    server, port, _health = build_server(
        config.learner.host, config.learner.port,
        [lambda s: learner_pb2_grpc.add_LearnerServicer_to_server(servicer, s)], [SERVICE],
        resolve_auth(config.security), registry=registry,
    )
    server.servicer = servicer
    return server, port


def serve(config) -> LearnerProgress:
    """Train for learner.total_steps, then stop. SIGTERM/SIGINT stops after the current step."""
    if config.learner.threads:
        torch.set_num_threads(config.learner.threads)
    torch.manual_seed(config.seed)
    check_checkpoint(config.model.path, "model.path")
    # What this learner runs with, every default filled in (`up` writes the run's config too; in a container
    # this is the run directory's record of the config).
    Path(config.run_dir).mkdir(parents=True, exist_ok=True)
    dump_config(config, Path(config.run_dir) / "config.learner.resolved.yaml")
    model = load_causal_lm(config.model.path, config.model.dtype, config.learner.device)
    sampling = SamplingParams.from_config(config.sampling)
    auth = resolve_auth(config.security)
    controller = controller_pb2_grpc.ControllerStub(wait_for_channel(config.controller.address, 120, auth, patient=True))
    teacher = None
    if config.teacher.enabled and config.teacher.annotate:
        teacher = teacher_pb2_grpc.TeacherStub(wait_for_channel(config.teacher.address, 300, auth))
    task = task_for_run(config)
    metrics = LearnerMetrics()
    loop = LearnerLoop(
        config=config,
        trainer=Trainer(model, config.learner, sampling, pad_token_id(model)),
        buffer=make_buffer(config.buffer, consumer="learner-0"),
        controller_stub=controller,
        publisher=WeightPublisher(controller, model, config.learner.weight_transport,
                                  config.controller.push_timeout_s),
        evaluate=functools.partial(evaluate_held_out, model, task, sampling, config.learner.eval_pass_k,
                                   config.learner.eval_samples),
        events=EventLog(config.run_dir, "learner"),
        metrics=metrics,
        limits=checkpoint_limits(config.model.path, config),
        teacher_stub=teacher,
        checkpointer=Checkpointer(config, task.tokenizer.hf),
        sinks=MetricSinks(config),
    )
    path = resume_path(config)
    if path:
        loop.resume(load_checkpoint(path, model, loop.trainer.optimizer), path)
    server, port = create_server(config, loop.progress, metrics.registry)
    server.start()
    metrics_port = serve_metrics(config.learner.host, config.learner.metrics_port, metrics.registry)
    print(f"asyncrl-learner listening grpc={config.learner.host}:{port} "
          f"metrics={config.learner.host}:{metrics_port}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        progress = loop.run(stop)
    finally:
        server.stop(2)
        loop.sinks.close()
    summary = {"step": progress.step, "version": progress.version, "consumed": progress.consumed,
               "final_eval_accuracy": progress.last_eval_accuracy}
    Path(config.run_dir, "learner-summary.json").write_text(json.dumps(summary, indent=2))
    return progress
