"""Learner service: builds the learner's loop from the config (`asyncrl.learner`), runs it, and serves a small
gRPC status edge and /metrics beside it."""

from __future__ import annotations

import functools
import json
import logging
import signal
import threading
from pathlib import Path

import grpc
import torch

from asyncrl.core.auth import MAX_CHALLENGE, resolve_auth
from asyncrl.core.buffer import make_buffer
from asyncrl.core.config import dump_config
from asyncrl.core.events import EventLog
from asyncrl.core.grpc_util import build_server, wait_for_channel
from asyncrl.core.grpc_util import channel as grpc_channel
from asyncrl.core.metrics import serve_metrics
from asyncrl.core.modeling import load_causal_lm, pad_token_id
from asyncrl.core.ports import listening
from asyncrl.core.preflight import check_checkpoint
from asyncrl.core.sampling import SamplingParams
from asyncrl.core.tasks import task_for_run
from asyncrl.core.trajectory_checks import checkpoint_limits
from asyncrl.learner.checkpoint import Checkpointer, load_checkpoint, resume_path
from asyncrl.learner.checkpoint_saver import FollowerSaves
from asyncrl.learner.held_out import evaluate_held_out
from asyncrl.learner.learner_metrics import LearnerMetrics
from asyncrl.learner.loop import LearnerLoop, LearnerProgress
from asyncrl.learner.replica_eval import BackgroundEvaluations, ReplicaEvaluator
from asyncrl.learner.seat import SeatedController
from asyncrl.learner.sharding import STOP, Mirror, follow, init_ranks, leave, rank_device, shard
from asyncrl.learner.tracking import MetricSinks
from asyncrl.learner.trainer import Trainer
from asyncrl.push.sender import WeightPublisher
from asyncrl.v1 import controller_pb2_grpc, learner_pb2, learner_pb2_grpc, teacher_pb2_grpc

log = logging.getLogger("asyncrl.learner")
SERVICE = "asyncrl.v1.Learner"


class LearnerServicer(learner_pb2_grpc.LearnerServicer):
    def __init__(self, progress: LearnerProgress, seat: SeatedController | None = None):
        self.progress = progress
        self.seat = seat
        """Answers the controller's liveness challenges (`learner.seat`); None: never answers one."""

    def GetStatus(self, request, context):
        if len(request.challenge) > MAX_CHALLENGE:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"challenge: at most {MAX_CHALLENGE} bytes, got {len(request.challenge)}")
        p = self.progress
        return learner_pb2.LearnerStatus(step=p.step, version=p.version, consumed=p.consumed,
                                         last_reward_mean=p.last_reward_mean,
                                         last_eval_accuracy=p.last_eval_accuracy, last_step_s=p.last_step_s,
                                         challenge_mac=self.seat.answer(request.challenge) if self.seat else b"")


