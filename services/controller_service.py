"""gRPC edge of the controller: validation, translation to `asyncrl.controller.state.ControllerState`, status codes.

- `create_server(config, run_dir=None, notify=None, check_replicas=True) -> (server, port)`: the asyncio gRPC
  server (`asyncrl.core.wire.grpc_aio`), not started: a held AcquireLease(s)/AwaitLeases is a suspended coroutine,
  the other calls run on a small thread pool. Its state is `server.controller_state` (reaper running; `close()`
  it after `server.stop`); `server.release_held()` answers held requests UNAVAILABLE at once. `notify` replaces the
  `Rollout.UpdateWeights` fan-out; `check_replicas=False` skips registration challenges (simulated replicas).
- `serve(config)`: the process: gRPC and the status page until SIGTERM/SIGINT.

Status codes (`controller_messages`): a malformed field is INVALID_ARGUMENT naming it; a learner-only call without
the seated learner's key is PERMISSION_DENIED; what the state forbids (an expired lease, a push already open, a
wrong version) is FAILED_PRECONDITION. docs/architecture.md, "Who may call", has the whole table.
"""

from __future__ import annotations

import functools
import gc
import logging
from pathlib import Path

import grpc

from asyncrl.controller.controller_metrics import ControllerMetrics
from asyncrl.controller.held_request import await_lease_ends, hold
from asyncrl.controller.key_seal import KeySeal
from asyncrl.controller.persistence import lease_write_counts, make_store
from asyncrl.controller.state import ControllerState
from asyncrl.controller.status_page import status_page_for
from asyncrl.core.checks.validation import (
    MAX_COUNT,
    MAX_REWARD,
    MAX_TIMEOUT_S,
    check_host_port,
    check_name,
    check_range,
    require,
)
from asyncrl.core.config.schema import AsyncRLConfig
from asyncrl.core.records.controller import ControllerStarted
from asyncrl.core.runtime.announce import announce
from asyncrl.core.runtime.events import EventLog
from asyncrl.core.wire.auth import resolve_auth
from asyncrl.core.wire.grpc_aio import Wakeup, build_aio_server
from asyncrl.core.wire.grpc_util import address_refuses, peer_host, wait_until_stopped
from asyncrl.core.wire.learner_secret import resolve_learner_secret
from asyncrl.core.wire.limits import controller_calls_in_flight
from asyncrl.core.wire.ports import listening
from asyncrl.push.fanout import ReplicaChannels, preload_store_client
from asyncrl.push.manifest import check_digest
from asyncrl.push.plan import PushOffer
from asyncrl.push.session import WeightNotifier
from asyncrl.services.controller_messages import (
    ERRORS,
    MAX_ERROR,
    answer,
    begin_response,
    check_replica_call,
    learner_figures,
    receiver_acks,
    status_message,
    status_of,
)
from asyncrl.services.liveness_calls import grpc_learner_liveness_answer, grpc_liveness_answer
from asyncrl.v1 import controller_pb2, controller_pb2_grpc

SERVICE_NAME = "asyncrl.v1.Controller"
_WORKERS = 32
"""Threads for the calls that run as plain functions (all but AcquireLease): each is short, or bounded like
CommitWeightPush's wait for acks; held AcquireLease calls are coroutines and take none."""

MAX_HELD_LEASES = 4096


