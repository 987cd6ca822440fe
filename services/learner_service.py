"""Learner service: the training loop plus a small gRPC status edge and /metrics."""

from __future__ import annotations

import functools
import json
import logging
import signal
import threading
from pathlib import Path

import torch
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from asyncrl.core.buffer import make_buffer
from asyncrl.core.engines.torch_decode import generate_with_model
from asyncrl.core.events import EventLog
from asyncrl.core.grpc_util import build_server, wait_for_channel
from asyncrl.core.metrics import serve_metrics
from asyncrl.core.modeling import eos_token_ids, load_causal_lm, pad_token_id
from asyncrl.core.sampling import SamplingParams
from asyncrl.core.tasks import get_task
from asyncrl.core.tasks.evaluate import greedy_accuracy
from asyncrl.learner.loop import LearnerLoop, LearnerProgress
from asyncrl.learner.publisher import WeightPublisher
from asyncrl.learner.trainer import Trainer
from asyncrl.v1 import controller_pb2_grpc, learner_pb2, learner_pb2_grpc, teacher_pb2_grpc

log = logging.getLogger("asyncrl.learner")
SERVICE = "asyncrl.v1.Learner"


class LearnerMetrics:
    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.step = Gauge("asyncrl_learner_step", "Learner steps done", registry=r)
        self.version = Gauge("asyncrl_learner_version", "Policy version published", registry=r)
        self.consumed = Counter("asyncrl_learner_trajectories_consumed", "Trajectories trained on", registry=r)
        self.reward = Gauge("asyncrl_learner_reward_mean", "Mean reward of the last batch", registry=r)
        self.eval_accuracy = Gauge("asyncrl_learner_eval_accuracy", "Greedy held-out accuracy", registry=r)
        self.staleness = Gauge("asyncrl_learner_staleness_mean", "Mean staleness of the last batch", registry=r)
        self.step_seconds = Histogram("asyncrl_learner_step_seconds", "Learner step time", registry=r)
        self.push_seconds = Histogram("asyncrl_learner_push_seconds", "Weight push time (begin..commit)", registry=r)
        self.kl = Gauge("asyncrl_learner_kl_behav_prox", "KL(behav||prox), k3 estimator, last step", registry=r)

    def observe_step(self, metrics: dict, push) -> None:
        self.step.inc()
        self.version.set(push.version)
        self.consumed.inc(metrics["batch/sequences"])
        self.reward.set(metrics["reward/mean"])
        self.staleness.set(metrics["staleness/mean"])
        self.step_seconds.observe(metrics["time/step_s"])
        self.push_seconds.observe(push.total_s)
        kl = metrics.get("rc/kl_k3")
        if kl is not None:
            self.kl.set(kl)


class LearnerServicer(learner_pb2_grpc.LearnerServicer):
    def __init__(self, progress: LearnerProgress):
        self.progress = progress

    def GetStatus(self, request, context):
        p = self.progress
        return learner_pb2.LearnerStatus(step=p.step, version=p.version, consumed=p.consumed,
                                         last_reward_mean=p.last_reward_mean,
                                         last_eval_accuracy=p.last_eval_accuracy, last_step_s=p.last_step_s)


def evaluate_greedy(model, task, max_new_tokens: int) -> float:
    """Greedy accuracy of the learner's own model on the task's held-out prompts (generate_with_model puts the
    model in eval mode and back)."""
    generate = functools.partial(generate_with_model, model, eos_ids=eos_token_ids(model), pad_id=pad_token_id(model))
    with torch.no_grad():
        return greedy_accuracy(generate, task, max_new_tokens=max_new_tokens)


def create_server(config, progress: LearnerProgress | None = None):
    """The Learner status gRPC server (not started); `server.servicer.progress` is live progress."""
    servicer = LearnerServicer(progress or LearnerProgress())
    server, port, _health = build_server(
        config.learner.host, config.learner.port,
        [lambda s: learner_pb2_grpc.add_LearnerServicer_to_server(servicer, s)], [SERVICE],
    )
    server.servicer = servicer
    return server, port


def serve(config) -> LearnerProgress:
    """Train for learner.total_steps, then stop. SIGTERM/SIGINT stops after the current step."""
    if config.learner.threads:
        torch.set_num_threads(config.learner.threads)
    torch.manual_seed(config.seed)
    model = load_causal_lm(config.model.path, config.model.dtype, config.learner.device)
    sampling = SamplingParams.from_config(config.sampling)
    controller = controller_pb2_grpc.ControllerStub(wait_for_channel(config.controller.address, 120))
    teacher = None
    if config.teacher.enabled and config.teacher.annotate:
        teacher = teacher_pb2_grpc.TeacherStub(wait_for_channel(config.teacher.address, 300))
    task = get_task(config.task)
    metrics = LearnerMetrics()
    loop = LearnerLoop(
        config=config,
        trainer=Trainer(model, config.learner, sampling, pad_token_id(model)),
        buffer=make_buffer(config.buffer, consumer="learner-0"),
        controller_stub=controller,
        publisher=WeightPublisher(controller, model, config.learner.weight_transport,
                                  config.controller.push_timeout_s),
        evaluate=functools.partial(evaluate_greedy, model, task, config.sampling.max_new_tokens),
        events=EventLog(config.run_dir, "learner"),
        metrics=metrics,
        teacher_stub=teacher,
    )
    server, port = create_server(config, loop.progress)
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
    summary = {"step": progress.step, "version": progress.version, "consumed": progress.consumed,
               "final_eval_accuracy": progress.last_eval_accuracy}
    Path(config.run_dir, "learner-summary.json").write_text(json.dumps(summary, indent=2))
    return progress
