"""Rollout replica service: the gRPC edge (UpdateWeights, Generate, GetStatus) around an engine, plus the
replica's rollout loop and controller session when run as a process (`serve`)."""

from __future__ import annotations

import logging
import socket
import threading
import time
import zlib

import grpc
import torch
from asyncrl.rollout.replica import ReplicaSession
from asyncrl.rollout.worker import RolloutWorker
from asyncrl.services.validation import check_token_ids
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from transformers import AutoConfig

from asyncrl.core.buffer import make_buffer
from asyncrl.core.engines.factory import make_engine
from asyncrl.core.events import EventLog
from asyncrl.core.grpc_util import (
    InvalidArgument,
    abort_invalid,
    build_server,
    require,
    wait_for_channel,
    wait_until_stopped,
)
from asyncrl.core.metrics import serve_metrics
from asyncrl.core.sampling import SamplingParams
from asyncrl.core.tasks import get_reward, get_task
from asyncrl.core.weights.manifest import decode_plan
from asyncrl.v1 import controller_pb2_grpc, rollout_pb2, rollout_pb2_grpc

log = logging.getLogger("asyncrl.rollout")
SERVICE = "asyncrl.v1.Rollout"


class RolloutMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.groups_written = Counter("asyncrl_rollout_groups_written", "Trajectory groups written", registry=r)
        self.tokens_generated = Counter("asyncrl_rollout_tokens_generated", "Response tokens generated", registry=r)
        self.generation_seconds = Histogram("asyncrl_rollout_generation_seconds", "Engine generate() time", registry=r)
        self.lease_wait = Histogram("asyncrl_rollout_lease_wait_seconds", "Time waiting for a lease", registry=r)
        self.weight_version = Gauge("asyncrl_rollout_weight_version", "Weight version in the engine", registry=r)
        self.weight_update_seconds = Histogram("asyncrl_rollout_weight_update_seconds", "Weight update time", registry=r)
        self.weight_update_pause = Histogram("asyncrl_rollout_weight_update_pause_seconds",
                                             "Generation pause caused by a weight update", registry=r)
        self.reward_mean = Gauge("asyncrl_rollout_reward_mean", "Mean reward of the last group", registry=r)


class RolloutServicer(rollout_pb2_grpc.RolloutServicer):
    def __init__(self, engine, engine_lock: threading.Lock, vocab_size: int, metrics: RolloutMetrics,
                 engine_type: str, replica_id=lambda: ""):
        self.engine = engine
        self.engine_lock = engine_lock
        self.vocab_size = vocab_size
        self.metrics = metrics
        self.engine_type = engine_type
        self.replica_id = replica_id
        metrics.weight_version.set(engine.weight_version)

    def UpdateWeights(self, request, context):
        try:
            require(request.HasField("plan"), "plan", "is required")
            plan = decode_plan(request.plan, "plan")
            require(1 <= request.rank < plan.world_size, "rank", f"must be in [1, {plan.world_size}), got {request.rank}")
        except InvalidArgument as err:
            abort_invalid(context, err)
        try:
            stats = self.engine.update_weights(plan, request.rank)
        except ValueError as err:  # the plan does not fit the model
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"plan: {err}")
        except Exception as err:
            log.exception("weight update %s failed", request.plan.push_id)
            context.abort(grpc.StatusCode.ABORTED, f"weight update {request.plan.push_id} failed: {err}")
        self.metrics.weight_version.set(stats.version)
        self.metrics.weight_update_seconds.observe(stats.load_s)
        self.metrics.weight_update_pause.observe(stats.pause_s)
        return rollout_pb2.UpdateWeightsResponse(weight_version=stats.version, load_s=stats.load_s,
                                                 pause_s=stats.pause_s)

    def Generate(self, request, context):
        try:
            require(len(request.prompts) > 0, "prompts", "must not be empty")
            for i, p in enumerate(request.prompts):
                check_token_ids(p.token_ids, self.vocab_size, f"prompts[{i}].token_ids")
            require(request.max_new_tokens >= 1, "max_new_tokens", f"must be >= 1, got {request.max_new_tokens}")
            require(request.temperature >= 0, "temperature", f"must be >= 0, got {request.temperature}")
        except InvalidArgument as err:
            abort_invalid(context, err)
        greedy = request.temperature == 0
        params = SamplingParams(temperature=request.temperature or 1.0, max_new_tokens=request.max_new_tokens,
                                greedy=greedy)
        with self.engine_lock:
            groups = self.engine.generate([list(p.token_ids) for p in request.prompts], params, n=1)
        return rollout_pb2.GenerateResponse(sequences=[
            rollout_pb2.GeneratedSequence(token_ids=g.token_ids, logp_behav=g.logp_behav,
                                          weight_version=g.weight_version, finished=g.finished)
            for (g,) in groups
        ])

    def GetStatus(self, request, context):
        return rollout_pb2.RolloutStatus(
            replica_id=self.replica_id(),
            weight_version=self.engine.weight_version,
            engine=self.engine_type,
            groups_written=int(self.metrics.groups_written._value.get()),
            tokens_generated=int(self.metrics.tokens_generated._value.get()),
        )


