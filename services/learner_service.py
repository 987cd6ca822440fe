"""Learner service: runs the learner its role builds (`asyncrl.learner.builder`) and serves a small gRPC
status edge and /metrics beside it."""

from __future__ import annotations

import json
import logging
import queue
import signal
import threading
from pathlib import Path

import grpc

from asyncrl.core.config.runs import run_configs
from asyncrl.core.runtime.announce import announce
from asyncrl.core.runtime.metrics import start_metrics
from asyncrl.core.wire.auth import MAX_CHALLENGE, resolve_auth
from asyncrl.core.wire.grpc_util import build_server
from asyncrl.core.wire.ports import listening
from asyncrl.learner.builder import Follower, build_learner
from asyncrl.learner.progress import LearnerProgress
from asyncrl.learner.runs import build_run_learners
from asyncrl.learner.seat import SeatedController
from asyncrl.v1 import learner_pb2, learner_pb2_grpc

SERVICE = "asyncrl.v1.Learner"
REMOVED_GRACE_S = 30.0
"""How long the learner waits, once the other runs are done, for a removed run to finish its last step."""
log = logging.getLogger(__name__)


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


def serve(config, reload=None) -> LearnerProgress:
    """Train for learner.total_steps, then stop. SIGTERM/SIGINT stops after the current step. With
    learner.world_size > 1 this is one rank (under torchrun): rank 0 runs the loop, the others follow it. With
    `runs:`, every run's loop on one base (`serve_runs`); the progress returned is the first run's."""
    if config.runs:
        return next(iter(serve_runs(config, reload or (lambda: config)).values()), LearnerProgress())
    built = build_learner(config)
    if isinstance(built, Follower):
        return built.run()
    edge = StatusEdge(config, built)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        # The controller challenges this learner where the replicas reach it (the rendezvous store's host). A
        # predecessor it cannot challenge keeps the seat until silent for heartbeat_timeout_s: wait that out.
        built.controller.take_seat(f"{config.learner.weight_transport.host}:{edge.port}",
                                   patience_s=2 * config.controller.heartbeat_timeout_s)
        progress = built.loop.run(stop)
    finally:
        edge.stop()
        built.close()
    built.release_followers()
    _write_summary(config, progress)
    return progress


class StatusEdge:
    """A leader's status server and /metrics, started on `config`'s ports; `stop()` frees both ports."""

    def __init__(self, config, leader, label: str = ""):
        self.server, self.port = create_server(config, leader.loop.progress, leader.metrics.registry,
                                               seat=leader.controller)
        self.server.start()
        with listening("learner.metrics_port", config.learner.host, config.learner.metrics_port):
            self.metrics, metrics_port = start_metrics(config.learner.host, config.learner.metrics_port,
                                                       leader.metrics.registry)
        announce(f"asyncrl-learner{label} listening grpc={config.learner.host}:{self.port} "
                 f"metrics={config.learner.host}:{metrics_port}")

    def stop(self) -> None:
        self.server.stop(2).wait(5)  # its port free again for a run's loop restarted in this process
        self.metrics.shutdown()
        self.metrics.server_close()


def _write_summary(config, progress: LearnerProgress) -> None:
    summary = {"step": progress.step, "version": progress.version, "consumed": progress.consumed,
               "final_eval_accuracy": progress.last_eval_accuracy}
    Path(config.run_dir, "learner-summary.json").write_text(json.dumps(summary, indent=2))