def _follow(trainer, ranks, mirror) -> LearnerProgress:
    """A rank other than 0: the leader's steps and saves until it says stop. Signals are the leader's to act
    on (it finishes its step, then stops every rank); a follower leaving mid-collective would hang it."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    follow(trainer, ranks, mirror, FollowerSaves(trainer.model, trainer.optimizer, ranks))
    leave(ranks)
    return LearnerProgress()


def _replica_evals(config, controller, task, sampling, auth) -> BackgroundEvaluations | None:
    """Evaluations on a rollout replica (`learner.eval_by: replica`), else None (the learner evaluates)."""
    if config.learner.eval_by != "replica":
        return None
    evaluator = ReplicaEvaluator(controller, functools.partial(grpc_channel, auth=auth), task, sampling.max_new_tokens,
                                 config.rollout.engine.max_batch_size, config.learner.eval_timeout_s)
    return BackgroundEvaluations(evaluator)


def create_server(config, progress: LearnerProgress | None = None, registry=None,
                  seat: SeatedController | None = None):
    """The Learner status gRPC server (not started); `server.servicer.progress` is live progress; its RPCs are
    counted in `registry` (the learner's metrics) when given; `seat` answers the controller's liveness
    challenges."""
    servicer = LearnerServicer(progress or LearnerProgress(), seat)
    with listening("learner.port", config.learner.host, config.learner.port):
        server, port, _health = build_server(
            config.learner.host, config.learner.port,
            [lambda s: learner_pb2_grpc.add_LearnerServicer_to_server(servicer, s)], [SERVICE],
            resolve_auth(config.security), registry=registry,
        )
    server.servicer = servicer
    return server, port


def serve(config) -> LearnerProgress:
    """Train for learner.total_steps, then stop. SIGTERM/SIGINT stops after the current step. With
    learner.world_size > 1 this is one rank (under torchrun): rank 0 runs the loop below, the others follow
    it (`learner.sharding`)."""
    ranks = init_ranks(config.learner.world_size, config.learner.device)
    if config.learner.threads:
        torch.set_num_threads(config.learner.threads)
    torch.manual_seed(config.seed)
    check_checkpoint(config.model.path, "model.path")
    if ranks.leader:
        # What this learner runs with, every default filled in (`up` writes the run's config too; in a
        # container this is the run directory's record of the config).
        Path(config.run_dir).mkdir(parents=True, exist_ok=True)
        dump_config(config, Path(config.run_dir) / "config.learner.resolved.yaml")
    model = load_causal_lm(config.model.path, config.model.dtype, rank_device(config.learner.device))
    mirror = None
    if ranks.sharded:
        mirror = Mirror.before_sharding(model, ranks)
        shard(model, config.learner.mixed_precision, config.learner.activation_checkpointing)
    elif config.learner.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    sampling = SamplingParams.from_config(config.sampling)
    trainer = Trainer(model, config.learner, sampling, pad_token_id(model), ranks)
    path = ranks.broadcast(resume_path(config))  # the leader's view of the run directory
    meta = load_checkpoint(path, model, trainer.optimizer) if path else None
    if mirror is not None:
        mirror.refresh(model)
    if not ranks.leader:
        return _follow(trainer, ranks, mirror)
    full_model = model if mirror is None else mirror.module
    auth = resolve_auth(config.security)
    controller = SeatedController(controller_pb2_grpc.ControllerStub(
        wait_for_channel(config.controller.address, 120, auth, patient=True)))
    teacher = None
    if config.teacher.enabled and config.teacher.annotate:
        teacher = teacher_pb2_grpc.TeacherStub(wait_for_channel(config.teacher.address, 300, auth))
    task = task_for_run(config)
    metrics = LearnerMetrics()
    loop = LearnerLoop(
        config=config,
        trainer=trainer,
        buffer=make_buffer(config.buffer, consumer="learner-0"),
        controller_stub=controller,
        publisher=WeightPublisher(controller, full_model, config.learner.weight_transport,
                                  config.controller.push_timeout_s),
        evaluate=functools.partial(evaluate_held_out, full_model, task, sampling, config.learner.eval_pass_k,
                                   config.learner.eval_samples),
        events=EventLog(config.run_dir, "learner"),
        metrics=metrics,
        limits=checkpoint_limits(config.model.path, config),
        teacher_stub=teacher,
        checkpointer=Checkpointer(config, task.tokenizer.hf, ranks, export_model=full_model),
        sinks=MetricSinks(config),
        ranks=ranks,
        mirror=mirror,
        replica_evals=_replica_evals(config, controller, task, sampling, auth),
    )
    if meta is not None:
        loop.resume(meta, path)
    server, port = create_server(config, loop.progress, metrics.registry, seat=controller)
    server.start()
    with listening("learner.metrics_port", config.learner.host, config.learner.metrics_port):
        metrics_port = serve_metrics(config.learner.host, config.learner.metrics_port, metrics.registry)
    print(f"asyncrl-learner listening grpc={config.learner.host}:{port} "
          f"metrics={config.learner.host}:{metrics_port}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        # The controller challenges this learner where the replicas reach it (the rendezvous store's host). A
        # predecessor it cannot challenge keeps the seat until silent for heartbeat_timeout_s: wait that out.
        controller.take_seat(f"{config.learner.weight_transport.host}:{port}",
                             patience_s=2 * config.controller.heartbeat_timeout_s)
        progress = loop.run(stop)
    finally:
        server.stop(2)
        loop.sinks.close()
        loop.publisher.close()  # after a failure, lets a push still in flight end (bounded by its time-outs)
    # Only after a loop that ended normally: a leader that failed mid-step leaves the others inside a
    # collective, and its exit (torchrun then stops them) is what ends them.
    if ranks.sharded:
        ranks.broadcast((STOP,))
        leave(ranks)
    summary = {"step": progress.step, "version": progress.version, "consumed": progress.consumed,
               "final_eval_accuracy": progress.last_eval_accuracy}
    Path(config.run_dir, "learner-summary.json").write_text(json.dumps(summary, indent=2))
    return progress
