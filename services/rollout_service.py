"""Rollout replica service: the gRPC edge (UpdateWeights, Generate, GetStatus) around a replica's engine;
`serve` runs it beside the replica's runtime (`asyncrl.rollout.runtime`: controller session, rollout loop)."""

from __future__ import annotations

import logging
import math
import queue
import signal
import threading

import grpc
from transformers import AutoConfig

from asyncrl.core.checks.validation import InvalidArgument, check_range, check_token_ids, require
from asyncrl.core.config.runs import bank_shape, run_configs
from asyncrl.core.engines.factory import make_engine, make_shared_model
from asyncrl.core.lora.versions import AdapterServing
from asyncrl.core.model.sampling import SamplingParams
from asyncrl.core.runtime.announce import announce
from asyncrl.core.runtime.metrics import serve_metrics
from asyncrl.core.wire.auth import MAX_CHALLENGE, liveness_mac, resolve_auth
from asyncrl.core.wire.grpc_util import abort_invalid, build_server, wait_for_channel, wait_until_stopped
from asyncrl.core.wire.ports import listening
from asyncrl.push.plan import PushPlan
from asyncrl.push.receiver import OrderNotSigned, PushReceiver
from asyncrl.push.receiving import BroadcastReceiving
from asyncrl.push.rendezvous import PushAborted
from asyncrl.rollout.rollout_metrics import RolloutMetrics
from asyncrl.rollout.runtime import ReplicaRuntime, replica_seed
from asyncrl.v1 import controller_pb2_grpc, rollout_pb2, rollout_pb2_grpc

log = logging.getLogger("asyncrl.rollout")
SERVICE = "asyncrl.v1.Rollout"
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-3, 100.0


class RolloutServicer(rollout_pb2_grpc.RolloutServicer):
    def __init__(self, engine, engine_lock: threading.Lock, vocab_size: int, context: int, max_prompts: int,
                 metrics: RolloutMetrics, engine_type: str, replica_id=lambda: "", push_key=None):
        self.engine = engine
        self.engine_lock = engine_lock
        self.vocab_size = vocab_size
        self.context = context
        """Prompt + new tokens at most (the model's context)."""
        self.max_prompts = max_prompts
        """Prompts per Generate call at most (one engine batch): how long one caller can hold the engine."""
        self.metrics = metrics
        self.engine_type = engine_type
        self.replica_id = replica_id
        self.push_key = push_key
        """Callable -> the key its controller signs pushes with; None: a standalone server (tests, tools) that
        has no controller and checks no push orders."""
        self.receiver = PushReceiver(self._load, push_key, metrics.pushes_refused.inc)
        """Takes pushes: UpdateWeights orders, and in-band ones its listener finds (only with a controller)."""
        metrics.weight_version.set(engine.weight_version)

    def _load(self, plan, rank: int):
        """The engine's update (join `plan`'s push as `rank`, load the weights), counted."""
        stats = self.engine.update_weights(plan, rank)
        self.metrics.weight_version.set(stats.version)
        self.metrics.weight_update_seconds.observe(stats.load_s)
        self.metrics.weight_update_pause.observe(stats.pause_s)
        return stats

    def UpdateWeights(self, request, context):
        try:
            require(request.HasField("plan"), "plan", "is required")
            plan = PushPlan.from_proto(request.plan, "plan")
            require(1 <= request.rank < plan.world_size, "rank", f"must be in [1, {plan.world_size}), got {request.rank}")
        except InvalidArgument as err:
            abort_invalid(context, err)
        try:
            stats = self.receiver.take_ordered(plan, request.rank, request.order_mac)
        except Exception as err:
            if isinstance(err, OrderNotSigned):
                context.abort(grpc.StatusCode.PERMISSION_DENIED, str(err))
            if isinstance(err, ValueError):  # the plan (or the manifest it names) does not fit the model
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"plan: {err}")
            if isinstance(err, PushAborted):  # the sender called it off, or it is over (a late order): not a fault
                log.warning("weight update %s not taken: %s", request.plan.push_id, err)
                context.abort(grpc.StatusCode.ABORTED, f"weight update {request.plan.push_id} not taken: {err}")
            log.exception("weight update %s failed", request.plan.push_id)
            context.abort(grpc.StatusCode.ABORTED, f"weight update {request.plan.push_id} failed: {err}")
        return rollout_pb2.UpdateWeightsResponse(weight_version=stats.version, load_s=stats.load_s,
                                                 pause_s=stats.pause_s, adapter_checksum=stats.adapter_checksum)

    def Generate(self, request, context):
        try:
            require(1 <= len(request.prompts) <= self.max_prompts, "prompts",
                    f"must hold 1 to {self.max_prompts} prompts (rollout.engine.max_batch_size), "
                    f"got {len(request.prompts)}")
            for i, p in enumerate(request.prompts):
                require(len(p.token_ids) < self.context, f"prompts[{i}].token_ids",
                        f"at most {self.context - 1} tokens (the model's context), got {len(p.token_ids)}")
                check_token_ids(p.token_ids, self.vocab_size, f"prompts[{i}].token_ids")
            longest = max(len(p.token_ids) for p in request.prompts)
            check_range(request.max_new_tokens, 1, self.context - longest, "max_new_tokens")
            t = request.temperature
            require(t == 0 or (math.isfinite(t) and MIN_TEMPERATURE <= t <= MAX_TEMPERATURE), "temperature",
                    f"must be 0 (greedy) or in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}], got {t}")
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
        if len(request.challenge) > MAX_CHALLENGE:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"challenge: at most {MAX_CHALLENGE} bytes, got {len(request.challenge)}")
        key = self.push_key() if self.push_key is not None else b""
        return rollout_pb2.RolloutStatus(
            replica_id=self.replica_id(),
            weight_version=self.engine.weight_version,
            adapter_checksum=self.engine.adapter_checksum,
            engine=self.engine_type,
            groups_written=int(self.metrics.groups_written._value.get()),
            tokens_generated=int(self.metrics.tokens_generated._value.get()),
            challenge_mac=liveness_mac(key, request.challenge) if key and request.challenge else b"",
        )


