"""gRPC edge of the controller: validation, translation to `asyncrl.controller.state.ControllerState`, status codes.

Public API
- `create_server(config, run_dir=None, notify=None) -> (server, port)`: a gRPC server (not started) bound to
  `config.controller.host:port` (port 0 = any free port; the bound port is returned) with the Controller
  service, grpc.health.v1 (SERVING for "asyncrl.v1.Controller") and reflection. The state object is
  `server.controller_state` (a `ControllerState`; its reaper thread is already running). After
  `server.stop(...)`, call `server.controller_state.close()` (stops the reaper, closes the event log).
  Events go to `<run_dir>/events/controller.jsonl`, run_dir defaulting to `config.run_dir`. `notify`
  replaces the gRPC `Rollout.UpdateWeights` fan-out (tests).
- `serve(config)`: the process entry point: gRPC + the status page (`controller.status_page`) on
  `config.controller.status_port`, prints `asyncrl-controller listening grpc=HOST:PORT http=HOST:PORT`,
  blocks until SIGTERM/SIGINT, stops gracefully.
- `python -m services.controller_service --config run.yaml [key=value ...]` runs `serve`.

Status codes: a malformed field -> INVALID_ARGUMENT with a message starting with the field name; a
well-formed request the controller's state forbids (expired lease, push already open, wrong version)
-> FAILED_PRECONDITION.
"""

from __future__ import annotations

import functools
import logging

import grpc

from asyncrl.controller.errors import InvalidRequest, PreconditionFailed, RegistryFull, UnknownReplica
from asyncrl.controller.persistence import make_store
from asyncrl.controller.push import PushOffer, WeightNotifier
from asyncrl.controller.state import ControllerState
from asyncrl.controller.status_page import StatusPage
from asyncrl.core.auth import resolve_auth
from asyncrl.core.config import AsyncRLConfig
from asyncrl.core.events import EventLog
from asyncrl.core.grpc_util import build_server, wait_until_stopped
from asyncrl.core.validation import (
    MAX_COUNT,
    MAX_TIMEOUT_S,
    InvalidArgument,
    check_name,
    check_range,
    require,
)
from asyncrl.core.weights.manifest import (
    MAX_PUSH_BYTES,
    check_address,
    check_optional_seconds,
    check_transport,
    decode_tensors,
    encode_plan,
)
from asyncrl.services.weight_fanout import grpc_update_weights
from asyncrl.v1 import controller_pb2, controller_pb2_grpc

SERVICE_NAME = "asyncrl.v1.Controller"
# Held AcquireLease calls each occupy a worker thread for up to max_hold_s; heartbeats must still get
# through, so the pool is sized far above the replica count (threads are created lazily).
_MAX_WORKERS = 256
MAX_HELD_LEASES = 4096
MAX_ERROR = 4096
"""Characters of a sender's error message in CommitWeightPush."""


class ControllerServicer(controller_pb2_grpc.ControllerServicer):
    def __init__(self, state: ControllerState):
        self.state = state

    def RegisterReplica(self, request, context):
        def run():
            check_address(request.address, "address")
            check_name(request.replica_id, "replica_id", optional=True)
            self._require_version(request.weight_version, "weight_version")
            check_name(request.engine, "engine", optional=True)
            r = self.state.register(
                request.address, request.replica_id, request.weight_version, request.engine
            )
            return controller_pb2.RegisterReplicaResponse(
                replica_id=r.replica_id,
                current_version=r.current_version,
                needs_sync=r.needs_sync,
                heartbeat_interval_s=r.heartbeat_interval_s,
                push_key=r.push_key,
            )

        return _answer(context, run)

    def Heartbeat(self, request, context):
        def run():
            check_name(request.replica_id, "replica_id")
            self._require_version(request.weight_version, "weight_version")
            held = None
            if request.HasField("held_leases"):
                held = list(request.held_leases.lease_ids)
                require(len(held) <= MAX_HELD_LEASES, "held_leases.lease_ids",
                        f"at most {MAX_HELD_LEASES}, got {len(held)}")
                for i, lease_id in enumerate(held):
                    check_name(lease_id, f"held_leases.lease_ids[{i}]")
            pulse = self.state.heartbeat(request.replica_id, request.weight_version, held)
            return controller_pb2.HeartbeatResponse(
                current_version=pulse.current_version, needs_sync=pulse.needs_sync
            )

        return _answer(context, run)

    def AcquireLease(self, request, context):
        def run():
            check_name(request.replica_id, "replica_id")
            check_range(request.num_trajectories, 1, self.state.batch_size, "num_trajectories")
            check_range(request.wait_s, 0.0, MAX_TIMEOUT_S, "wait_s")
            d = self.state.acquire(request.replica_id, request.num_trajectories, request.wait_s)
            return controller_pb2.AcquireLeaseResponse(
                granted=d.granted,
                lease_id=d.lease_id,
                prompt_index=d.prompt_index,
                version=d.version,
                reason=d.reason,
                expires_unix_s=d.expires_unix_s,
            )

        return _answer(context, run)

    def CompleteLease(self, request, context):
        def run():
            check_name(request.replica_id, "replica_id")
            check_name(request.lease_id, "lease_id")
            check_range(request.num_written, 0, self.state.batch_size, "num_written")
            self.state.complete(request.replica_id, request.lease_id, request.num_written)
            return controller_pb2.CompleteLeaseResponse()

        return _answer(context, run)

    def BeginWeightPush(self, request, context):
        def run():
            # The state answers a version other than current or current + 1 (FAILED_PRECONDITION).
            check_range(request.version, 0, MAX_COUNT, "version")
            check_address(request.store_address, "store_address")
            check_transport(request.transport, "transport")
            tensors = decode_tensors(request.tensors, "tensors")
            check_range(request.bucket_bytes, 1, MAX_PUSH_BYTES, "bucket_bytes")
            check_optional_seconds(request.timeout_s, "timeout_s")
            check_optional_seconds(request.join_timeout_s, "join_timeout_s")
            offer = PushOffer(request.store_address, request.transport, tensors, request.bucket_bytes,
                              request.timeout_s, request.join_timeout_s)  # fmt: skip
            session = self.state.begin_push(request.version, offer)
            return controller_pb2.BeginWeightPushResponse(
                plan=encode_plan(session.plan), receivers=[r.replica_id for r in session.receivers]
            )

        return _answer(context, run)

    def CommitWeightPush(self, request, context):
        def run():
            check_name(request.push_id, "push_id")
            require(len(request.error) <= MAX_ERROR, "error", f"at most {MAX_ERROR} characters, got {len(request.error)}")
            result = self.state.commit_push(request.push_id, request.sender_ok, request.error)
            return controller_pb2.CommitWeightPushResponse(
                committed=result.committed,
                current_version=result.current_version,
                acked=result.acked,
                dropped=result.dropped,
            )

        return _answer(context, run)

    def LearnerHeartbeat(self, request, context):
        def run():
            check_range(request.step, 0, MAX_COUNT, "step")
            check_range(request.consumed, 0, MAX_COUNT, "consumed")
            self._require_version(request.version, "version")
            pulse = self.state.learner_heartbeat(request.step, request.version, request.consumed)
            return controller_pb2.LearnerHeartbeatResponse(
                sync_requested=pulse.sync_requested, current_version=pulse.current_version
            )

        return _answer(context, run)

    def GetStatus(self, request, context):
        return _answer(context, lambda: status_message(self.state.snapshot()))

    def _require_version(self, version: int, field: str) -> None:
        """A version someone holds or offers is at most one past the committed one (a push in flight)."""
        check_range(version, 0, self.state.current_version + 1, field)


