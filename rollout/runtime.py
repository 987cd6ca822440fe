"""One rollout replica as a running thing: its engine (seeded per replica), the lock that serialises engine
calls, its metrics, and, once its gRPC port is known, the controller session, heartbeats and rollout loop.

The gRPC edge (`asyncrl.services.rollout_service`) needs the engine before it can bind its port, and the
controller needs that port (the replica's address) at registration: so the runtime is built first,
the server second, and `start(port)` registers and starts the loops last.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import zlib

import torch

from asyncrl.core.agents.factory import Episodes
from asyncrl.core.buffer import make_buffer
from asyncrl.core.buffer.trajectory_checks import checkpoint_limits
from asyncrl.core.config.preflight import check_checkpoint
from asyncrl.core.determinism.modes import seeded_sampling
from asyncrl.core.engines.factory import make_engine
from asyncrl.core.lora.versions import AdapterServing
from asyncrl.core.runtime.events import EventLog
from asyncrl.core.tasks import task_for_run
from asyncrl.core.tasks.reward_pool import RewardPool
from asyncrl.core.wire.auth import resolve_auth
from asyncrl.core.wire.grpc_util import channel
from asyncrl.core.wire.routes import route_address
from asyncrl.push.receiving import BroadcastReceiving
from asyncrl.rollout.annotation import TeacherAnnotator
from asyncrl.rollout.episode_worker import EpisodeWorker
from asyncrl.rollout.process_scorer import ProcessRewardScorer
from asyncrl.rollout.registration_calls import RegisteredReplica
from asyncrl.rollout.replica import ReplicaSession
from asyncrl.rollout.rollout_metrics import RolloutMetrics
from asyncrl.rollout.worker import RolloutWorker
from asyncrl.v1.teacher_pb2_grpc import TeacherStub

log = logging.getLogger(__name__)


def replica_seed(base_seed: int, replica_id: str) -> int:
    """Replicas must not draw the same samples: the run's seed plus a stable hash of the replica id."""
    return base_seed + zlib.crc32(replica_id.encode()) % 100_000


def advertised_host(rollout_cfg, controller_host: str) -> str:
    """The host the controller (and its weight pushes) should reach this replica at. Bound to every interface:
    the address of the one this host routes the controller's traffic through (the name of the host resolves
    to 127.0.1.1 on Debian, and a host with several networks has one address per network), else the host
    name's address."""
    if rollout_cfg.advertise_host:
        return rollout_cfg.advertise_host
    if rollout_cfg.host in ("0.0.0.0", "::", ""):
        return route_address(controller_host) or socket.gethostbyname(socket.gethostname())
    return rollout_cfg.host