def create_server(config, engine=None, engine_lock=None, metrics=None, replica_id=lambda: "", push_key=None):
    """The Rollout gRPC server (not started) around `engine` (built from config when None). `push_key`: a
    callable giving the key pushes must be signed with (see `RolloutServicer`)."""
    engine = engine or make_engine(config.rollout.engine, config.model.path, config.model.dtype, seed=config.seed,
                                   adapters=AdapterServing.for_run(config.learner.lora, config.controller.eta),
                                   determinism=config.model.determinism, weights=BroadcastReceiving())
    model_config = AutoConfig.from_pretrained(config.model.path)
    servicer = RolloutServicer(
        engine, engine_lock or threading.Lock(),
        model_config.vocab_size, model_config.max_position_embeddings, config.rollout.engine.max_batch_size,
        metrics or RolloutMetrics(), config.rollout.engine.type, replica_id, push_key,
    )
    with listening("rollout.port", config.rollout.host, config.rollout.port):
        server, port, _health = build_server(
            config.rollout.host, config.rollout.port,
            [lambda s: rollout_pb2_grpc.add_RolloutServicer_to_server(servicer, s)], [SERVICE],
            resolve_auth(config.security), registry=servicer.metrics.registry,
        )
    server.servicer = servicer
    return server, port


def serve(config, replica_id: str = "", reload=None) -> None:
    """Run one replica: engine, gRPC service, controller session, heartbeats and the rollout loop. With `runs:`,
    one replica of every run on one shared model (`serve_runs`; `reload` reads the config again)."""
    if config.runs:
        return serve_runs(config, replica_id, reload or (lambda: config))
    runtime = ReplicaRuntime(config, replica_id)
    server = _serve_replica(config, runtime)
    wait_until_stopped(server, on_stop=runtime.stop)