def create_server(config, engine=None, engine_lock=None, metrics=None, replica_id=lambda: ""):
    """The Rollout gRPC server (not started) around `engine` (built from config when None)."""
    engine = engine or make_engine(config.rollout.engine, config.model.path, config.model.dtype, seed=config.seed)
    servicer = RolloutServicer(
        engine, engine_lock or threading.Lock(),
        AutoConfig.from_pretrained(config.model.path).vocab_size,
        metrics or RolloutMetrics(), config.rollout.engine.type, replica_id,
    )
    server, port, _health = build_server(
        config.rollout.host, config.rollout.port,
        [lambda s: rollout_pb2_grpc.add_RolloutServicer_to_server(servicer, s)], [SERVICE],
    )
    server.servicer = servicer
    return server, port


def advertised_host(rollout_cfg) -> str:
    if rollout_cfg.advertise_host:
        return rollout_cfg.advertise_host
    if rollout_cfg.host in ("0.0.0.0", "::", ""):
        return socket.gethostbyname(socket.gethostname())
    return rollout_cfg.host


def serve(config, replica_id: str = "") -> None:
    """Run one replica: engine, gRPC service, controller session, heartbeats and the rollout loop."""
    if config.rollout.engine.threads:
        torch.set_num_threads(config.rollout.engine.threads)
    # Replicas must not draw the same samples: seed by a stable hash of the replica id.
    seed = config.seed + zlib.crc32(replica_id.encode()) % 100_000
    torch.manual_seed(seed)
    engine = make_engine(config.rollout.engine, config.model.path, config.model.dtype, seed=seed)
    metrics = RolloutMetrics()
    engine_lock = threading.Lock()
    controller = controller_pb2_grpc.ControllerStub(wait_for_channel(config.controller.address, 120))
    session_box = {}
    server, port = create_server(config, engine, engine_lock, metrics, replica_id=lambda: session_box["s"].replica_id)
    server.start()
    metrics_port = serve_metrics(config.rollout.host, config.rollout.metrics_port, metrics.registry)
    session = ReplicaSession(controller, f"{advertised_host(config.rollout)}:{port}", engine, config.rollout.engine.type,
                             replica_id)
    session_box["s"] = session
    session.register()
    print(f"asyncrl-rollout {session.replica_id} listening grpc={config.rollout.host}:{port} "
          f"metrics={config.rollout.host}:{metrics_port}", flush=True)
    task = get_task(config.task)
    worker = RolloutWorker(
        config=config, engine=engine, engine_lock=engine_lock, buffer=make_buffer(config.buffer),
        controller_stub=controller, session=session, task=task, reward_fn=get_reward(config.rollout.reward),
        decode=task.decode_response,
        events=EventLog(config.run_dir, f"rollout-{session.replica_id}"), metrics=metrics,
    )
    stop = threading.Event()
    threads = [threading.Thread(target=session.heartbeat_forever, args=(stop,), daemon=True),
               threading.Thread(target=worker.run, args=(stop,), daemon=True)]
    for t in threads:
        t.start()

    def shutdown():
        stop.set()
        deadline = time.time() + 10
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.time()))
        engine.close()

    wait_until_stopped(server, on_stop=shutdown)