class ReplicaRuntime:
    def __init__(self, config, replica_id: str = "", engine=None, on_failure=None):
        """`engine`: the run's view of a model several runs share (`asyncrl.core.engines.run_adapters`); None:
        the replica's own engine, built from the config. `on_failure(why)`: called instead of exiting the
        process when a loop dies (a replica of one run among several: the others go on); None: the process
        exits, so that its supervisor restarts it."""
        self.config = config
        self.requested_id = replica_id
        if config.rollout.engine.threads:
            torch.set_num_threads(config.rollout.engine.threads)
        check_checkpoint(config.model.path, "model.path")
        seed = replica_seed(config.seed, replica_id)
        torch.manual_seed(seed)
        self.engine = engine or make_engine(
            config.rollout.engine, config.model.path, config.model.dtype, seed=seed,
            adapters=AdapterServing.for_run(config.learner.lora, config.controller.eta),
            determinism=config.model.determinism, weights=BroadcastReceiving())
        self.engine_lock = threading.Lock()
        self.metrics = RolloutMetrics(replica_id, config.run_name)
        self.session: ReplicaSession | None = None
        self.rewards: RewardPool | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._on_failure = on_failure

    @property
    def push_key(self) -> bytes:
        """The current registration's push key (empty before the first registration: no push is accepted)."""
        return self.session.push_key if self.session else b""

    @property
    def replica_id(self) -> str:
        """The id the controller gave this replica (the requested one until registration)."""
        return self.session.replica_id if self.session else self.requested_id

    def start(self, controller_stub, port: int, in_band_pushes: bool) -> None:
        """Register with the controller as `<advertised host>:port` (`in_band_pushes`: its Rollout service
        follows the groups it joins), then heartbeat and roll out until `stop`."""
        cfg = self.config
        address = f"{advertised_host(cfg.rollout, cfg.controller.host)}:{port}"
        controller_stub = RegisteredReplica(controller_stub)  # its calls prove the registration they name
        self.session = ReplicaSession(controller_stub, address, self.engine, cfg.rollout.engine.type, self.requested_id,
                                      on_registered=self.metrics.bind, lease_deadline_s=cfg.rollout.lease_deadline_s,
                                      in_band_pushes=in_band_pushes)
        self.session.register()
        task = task_for_run(cfg)
        self.rewards = RewardPool(task.reward_fn, cfg.reward.workers, cfg.reward.timeout_s,
                                  on_error=self.metrics.reward_error)
        annotator = None
        if cfg.teacher.enabled and cfg.teacher.annotate and cfg.teacher.annotate_by == "rollout":
            # Patient: a teacher that restarts is waited for within each call's deadline.
            teacher_channel = channel(cfg.teacher.address, resolve_auth(cfg.security), patient=True)
            annotator = TeacherAnnotator(TeacherStub(teacher_channel), cfg.teacher, self.metrics, teacher_channel)
        limits = checkpoint_limits(cfg.model.path, cfg.sampling, cfg.reward, cfg.environment,
                                   cfg.controller.difficulty)
        episodes = Episodes.for_run(cfg, task, limits.max_sequence_tokens)
        kind, extra = RolloutWorker, {}
        if episodes is not None:
            kind, extra = EpisodeWorker, {"episodes": episodes, "episodes_in_flight": cfg.environment.episodes_in_flight
                                          or cfg.rollout.leases_per_batch * cfg.sampling.group_size}
        worker = kind(
            **extra, sampling=cfg.sampling, leases_per_batch=cfg.rollout.leases_per_batch, hold_s=cfg.controller.max_hold_s,
            engine=self.engine, engine_lock=self.engine_lock, buffer=make_buffer(cfg.buffer, reads=False),
            controller_stub=controller_stub, session=self.session, task=task, rewards=self.rewards,
            events=EventLog(cfg.run_dir, f"rollout-{self.session.replica_id}"), metrics=self.metrics,
            limits=limits, annotator=annotator,
            run_seed=cfg.seed if seeded_sampling(cfg.model.determinism) else None,
            process_scorer=(ProcessRewardScorer(cfg.rollout.process_rewards, self.engine, self.engine_lock,
                                                task.tokenizer) if cfg.rollout.process_rewards.enabled else None),
        )  # fmt: skip
        self._threads = [
            threading.Thread(target=self._exit_on_failure, args=(self.session.heartbeat_forever, "heartbeats"),
                             daemon=True),
            threading.Thread(target=self._exit_on_failure, args=(worker.run, "rollout loop"), daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _exit_on_failure(self, loop, name: str) -> None:
        """Run `loop(stop)` on this thread (the rollout loop, the heartbeats). Each rides out what it expects
        (controller calls failing, bad groups); anything else ends the process. A replica whose rollout loop
        died would heartbeat on without producing anything, and one whose loop is stuck would keep its
        leases alive (`LoopStuck`, from the heartbeats): it exits instead, so its supervisor (`asyncrl up`,
        Kubernetes) starts it again and its leases expire."""
        try:
            loop(self._stop)
        except BaseException as err:
            if self._on_failure is not None:
                log.critical("the %s died", name, exc_info=True)
                self._on_failure(f"{name} died: {type(err).__name__}: {err}")
                return
            log.critical("the %s died; exiting so that this replica is restarted", name, exc_info=True)
            logging.shutdown()
            os._exit(1)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the loops (bounded wait) and release the engine."""
        self._stop.set()
        deadline = time.time() + timeout_s
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.time()))
        if self.rewards is not None:
            self.rewards.close()
        self.engine.close()
