"""The controller's wire translation, beside its gRPC edge (`controller_service`): the acks a learner relays
in CommitWeightPushRequest, the progress figures of a LearnerHeartbeatRequest, a state snapshot as
`ControllerStatus`, and controller and validation errors as gRPC status codes (the message names the field or
the rule)."""

from __future__ import annotations

import grpc

from asyncrl.controller.errors import (
    ControllerStopping,
    InvalidRequest,
    LearnerSeatTaken,
    LearnerSeatUnconfirmed,
    NotTheLearner,
    NotTheReplica,
    PreconditionFailed,
    RegistryFull,
    ReplicaIdInUse,
    UnknownReplica,
)
from asyncrl.controller.results import LearnerFigures
from asyncrl.core.checks.validation import MAX_COUNT, InvalidArgument, check_range, require, shown
from asyncrl.core.records.learner_figures import BY_NAME
from asyncrl.push.manifest import check_digest
from asyncrl.push.protocol import PushRefused
from asyncrl.push.session import PushSession, ReceiverAck
from asyncrl.v1 import controller_pb2

MAX_ERROR = 4096
"""Characters of an error message in CommitWeightPush (the sender's, a receiver's ack)."""
MAX_ACKS = 4096
"""Acks in one CommitWeightPush (as many receivers as one push may have)."""


def receiver_acks(acks) -> tuple[ReceiverAck, ...]:
    """CommitWeightPushRequest.acks, every field checked."""
    require(len(acks) <= MAX_ACKS, "acks", f"at most {MAX_ACKS} acks, got {len(acks)}")
    seen = set()
    for i, ack in enumerate(acks):
        check_range(ack.rank, 1, MAX_COUNT, f"acks[{i}].rank")
        require(ack.rank not in seen, f"acks[{i}].rank", f"rank {ack.rank} is acknowledged twice")
        seen.add(ack.rank)
        check_range(ack.weight_version, 0, MAX_COUNT, f"acks[{i}].weight_version")
        require(len(ack.ack_mac) <= 64, f"acks[{i}].ack_mac", f"at most 64 bytes, got {len(ack.ack_mac)}")
        require(len(ack.error) <= MAX_ERROR, f"acks[{i}].error",
                f"at most {MAX_ERROR} characters, got {len(ack.error)}")
        check_digest(ack.adapter_checksum, f"acks[{i}].adapter_checksum", optional=True)
    return tuple(ReceiverAck(a.rank, a.weight_version, a.ack_mac, a.error, a.adapter_checksum) for a in acks)


def learner_figures(request) -> LearnerFigures | None:
    """The figures of a LearnerHeartbeatRequest, each a declared one (`learner_figures.FIGURES`), finite and in
    its range; None when it carries none."""
    require(len(request.figures) <= len(BY_NAME), "figures", f"at most {len(BY_NAME)} figures")
    for name, value in request.figures.items():
        field = f"figures[{shown(name)}]"
        figure = BY_NAME.get(name)
        require(figure is not None, field, f"is not a figure the learner reports (one of {sorted(BY_NAME)})")
        check_range(value, figure.low, figure.high, field)
    if not request.figures:
        return None
    return LearnerFigures(total_steps=request.total_steps, values=dict(request.figures))


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
        open_push=_push_status(snap["open_push"]),
        reserved_push=_push_status(snap["reserved_push"]),
    )


def _push_status(view: dict | None) -> controller_pb2.PushStatus | None:
    return None if view is None else controller_pb2.PushStatus(**view)


ERRORS = (UnknownReplica, InvalidArgument, InvalidRequest, RegistryFull, PreconditionFailed, PushRefused,
          ReplicaIdInUse, LearnerSeatTaken, LearnerSeatUnconfirmed, NotTheLearner, NotTheReplica,
          ControllerStopping)


def status_of(err: Exception) -> tuple[grpc.StatusCode, str]:
    """The status code of a controller or validation error (UnknownReplica is an InvalidRequest: first)."""
    if isinstance(err, UnknownReplica):
        return grpc.StatusCode.NOT_FOUND, str(err)
    if isinstance(err, (InvalidArgument, InvalidRequest)):
        return grpc.StatusCode.INVALID_ARGUMENT, str(err)
    if isinstance(err, RegistryFull):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(err)
    if isinstance(err, (ReplicaIdInUse, LearnerSeatTaken)):
        return grpc.StatusCode.ALREADY_EXISTS, str(err)
    if isinstance(err, (LearnerSeatUnconfirmed, ControllerStopping)):
        return grpc.StatusCode.UNAVAILABLE, str(err)
    if isinstance(err, (NotTheLearner, NotTheReplica)):
        return grpc.StatusCode.PERMISSION_DENIED, str(err)
    return grpc.StatusCode.FAILED_PRECONDITION, str(err)


def check_replica_call(state, request) -> None:
    """A replica's call that moves the run is its registration's own (`replica_proof`; `state` a
    `ControllerState`)."""
    require(len(request.replica_proof) <= 64, "replica_proof", f"at most 64 bytes, got {len(request.replica_proof)}")
    state.check_replica(request.replica_id, request.replica_proof)


def answer(context: grpc.ServicerContext, run):
    """Run one RPC body (on a worker thread); controller and validation errors become status codes naming
    the field."""
    try:
        return run()
    except ERRORS as err:
        context.abort(*status_of(err))


def begin_response(session: PushSession) -> controller_pb2.BeginWeightPushResponse:
    """A push's plan as BeginWeightPush answers it (and CommitWeightPush, for the push it reserved)."""
    return controller_pb2.BeginWeightPushResponse(
        plan=session.plan.to_proto(), receivers=[r.replica_id for r in session.receivers],
        in_band=session.in_band, order_macs=session.order_macs, after_push_id=session.after_push_id,
        receiver_addresses=[r.address for r in session.receivers] if session.in_band else [],
    )
