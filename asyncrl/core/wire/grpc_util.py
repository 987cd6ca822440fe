"""gRPC plumbing shared by the four services: server construction (health + reflection), validation,
client channels, graceful stop. (Request checks themselves: `asyncrl.core.checks.validation`.)"""

from __future__ import annotations

import json
import signal
import socket
import threading
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from asyncrl.core.checks.validation import InvalidArgument
from asyncrl.core.runtime.metrics import RpcMetrics
from asyncrl.core.wire.auth import Auth, GuardInterceptor, TokenInterceptor
from asyncrl.core.wire.limits import CALLS_IN_FLIGHT, server_request_limit

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
MESSAGE_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
"""A client's: answers may be large. A server reads requests under `server_options`."""


def server_options(service_names: list[str]) -> list[tuple[str, int]]:
    """A server's message bounds: answers up to `MAX_MESSAGE_BYTES`, requests up to the largest bound of the
    methods it serves (`asyncrl.core.wire.limits`). The receive window stays at HTTP/2's initial 64 KiB per
    stream (no bandwidth-delay probing): with probing, the transport took in megabytes of each refused
    request before the refusal (8 refused 200 MiB calls grew the controller by 89 MB; without, by 1 MB).
    On loopback a 16 MiB request takes 16 ms either way; over a link with delay a request moves at most 64 KiB
    per round trip, which only the token batches of Generate and Score come near. Answers, read by clients,
    keep probing."""
    return [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", server_request_limit(service_names)),
            ("grpc.http2.bdp_probe", 0)]


def abort_invalid(context: grpc.ServicerContext, err: InvalidArgument):
    context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))


def build_server(
    host: str,
    port: int,
    register: list,
    service_names: list[str],
    auth: Auth,
    max_workers: int = 16,
    registry=None,
    calls_in_flight: int = CALLS_IN_FLIGHT,
) -> tuple[grpc.Server, int, health.HealthServicer]:
    """A started-ready (not yet started) server with `register` callbacks applied, grpc.health.v1 and
    reflection registered for `service_names` (full names, e.g. "asyncrl.v1.Controller"), every call guarded
    by `asyncrl.core.wire.auth.GuardInterceptor` (token, undecodable bytes) and, with a Prometheus `registry`, timed and
    counted per method and status code (`asyncrl.core.runtime.metrics.RpcMetrics`). Requests are bounded by
method and at most `calls_in_flight` calls are served or queued at once (`asyncrl.core.wire.limits`)."""
    metrics = RpcMetrics(registry) if registry is not None else None
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers), options=server_options(service_names),
                         interceptors=[GuardInterceptor(auth, metrics)], maximum_concurrent_rpcs=calls_in_flight)
    for add in register:
        add(server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in [*service_names, ""]:
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection([*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    bound = add_port(server, f"{host}:{port}", auth)
    if bound == 0:
        raise OSError(f"could not bind gRPC server to {host}:{port}")
    return server, bound, health_servicer


# Client channels reconnect to a peer that went away every second at most (gRPC's default backs off to two
# minutes): a run's peers are few, and a restarted controller, teacher or replica should be noticed as soon as
# it serves again, not at the next of ever rarer attempts (measured: a killed teacher stalled an η = 0 demo
# 5.2 s with the defaults, for a teacher that serves 3.4 s after its spawn).
RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
]

# A patient channel's calls ride out a server restart: they wait for the server (within their deadline)
# instead of failing at once, and a call cut off by the server's death (UNAVAILABLE) is sent again. Not
# RegisterLearner: its seat proof is good once, so the same request sent again is refused as a replay; the
# learner retries it itself, with a fresh proof (`learner/seat.py`).
_PATIENT_SERVICE_CONFIG = json.dumps({"methodConfig": [{
    "name": [{}],
    "waitForReady": True,
    "retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.5s", "maxBackoff": "4s", "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"]},
}, {
    "name": [{"service": "asyncrl.v1.Controller", "method": "RegisterLearner"}],
    "waitForReady": True,
}]})  # fmt: skip


def add_port(server, address: str, auth: Auth) -> int:
    """Listen on `address`: with TLS when `auth` has certificates, else plaintext. Returns the bound port."""
    if auth.tls is not None:
        return server.add_secure_port(address, auth.tls.server_credentials())
    return server.add_insecure_port(address)


def channel(address: str, auth: Auth, patient: bool = False) -> grpc.Channel:
    """A client channel that sends `auth`'s token with every call, over TLS when `auth` has certificates
    (verifying the server against the configured CA, presenting the client certificate for mutual TLS). `patient`: for a server that restarts
    (the controller): calls wait for it within their deadline and are retried when cut off (UNAVAILABLE);
    a call whose request was processed before the cut-off can then arrive twice (the controller's calls
    are idempotent or answered FAILED_PRECONDITION the second time)."""
    options = [*MESSAGE_OPTIONS, *RECONNECT_OPTIONS]
    if patient:
        options.append(("grpc.service_config", _PATIENT_SERVICE_CONFIG))
    if auth.tls is None:
        ch = grpc.insecure_channel(address, options=options)
    else:
        if auth.tls.server_name:
            options = [*options, ("grpc.ssl_target_name_override", auth.tls.server_name)]
        ch = grpc.secure_channel(address, auth.tls.channel_credentials(), options=options)
    return ch if auth.token is None else grpc.intercept_channel(ch, TokenInterceptor(auth.token))


def wait_for_channel(address: str, timeout_s: float, auth: Auth, patient: bool = False) -> grpc.Channel:
    ch = channel(address, auth, patient)
    grpc.channel_ready_future(ch).result(timeout=timeout_s)
    return ch


def wait_until_stopped(server: grpc.Server, on_stop=None, grace_s: float = 5.0) -> None:
    """Block until SIGTERM/SIGINT, then stop gracefully: `on_stop` first, then the server with a grace period."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    if on_stop is not None:
        on_stop()
    server.stop(grace_s).wait()


def peer_host(peer: str) -> str:
    """The host of a gRPC peer string: "ipv4:10.0.0.5:41234" -> "10.0.0.5", "ipv6:[::1]:41234" -> "[::1]";
    anything else (a unix socket) whole."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6") and ":" in rest:
        return rest.rpartition(":")[0]
    return peer


def dial(address: str, timeout_s: float) -> bool | None:
    """Whether something accepts a TCP connection at `address` (host:port, [v6]:port): True, False when it is
    refused (the host is there, the port closed: no process listens there any more), None when there is no
    answer in time (that says nothing: a hung process, a slow network)."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except ConnectionRefusedError:
        return False
    except (OSError, ValueError):
        return None
    return True


def address_refuses(address: str, timeout_s: float = 1.0) -> bool:
    """A TCP connection to `address` is refused: no process listens there any more (the controller's check
    of a silent lease holder, the learner's of an in-band receiver that does not join). A time-out or an
    unreachable network says nothing and gives False."""
    return dial(address, timeout_s) is False