class ControllerServicer(controller_pb2_grpc.ControllerServicer):
    def __init__(self, state: ControllerState):
        self.state = state
        self.wakeup: Wakeup | None = None
        """Set by `create_server` once the server's loop exists."""
        self.lease_ends: Wakeup | None = None
        """Wakes the held AwaitLeases calls whenever a lease ended (set by `create_server`)."""
        self.stopping = False
        """Set by `release_held` when the server stops: lease requests are answered UNAVAILABLE, not held."""

    def release_held(self) -> None:
        """Answer every held (and every new) lease request UNAVAILABLE at once: a stopping server would
        otherwise give each up to max_hold_s of its grace period, and the replica waiting on it as long."""
        self.stopping = True
        for wakeup in (self.wakeup, self.lease_ends):
            if wakeup is not None:
                wakeup.notify()

    def RegisterReplica(self, request, context):
        def run():
            check_host_port(request.address, "address")
            check_name(request.replica_id, "replica_id", optional=True)
            # Any version: a replica may hold one ahead of the controller (a timeline reset by a learner that
            # restarted from an older checkpoint); it then needs a resync, nothing more.
            check_range(request.weight_version, 0, MAX_COUNT, "weight_version")
            check_name(request.engine, "engine", optional=True)
            require(len(request.push_key) <= 64, "push_key", f"at most 64 bytes, got {len(request.push_key)}")
            r = self.state.register(request.address, request.replica_id, request.weight_version, request.engine,
                                    request.push_key, request.in_band_pushes, caller_host=peer_host(context.peer()))
            return controller_pb2.RegisterReplicaResponse(
                replica_id=r.replica_id,
                current_version=r.current_version,
                needs_sync=r.needs_sync,
                heartbeat_interval_s=r.heartbeat_interval_s,
                push_key=r.push_key,
            )

        return answer(context, run)

    def Heartbeat(self, request, context):
        def run():
            check_name(request.replica_id, "replica_id")
            check_range(request.weight_version, 0, MAX_COUNT, "weight_version")
            held = None
            if request.HasField("held_leases"):
                held = list(request.held_leases.lease_ids)
                require(len(held) <= MAX_HELD_LEASES, "held_leases.lease_ids",
                        f"at most {MAX_HELD_LEASES}, got {len(held)}")
                for i, lease_id in enumerate(held):
                    check_name(lease_id, f"held_leases.lease_ids[{i}]")
            check_digest(request.adapter_checksum, "adapter_checksum", optional=True)
            check_replica_call(self.state, request)
            pulse = self.state.heartbeat(request.replica_id, request.weight_version, held, request.adapter_checksum)
            return controller_pb2.HeartbeatResponse(
                current_version=pulse.current_version, needs_sync=pulse.needs_sync,
                held_back_s=pulse.held_back_s, push_problem=pulse.push_problem,
            )

        return answer(context, run)

    async def AcquireLease(self, request, context):
        def check():
            self._check_lease_request(request)

        def look(started: float, final: bool, first: bool):
            d = self.state.admission.try_acquire(request.replica_id, request.num_trajectories, started, final, first)
            return None if d is None else controller_pb2.AcquireLeaseResponse(
                granted=d.granted, lease_id=d.lease_id, prompt_index=d.prompt_index, version=d.version,
                reason=d.reason, expires_unix_s=d.expires_unix_s, sample_index=d.sample_index,
                num_trajectories=d.num_trajectories,
            )  # fmt: skip

        return await self._held(context, request.wait_s, check, look)

    def CompleteLease(self, request, context):
        def run():
            check_name(request.replica_id, "replica_id")
            check_name(request.lease_id, "lease_id")
            check_range(request.num_written, 0, self.state.batch_size, "num_written")
            check_replica_call(self.state, request)
            self.state.admission.complete(request.replica_id, request.lease_id, request.num_written)
            return controller_pb2.CompleteLeaseResponse()

        return answer(context, run)

    async def AcquireLeases(self, request, context):
        def check():
            self._check_lease_request(request)
            check_range(request.max_leases, 1, self.state.batch_size, "max_leases")

        def look(started: float, final: bool, first: bool):
            batch = self.state.admission.try_acquire_many(request.replica_id, request.num_trajectories, request.max_leases,
                                                started, final, first)
            return None if batch is None else controller_pb2.AcquireLeasesResponse(
                leases=[controller_pb2.Lease(lease_id=d.lease_id, prompt_index=d.prompt_index, version=d.version,
                                             expires_unix_s=d.expires_unix_s, sample_index=d.sample_index,
                                             num_trajectories=d.num_trajectories)
                        for d in batch.leases],
                reason=batch.reason,
            )  # fmt: skip

        return await self._held(context, request.wait_s, check, look)

    def _check_lease_request(self, request) -> None:
        """The fields AcquireLease and AcquireLeases share."""
        check_name(request.replica_id, "replica_id")
        check_range(request.num_trajectories, 1, self.state.batch_size, "num_trajectories")
        check_range(request.wait_s, 0.0, MAX_TIMEOUT_S, "wait_s")
        check_replica_call(self.state, request)

    async def _held(self, context, wait_s: float, check, look):
        """Answer a lease request with `look(started, final, first)`'s first answer, held without a thread
        (`controller.held_request.hold`); `check` validates the request first."""
        try:
            check()
            return await hold(self.state.admission, self.wakeup, wait_s, look, lambda: self.stopping)
        except ERRORS as err:
            await context.abort(*status_of(err))

    def CompleteLeases(self, request, context):
        def run():
            check_name(request.replica_id, "replica_id")
            count = len(request.completions)
            require(1 <= count <= MAX_HELD_LEASES, "completions", f"1 to {MAX_HELD_LEASES} entries, got {count}")
            seen = set()
            for i, c in enumerate(request.completions):
                check_name(c.lease_id, f"completions[{i}].lease_id")
                require(c.lease_id not in seen, f"completions[{i}].lease_id", "the same lease twice in one call")
                seen.add(c.lease_id)
                check_range(c.num_written, 0, self.state.batch_size, f"completions[{i}].num_written")
                if c.HasField("reward_mean"):
                    check_range(c.reward_mean, -MAX_REWARD, MAX_REWARD, f"completions[{i}].reward_mean")
            check_replica_call(self.state, request)
            errors = self.state.admission.complete_many(request.replica_id, [
                (c.lease_id, c.num_written, c.reward_mean if c.HasField("reward_mean") else None)
                for c in request.completions])
            return controller_pb2.CompleteLeasesResponse(outcomes=[
                controller_pb2.LeaseOutcome(lease_id=c.lease_id, completed=not error, error=error)
                for c, error in zip(request.completions, errors)
            ])

        return answer(context, run)

    def RegisterLearner(self, request, context):
        def run():
            check_host_port(request.address, "address")
            check_range(request.proof_unix_s, 0, MAX_COUNT, "proof_unix_s")
            require(len(request.seat_proof) <= 64, "seat_proof", f"at most 64 bytes, got {len(request.seat_proof)}")
            require(len(request.proof_nonce) <= 64, "proof_nonce", f"at most 64 bytes, got {len(request.proof_nonce)}")
            seat = self.state.seating.register_learner(request.address, request.proof_unix_s, request.seat_proof,
                                               request.proof_nonce)
            return controller_pb2.RegisterLearnerResponse(learner_key=seat.learner_key,
                                                          current_version=seat.current_version)

        return answer(context, run)

    def BeginWeightPush(self, request, context):
        def run():
            self.state.seating.check_learner(request.learner_key)
            # The state answers a version other than current or current + 1 (FAILED_PRECONDITION).
            check_range(request.version, 0, MAX_COUNT, "version")
            offer = PushOffer.from_proto(request)
            check_name(request.unused_push_id, "unused_push_id", optional=True)
            return begin_response(self.state.begin_push(request.version, offer, request.unused_push_id))

        return answer(context, run)

    def CommitWeightPush(self, request, context):
        def run():
            self.state.seating.check_learner(request.learner_key)
            check_name(request.push_id, "push_id")
            require(len(request.error) <= MAX_ERROR, "error", f"at most {MAX_ERROR} characters, got {len(request.error)}")
            require(len(request.missing_ranks) <= MAX_HELD_LEASES, "missing_ranks",
                    f"at most {MAX_HELD_LEASES} ranks, got {len(request.missing_ranks)}")
            for i, rank in enumerate(request.missing_ranks):
                check_range(rank, 1, MAX_COUNT, f"missing_ranks[{i}]")
            check_range(request.push_seconds, 0.0, MAX_TIMEOUT_S, "push_seconds")
            check_digest(request.adapter_checksum, "adapter_checksum", optional=True)
            result = self.state.commit_push(request.push_id, request.sender_ok, request.error,
                                            tuple(request.missing_ranks), receiver_acks(request.acks),
                                            request.reserve_next, request.push_seconds,
                                            request.adapter_checksum)  # fmt: skip
            return controller_pb2.CommitWeightPushResponse(
                committed=result.committed,
                current_version=result.current_version,
                acked=result.acked,
                dropped=result.dropped,
                next_push=begin_response(result.next_push) if result.next_push is not None else None,
            )

        return answer(context, run)

    def LearnerHeartbeat(self, request, context):
        def run():
            self.state.seating.check_learner(request.learner_key)
            check_range(request.step, 0, MAX_COUNT, "step")
            check_range(request.consumed, 0, MAX_COUNT, "consumed")
            self._require_version(request.version, "version")
            check_range(request.total_steps, 0, MAX_COUNT, "total_steps")
            pulse = self.state.learner_heartbeat(request.step, request.version, request.consumed,
                                                 learner_figures(request))
            return controller_pb2.LearnerHeartbeatResponse(
                sync_requested=pulse.sync_requested, current_version=pulse.current_version
            )

        return answer(context, run)

    def ResetTimeline(self, request, context):
        def run():
            self.state.seating.check_learner(request.learner_key)
            check_range(request.version, 0, MAX_COUNT, "version")
            check_range(request.admitted, 0, MAX_COUNT, "admitted")
            check_range(request.prompt_index, 0, MAX_COUNT, "prompt_index")
            reset = self.state.reset_timeline(request.version, request.admitted, request.prompt_index)
            return controller_pb2.ResetTimelineResponse(current_version=reset.current_version,
                                                        leases_expired=reset.leases_expired,
                                                        prompt_index=reset.prompt_index)

        return answer(context, run)

    def ReturnQuota(self, request, context):
        def run():
            self.state.seating.check_learner(request.learner_key)
            check_name(request.entry_id, "entry_id")
            check_range(request.trajectories, 1, self.state.batch_size, "trajectories")
            require(len(request.reason) <= MAX_ERROR, "reason", f"at most {MAX_ERROR} characters, got "
                                                                 f"{len(request.reason)}")
            check_name(request.lease_id, "lease_id", optional=True)
            prompt = request.prompt_index if request.HasField("prompt_index") else None
            if prompt is not None:  # a prompt the stream handed out: nothing else can be "generated again"
                check_range(prompt, 0, self.state.next_prompt_index - 1, "prompt_index")
            returned, admitted = self.state.admission.return_quota(request.entry_id, request.trajectories,
                                                                   request.reason, prompt, request.lease_id)
            return controller_pb2.ReturnQuotaResponse(returned=returned, admitted=admitted)

        return answer(context, run)

    async def AwaitLeases(self, request, context):
        """Held on the loop (no thread) until no lease at or below `version` is active, or `wait_s` is up."""
        try:
            self.state.seating.check_learner(request.learner_key)
            self._require_version(request.version, "version")  # the learner's own: its push may be in flight
            check_range(request.wait_s, 0.0, MAX_TIMEOUT_S, "wait_s")
            outstanding, oldest = await await_lease_ends(self.state.admission, self.lease_ends, request.version,
                                                         request.wait_s, lambda: self.stopping)
            return controller_pb2.AwaitLeasesResponse(outstanding=outstanding, oldest_version=oldest)
        except ERRORS as err:
            await context.abort(*status_of(err))

    def GetStatus(self, request, context):
        return answer(context, lambda: status_message(self.state.snapshot()))

    def _require_version(self, version: int, field: str) -> None:
        """A version someone holds or offers is at most one past the committed one (a push in flight)."""
        check_range(version, 0, self.state.current_version + 1, field)