def serve_runs(config, replica_id: str, reload) -> None:
    """A replica of each run of a deployment of several LoRA runs, on one model with every run's adapters
    (`make_shared_model`: torch or vLLM): per run its own runtime (registration at its controller, leases,
    buffer stream, pushes), gRPC port and /metrics, as a replica of that run alone would have. SIGHUP reads the
    config again (`reload`): a run added gets its slots and replica, a removed one stops and frees them; the
    other runs go on untouched. SIGTERM/SIGINT stop every run's."""
    signals: queue.SimpleQueue = queue.SimpleQueue()  # first: a SIGHUP while the model loads waits, not kills
    signal.signal(signal.SIGHUP, lambda *_: signals.put("reload"))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: signals.put("stop"))
    shared = make_shared_model(config.rollout.engine, config.model.path, config.model.dtype, bank_shape(config),
                               BroadcastReceiving.vllm_worker_extension, seed=replica_seed(config.seed, replica_id))
    tenants: dict[str, tuple] = {}
    restarts: dict[str, int] = {}
    weights = {spec.name: spec.weight for spec in config.runs}

    def start(run: str, run_cfg) -> None:
        shared.add_run(run, weights[run])
        runtime = ReplicaRuntime(run_cfg, replica_id, engine=shared.engine_for(run, BroadcastReceiving()),
                                 on_failure=lambda why: signals.put(("failed", run, why)))
        tenants[run] = (_serve_replica(run_cfg, runtime, f" run {run}"), runtime, run_cfg)

    def stop(run: str) -> None:
        server, runtime, _cfg = tenants.pop(run)
        runtime.stop()
        server.stop(2).wait()
        shared.remove_run(run)

    def sync(cfg) -> None:
        runs = run_configs(cfg)
        weights.update({spec.name: spec.weight for spec in cfg.runs})
        for run in [r for r in tenants if r not in runs]:
            stop(run)
            log.info("run %s removed from this replica", run)
        for run, run_cfg in runs.items():
            if run not in tenants:
                start(run, run_cfg)

    def failed(run: str, why: str) -> None:
        """One run's replica failed: it alone stops, and starts again (a fresh registration, its slots reset)
        while it has restarts left (`rollout.max_restarts`); the other runs' replicas go on untouched."""
        if run not in tenants:
            return
        run_cfg = tenants[run][2]
        stop(run)
        restarts[run] = restarts.get(run, 0) + 1
        if restarts[run] > run_cfg.rollout.max_restarts:
            log.error("run %s: its replica's %s; out of restarts (%d): this replica serves the other runs",
                      run, why, run_cfg.rollout.max_restarts)
            return
        log.error("run %s: its replica's %s; restarting it (%d/%d)", run, why, restarts[run],
                  run_cfg.rollout.max_restarts)
        start(run, run_cfg)

    sync(config)
    while (what := signals.get()) != "stop":
        try:
            if what == "reload":
                sync(reload())
            else:
                failed(*what[1:])
        except Exception:  # a config `asyncrl runs` checked before writing it: a failure here is not the others'
            log.exception("changing this replica's runs failed; it serves on as it was")
    for server, runtime, _cfg in tenants.values():
        runtime.stop()
        server.stop(5).wait()
    shared.close()


def _serve_replica(config, runtime: ReplicaRuntime, label: str = ""):
    """Start `runtime`'s gRPC server and /metrics, register it with its controller and start its loops; returns
    the server."""
    controller = controller_pb2_grpc.ControllerStub(
        wait_for_channel(config.controller.address, 120, resolve_auth(config.security), patient=True)
    )
    server, port = create_server(config, runtime.engine, runtime.engine_lock, runtime.metrics,
                                 replica_id=lambda: runtime.replica_id, push_key=lambda: runtime.push_key)
    server.start()
    with listening("rollout.metrics_port", config.rollout.host, config.rollout.metrics_port):
        metrics_port = serve_metrics(config.rollout.host, config.rollout.metrics_port, runtime.metrics.registry)
    runtime.start(controller, port, in_band_pushes=server.servicer.receiver.listener is not None)
    announce(f"asyncrl-rollout {runtime.replica_id}{label} listening grpc={config.rollout.host}:{port} "
             f"metrics={config.rollout.host}:{metrics_port}")  # fmt: skip
    return server
