"""What a server reads and holds at once: a bound on each request by method, and a cap on calls in flight.

No asyncrl RPC carries weights (they travel over the push's transport), so requests are small; the two that
carry token batches, `Rollout.Generate` and `Teacher.Score`, get more room. A server's transport refuses a
message above the largest bound of the methods it serves before reading it (`server_options`); the guard
then answers RESOURCE_EXHAUSTED, naming the method and its bound, for a request above its own method's bound
(`asyncrl.core.wire.auth`). Responses keep the wide client limit (`grpc_util.MAX_MESSAGE_BYTES`): a
Generate answer with per-token log-probs and expert ids can be large. Calls beyond a server's cap get
RESOURCE_EXHAUSTED from gRPC without being read.
"""

from __future__ import annotations

MIB = 1 << 20
DEFAULT_REQUEST_BYTES = 4 * MIB
"""Every method not in `REQUEST_BYTES` (gRPC's own default)."""
REQUEST_BYTES = {
    "/asyncrl.v1.Rollout/Generate": 64 * MIB,
    "/asyncrl.v1.Teacher/Score": 64 * MIB,
}
"""Methods whose requests carry token batches."""
CALLS_IN_FLIGHT = 256
"""A thread-pool server's cap on calls in flight (its handlers answer in milliseconds to seconds)."""
HELD_CALLS_PER_REPLICA = 2
"""The controller holds each replica's lease wait and takes its heartbeat at the same time."""
CONTROLLER_SPARE_CALLS = 64
"""The controller's calls beyond its replicas' (the learner's, `up`'s, status readers')."""


def request_limit(method: str) -> int:
    """The most bytes a request to `method` ("/package.Service/Method") may hold."""
    return REQUEST_BYTES.get(method, DEFAULT_REQUEST_BYTES)


def server_request_limit(service_names: list[str]) -> int:
    """The largest request any method of `service_names` may take: the transport's bound."""
    prefixes = tuple(f"/{name}/" for name in service_names)
    return max([DEFAULT_REQUEST_BYTES, *(n for m, n in REQUEST_BYTES.items() if m.startswith(prefixes))])


def controller_calls_in_flight(max_replicas: int) -> int:
    """The controller's cap: every admitted replica's held calls, and room for the rest."""
    return HELD_CALLS_PER_REPLICA * max_replicas + CONTROLLER_SPARE_CALLS