def create_server(
    config: AsyncRLConfig, run_dir: str | None = None, notify: WeightNotifier | None = None,
    check_replicas: bool = True,
) -> tuple[grpc.Server, int]:
    """The controller's gRPC server, not started; the state is `server.controller_state` (see module doc).
    `check_replicas=False` trusts every registration's id and address unchallenged: only for simulated replicas,
    which hold no server (`asyncrl.tools.lease_load`)."""
    auth = resolve_auth(config.security)
    run_dir = run_dir or config.run_dir
    events = EventLog(run_dir, "controller")
    channels = ReplicaChannels(auth)
    learner_secret = resolve_learner_secret(config.security)
    store = make_store(config.controller, config.buffer, KeySeal(learner_secret))
    state = ControllerState(
        config.controller, config.learner.batch_size, events=events,
        notify=notify or channels.update_weights,
        probe=functools.partial(grpc_liveness_answer, auth=auth) if check_replicas else None,
        learner_probe=functools.partial(grpc_learner_liveness_answer, auth=auth),
        learner_secret=learner_secret,
        lease_writes=lease_write_counts(config.buffer, store) if check_replicas else None,
        gone=address_refuses if check_replicas else None,
        store=store, run_id=str(run_dir), metrics=ControllerMetrics(run=config.run_name),
    )
    servicer = ControllerServicer(state)
    with listening("controller.port", config.controller.host, config.controller.port):
        server, port = build_aio_server(
            config.controller.host,
            config.controller.port,
            [lambda s: controller_pb2_grpc.add_ControllerServicer_to_server(servicer, s)],
            [SERVICE_NAME],
            auth,
            migration_workers=_WORKERS,
            registry=state.metrics.registry,
            calls_in_flight=controller_calls_in_flight(config.controller.max_replicas),
        )
    servicer.wakeup = Wakeup(server.loop)
    state.admission.add_waker(servicer.wakeup.notify)
    servicer.lease_ends = Wakeup(server.loop)
    state.admission.add_end_waker(servicer.lease_ends.notify)
    server.release_held = servicer.release_held
    state.liveness.start_reaper()
    server.controller_state = state
    server.replica_channels = channels
    # The objects of start-up (modules, config, schemas) live as long as the process: out of the collector's
    # generations, a full collection no longer walks them, and its pause under a thousand held replicas
    # drops from ~130 ms to a few (heartbeat p99, bench/controller_leases.py).
    gc.freeze()
    preload_store_client()
    return server, port


def serve(config: AsyncRLConfig, deployment_file: Path | None = None) -> None:
    """Run the controller until SIGTERM/SIGINT: gRPC, the status page (`status_page_for`), the reaper."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s controller %(levelname)s %(message)s")
    server, port = create_server(config)
    state: ControllerState = server.controller_state
    cc = config.controller
    host, page = cc.host, status_page_for(state, cc, config.run_name, deployment_file)
    http_port = page.start()
    server.start()
    state.events.write(ControllerStarted(
        grpc=f"{host}:{port}", http=f"{host}:{http_port}", eta=state.eta, batch_size=state.batch_size,
        start_version=cc.start_version, start_admitted=cc.start_admitted, start_prompt_index=cc.start_prompt_index,
        state_store=cc.state_store, restored=state.restored,
    ))  # fmt: skip
    announce(f"asyncrl-controller listening grpc={host}:{port} http={host}:{http_port}")
    wait_until_stopped(server, on_stop=lambda: (server.release_held(), page.stop()))
    state.close()
    server.replica_channels.close()
