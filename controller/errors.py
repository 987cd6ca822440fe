"""Errors the controller's pure logic raises; the gRPC edge maps them to status codes.

Kept free of grpc so the logic stays testable without a server: `InvalidRequest` becomes INVALID_ARGUMENT
(the request itself is wrong: more written than leased), `UnknownReplica` NOT_FOUND, `RegistryFull`
RESOURCE_EXHAUSTED, `ReplicaIdInUse` and `LearnerSeatTaken` ALREADY_EXISTS, `LearnerSeatUnconfirmed` UNAVAILABLE
(retry later), `NotTheLearner` and `NotTheReplica` PERMISSION_DENIED, `ControllerStopping` UNAVAILABLE (ask the next controller),
`PreconditionFailed` becomes FAILED_PRECONDITION (the request is well formed but the controller's state forbids it: an expired
lease, a push already open, a version that is neither current nor current+1).
"""

from __future__ import annotations


class ControllerError(Exception):
    """Base of the errors the service edge translates."""


class InvalidRequest(ControllerError, ValueError):
    """A field of the request is wrong; the message starts with the field name."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field


class PreconditionFailed(ControllerError):
    """The request cannot be served in the controller's current state."""


class UnknownReplica(InvalidRequest):
    """No replica is registered under the id (NOT_FOUND: the replica registers again)."""


class RegistryFull(ControllerError):
    """controller.max_replicas are registered (RESOURCE_EXHAUSTED)."""


class ReplicaIdInUse(ControllerError):
    """A live replica, which proved it holds the registration, already has the id (ALREADY_EXISTS)."""


class LearnerSeatTaken(ControllerError):
    """A live learner, which proved it holds the seat, trains this run (ALREADY_EXISTS)."""


class LearnerSeatUnconfirmed(ControllerError):
    """The seat's holder could not be challenged and still heartbeats (UNAVAILABLE: the caller retries once the
    holder has been silent for controller.heartbeat_timeout_s)."""


class NotTheLearner(ControllerError):
    """A learner-only call without the seated learner's key (PERMISSION_DENIED)."""


class NotTheReplica(ControllerError):
    """A replica's call without its registration's proof (PERMISSION_DENIED)."""


class ControllerStopping(ControllerError):
    """The controller is shutting down while a request was held (UNAVAILABLE: ask again)."""