def status_message(snap: dict) -> controller_pb2.ControllerStatus:
    """The `ControllerState.snapshot()` dict as the proto `ControllerStatus` (eta -1 = unbounded)."""
    return controller_pb2.ControllerStatus(
        current_version=snap["current_version"],
        admitted=snap["admitted"],
        batch_size=snap["batch_size"],
        eta=-1 if snap["eta"] is None else snap["eta"],
        held_requests=snap["held_requests"],
        replicas=[controller_pb2.ReplicaStatus(**r) for r in snap["replicas"]],
        pushes_committed=snap["pushes_committed"],
        leases_expired=snap["leases_expired"],
    )


def create_server(
    config: AsyncRLConfig, run_dir: str | None = None, notify: WeightNotifier | None = None
) -> tuple[grpc.Server, int]:
    """The controller's gRPC server, not started; the state is `server.controller_state` (see module doc)."""
    auth = resolve_auth(config.security)
    run_dir = run_dir or config.run_dir
    events = EventLog(run_dir, "controller")
    state = ControllerState(
        config.controller, config.learner.batch_size, events=events,
        notify=notify or functools.partial(grpc_update_weights, auth=auth),
        store=make_store(config), run_id=str(run_dir),
    )
    state.start_reaper()
    servicer = ControllerServicer(state)
    server, port, _health = build_server(
        config.controller.host,
        config.controller.port,
        [lambda s: controller_pb2_grpc.add_ControllerServicer_to_server(servicer, s)],
        [SERVICE_NAME],
        auth,
        max_workers=_MAX_WORKERS,
    )
    server.controller_state = state
    return server, port


def serve(config: AsyncRLConfig) -> None:
    """Run the controller until SIGTERM/SIGINT: gRPC, the status page, the reaper."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s controller %(levelname)s %(message)s")
    server, port = create_server(config)
    state: ControllerState = server.controller_state
    host = config.controller.host
    page = StatusPage(state, host, config.controller.status_port)
    http_port = page.start()
    server.start()
    cc = config.controller
    state.events.write("controller_started", grpc=f"{host}:{port}", http=f"{host}:{http_port}",
                       eta=state.eta, batch_size=state.batch_size, start_version=cc.start_version,
                       start_admitted=cc.start_admitted, start_prompt_index=cc.start_prompt_index,
                       state_store=cc.state_store, restored=state.restored)  # fmt: skip
    print(f"asyncrl-controller listening grpc={host}:{port} http={host}:{http_port}", flush=True)
    wait_until_stopped(server, on_stop=page.stop)
    state.close()


# ---- validation and error translation ------------------------------------------------------------------


def _answer(context: grpc.ServicerContext, run):
    """Run one RPC body; controller and validation errors become status codes naming the field."""
    try:
        return run()
    except UnknownReplica as err:
        code, message = grpc.StatusCode.NOT_FOUND, str(err)
    except (InvalidArgument, InvalidRequest) as err:
        code, message = grpc.StatusCode.INVALID_ARGUMENT, str(err)
    except RegistryFull as err:
        code, message = grpc.StatusCode.RESOURCE_EXHAUSTED, str(err)
    except PreconditionFailed as err:
        code, message = grpc.StatusCode.FAILED_PRECONDITION, str(err)
    context.abort(code, message)