def serve_runs(config, reload) -> dict[str, LearnerProgress]:
    """Several runs on one base (`asyncrl.learner.runs`): each run's status server and /metrics on its own ports,
    its seat at its own controller, its loop on a thread of its own; returns when every run is done. SIGHUP
    reads the config again (`reload`): a run added joins (its adapter, trainer and loop), a removed one stops
    after its current step and checkpoints; SIGTERM/SIGINT stop each after its current step. A run whose loop
    fails is restarted alone, from its own latest checkpoint, up to `learner.max_restarts` times while the
    others go on; one that fails past that ends alone, and the process exits non-zero at the end so that its
    supervisor restarts it (each run resumes from its own checkpoint)."""
    signals: queue.SimpleQueue = queue.SimpleQueue()  # first: a SIGHUP while the base loads waits, not kills
    signal.signal(signal.SIGHUP, lambda *_: signals.put("reload"))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: signals.put("stop"))
    learners = build_run_learners(config)
    progress: dict[str, LearnerProgress] = {}
    failed: dict[str, BaseException] = {}
    stops: dict[str, threading.Event] = {}
    threads: dict[str, threading.Thread] = {}
    removed: set[str] = set()
    """Runs taken out of the deployment: stopped after their step; an error of theirs fails nothing."""

    def run_one(run: str, stop: threading.Event) -> None:
        """Run `run`'s loop; one that fails is built again from the run's latest checkpoint inside this process
        (`RunLearners.restart`), at most `learner.max_restarts` times, while the other runs train on."""
        leader, cfg = learners.leaders[run], learners.configs[run]
        for attempt in range(cfg.learner.max_restarts + 1):
            if attempt:
                log.warning("run %s: its loop failed; restarting it from its latest checkpoint (%d/%d)", run,
                            attempt, cfg.learner.max_restarts)
                try:
                    leader = learners.restart(run)
                except Exception as err:  # its checkpoint unreadable, its controller gone: the run's alone
                    log.exception("run %s could not be restarted", run)
                    failed[run] = err
                    return
            try:
                attempt_run(run, leader, cfg, stop)
                failed.pop(run, None)
                return
            except Exception as err:  # one run's failure is that run's alone: the others go on
                if run in removed:  # out of the deployment: nothing to restart it for
                    log.warning("run %s, removed, ended with an error: %s", run, err)
                    return
                log.exception("run %s failed", run)
                failed[run] = err
                if stop.is_set():
                    return

    def attempt_run(run: str, leader, cfg, stop: threading.Event) -> None:
        resumed = leader.loop.resumed
        if resumed is not None and resumed.step >= cfg.learner.total_steps:
            # Done before this loop started (a learner restarted while other runs trained on): nothing to do.
            announce(f"asyncrl-learner run {run} finished at step {resumed.step}")
            leader.close()
            return
        edge = None
        try:
            edge = StatusEdge(cfg, leader, f" run {run}")
            leader.controller.take_seat(f"{cfg.learner.weight_transport.host}:{edge.port}",
                                        patience_s=2 * cfg.controller.heartbeat_timeout_s)
            progress[run] = done = leader.loop.run(stop)
            _write_summary(cfg, done)
            if run in removed:
                log.info("run %s stopped at step %d: its replicas may drop it", run, done.step)
        finally:
            if edge is not None:
                edge.stop()
            leader.close()

    def start(run: str) -> None:
        stops[run] = threading.Event()
        threads[run] = threading.Thread(target=run_one, name=f"run-{run}", daemon=True, args=(run, stops[run]))
        threads[run].start()

    for run in learners.leaders:
        start(run)
    # A removed run's loop stuck in its own code (a reward that never returns) does not hold the others' end.
    while any(thread.is_alive() for run, thread in threads.items() if run not in removed):
        try:
            what = signals.get(timeout=1.0)
        except queue.Empty:
            continue
        if what == "stop":
            for stop in stops.values():
                stop.set()
            continue
        try:
            runs = run_configs(reload())
            for run in [r for r in stops if r not in runs and r not in removed]:
                log.info("run %s removed: it stops after its current step", run)
                stops[run].set()
                removed.add(run)
            for run, cfg in runs.items():
                if run not in learners.leaders:
                    learners.add(run, cfg)
                    start(run)
        except Exception:  # a config `asyncrl runs` checked before writing it: a failure here is not the others'
            log.exception("reading the runs again failed; the runs go on as they were")
    for run in removed:  # a removed run still checkpointing gets the time to finish; one stuck is left behind
        threads[run].join(timeout=REMOVED_GRACE_S)
    if failed:
        raise RuntimeError(f"runs {', '.join(sorted(failed))} failed: {'; '.join(map(str, failed.values()))}")
    return progress
