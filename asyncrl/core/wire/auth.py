"""Who may call a service: a shared secret on every gRPC call, request bytes checked before any handler, and
push orders signed per replica.

Every server built by `asyncrl.core.wire.grpc_util.build_server` runs `GuardInterceptor` and every client channel
from `grpc_util.channel` attaches the token (`TokenInterceptor`). The token comes from `security.token_file`
(e.g. a mounted Kubernetes Secret) or the environment variable `security.token_env`; `asyncrl up` generates one
per run. A process without a token refuses to start unless `security.insecure` says so explicitly.

The guard answers, before the service sees anything:
- UNAUTHENTICATED for a missing or wrong token (compared in constant time), without reading the request; the
  health service stays open, since orchestrators probe it without credentials and it reveals nothing but
  SERVING;
- RESOURCE_EXHAUSTED for a request over its method's bound (`asyncrl.core.wire.limits`);
- INVALID_ARGUMENT for request bytes that are not the method's message (instead of grpc's INTERNAL).

A replica takes a weight push only when its controller ordered it: registration hands the replica a fresh
`push_key`, and every `Rollout.UpdateWeights` the controller sends carries `push_order_mac` of the order under
that key (a caller with the token but not the key cannot replace a replica's weights). The same key proves a
registration's holder alive (`liveness_mac`): an id whose holder still answers cannot be registered again.
The replica's calls that move the run (heartbeat, leases, completions) carry `replica_call_mac` under it.
The learner holds the run's seat the same way (`Controller.RegisterLearner` hands it a `learner_key`): the
calls that push weights or move the timeline need that key, so a caller with the token cannot make them.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from asyncrl.core.checks.config_error import ConfigError
from asyncrl.core.wire.limits import request_limit

METADATA_KEY = "authorization"
SCHEME = "Bearer "
OPEN_SERVICES = ("/grpc.health.v1.Health/",)
TOKEN_BYTES = 32
MAX_CHALLENGE = 64
"""Bytes of a liveness challenge a replica or the learner answers (`liveness_mac`)."""


class MissingToken(ConfigError):
    """No token configured and `security.insecure` not set."""


@dataclass(frozen=True)
class Tls:
    """The PEM bytes of `security.tls_*`, read once at start."""

    cert: bytes
    key: bytes
    ca: bytes | None
    client_auth: bool
    server_name: str | None = None

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.ca,
                                           require_client_auth=self.client_auth)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        if self.client_auth:
            return grpc.ssl_channel_credentials(self.ca, private_key=self.key, certificate_chain=self.cert)
        return grpc.ssl_channel_credentials(self.ca)


@dataclass(frozen=True)
class Auth:
    """The resolved credentials of one process."""

    token: str | None
    """The shared secret; None only when `security.insecure` is set."""
    tls: Tls | None = None
    """Certificates when `security.tls_cert_file` is set: servers listen with TLS, clients verify it."""


def new_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


def new_push_key() -> bytes:
    return secrets.token_bytes(TOKEN_BYTES)


def push_order_mac(key: bytes, plan, rank: int) -> bytes:
    """The controller's signature on one push order (a `push.plan.PushPlan`) for one replica (HMAC-SHA256
    under its push key): the push, the replica's rank, where to join (store and its key, transport, group),
    which manifest or tensors to load, the bucket size and the time-outs (every field a receiver acts on;
    rollout.proto has the text)."""
    fields = ("order", plan.push_id, plan.version, rank, plan.world_size, plan.store_address,
              plan.store_key.hex(), plan.transport, plan.group_id, int(plan.new_group), plan.manifest_digest,
              plan.bucket_bytes, round(plan.timeout_s * 1000), round(plan.join_timeout_s * 1000), tensors_digest(plan.tensors))
    if plan.adapter is not None:  # an adapter push signs its shape too (a plan naming a manifest has none here)
        fields += (plan.adapter.rank, plan.adapter.alpha, ",".join(plan.adapter.target_modules))
    if plan.checksum_in_store:  # a receiver that trusted a plan without it would serve unchecked weights
        fields += ("checksum_in_store",)
    if plan.sparse_deltas:  # it changes how the receiver reads the stream
        fields += ("sparse_deltas",)
    return hmac.new(key, "\n".join(map(str, fields)).encode(), "sha256").digest()


def tensors_digest(tensors) -> str:
    """SHA-256 (hex) of a plan's tensor list as text, one "name dtype shape" line per tensor (shape as
    dimensions joined by "x"; "" for a scalar); "" for no tensors (a plan that names a manifest)."""
    if not tensors:
        return ""
    lines = (f"{t.name} {t.dtype} {'x'.join(map(str, t.shape))}" for t in tensors)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def push_ack_mac(key: bytes, push_id: str, rank: int, weight_version: int, adapter_checksum: str = "") -> bytes:
    """A replica's signature on its acknowledgement of an in-band push (`push.in_band`; HMAC-SHA256 under its
    push key): the learner relays it, and the controller counts only what the replica itself signed. An adapter
    push's ack also signs the checksum of the adapter the replica serves (a fifth line)."""
    fields = ("ack", push_id, rank, weight_version) + ((adapter_checksum,) if adapter_checksum else ())
    return hmac.new(key, "\n".join(map(str, fields)).encode(), "sha256").digest()


def replica_call_mac(key: bytes, replica_id: str) -> bytes:
    """A replica's proof, on every call that moves the run (heartbeat, leases, completions), that it holds the
    registration of `replica_id` (HMAC-SHA256 under its push key): a token holder cannot speak for another
    replica's id."""
    return hmac.new(key, f"replica\n{replica_id}".encode(), "sha256").digest()


def liveness_mac(key: bytes, challenge: bytes) -> bytes:
    """A replica's (or the learner's) answer to the controller's liveness challenge (HMAC-SHA256 under its push
    key, or learner key): only the process holding the registration's key can give it."""
    return hmac.new(key, b"alive\n" + challenge, "sha256").digest()


def answers_challenge(probe, address: str, key: bytes) -> bool | None:
    """Send the process at `address` a fresh random challenge through `probe` ((address, challenge) -> its
    answer, None when none came; a network call: outside any lock): whether it answered under `key`, or None
    when no answer came."""
    challenge = secrets.token_bytes(32)
    answer = probe(address, challenge)
    return None if answer is None else hmac.compare_digest(answer, liveness_mac(key, challenge))


def resolve_auth(security) -> Auth:
    """The credentials of `security` (a SecurityConfig): the token (the file, else the environment variable)
    and the TLS certificates when configured."""
    return Auth(_token(security), _tls(security))


def _tls(security) -> Tls | None:
    if not (security.tls_cert_file or security.tls_key_file):
        if security.tls_client_auth:
            raise ConfigError("security.tls_client_auth: needs security.tls_cert_file and tls_key_file")
        return None

    def pem(field: str, required: bool = True) -> bytes | None:
        path = getattr(security, field)
        if not path:
            if required:
                raise ConfigError(f"security.{field}: required with security.tls_cert_file / tls_key_file")
            return None
        if not Path(path).is_file():
            raise ConfigError(f"security.{field}: {path} does not exist")
        return Path(path).read_bytes()

    ca = pem("tls_ca_file", required=security.tls_client_auth)
    return Tls(pem("tls_cert_file"), pem("tls_key_file"), ca, security.tls_client_auth, security.tls_server_name)


def read_secret(security, name: str, missing: type[ConfigError], hint: str) -> str | None:
    """The secret `security.<name>_file` holds, else the environment variable `security.<name>_env` names; None
    only with `security.insecure`. `missing` (naming the keys, then `hint`) when neither is set, or the file is
    absent or empty."""
    file = getattr(security, f"{name}_file")
    if file:
        path = Path(file)
        if not path.is_file():
            raise missing(f"security.{name}_file: {path} does not exist")
        secret = path.read_text().strip()
        if not secret:
            raise missing(f"security.{name}_file: {path} is empty")
        return secret
    env = getattr(security, f"{name}_env")
    secret = os.environ.get(env, "").strip()
    if secret:
        return secret
    if security.insecure:
        return None
    raise missing(f"no {name.replace('_', ' ')}: set security.{name}_file or the environment variable {env} {hint}")


def _token(security) -> str | None:
    return read_secret(security, "token", MissingToken,
                       "(asyncrl up generates one per run), or security.insecure: true to accept unauthenticated calls")


def _refusal(code: grpc.StatusCode, message: str, method: str, metrics, on_loop: bool) -> grpc.RpcMethodHandler:
    """A handler that answers `code` without reading the request: a stream handler never asks for the
    message, so the bytes an unauthenticated caller sends stay in the transport's flow-control window (a
    unary handler would have read up to `MAX_MESSAGE_BYTES` of each first: 8 refused 200 MiB calls took a
    server from 43 MB to 1.8 GB, 3.1 GB on the asyncio one). Counted in `metrics` like any call."""
    metrics = metrics or _NO_METRICS

    if on_loop:
        async def refuse(_requests, context):
            metrics.done(metrics.start(method), code, 0.0)
            await context.abort(code, message)
    else:
        def refuse(_requests, context):
            metrics.done(metrics.start(method), code, 0.0)
            context.abort(code, message)

    return grpc.stream_unary_rpc_method_handler(refuse)


def _parse_checked(handler: grpc.RpcMethodHandler, method: str, metrics=None) -> grpc.RpcMethodHandler:
    """The same handler, taking raw bytes and parsing them itself, so undecodable bytes get INVALID_ARGUMENT
    and a request over its method's bound RESOURCE_EXHAUSTED (`asyncrl.core.wire.limits`);
    timed and counted by status code in `metrics` (an `asyncrl.core.runtime.metrics.RpcMetrics`) when given.
    Coroutine handlers (an asyncio server's) get a coroutine wrapper."""
    parse = handler.request_deserializer
    if not handler.unary_unary:
        return handler
    behaviour = handler.unary_unary

    limit = request_limit(method)

    def request_of(raw: bytes):
        if len(raw) > limit:
            return None, (grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"request of {len(raw)} bytes is over {method}'s limit of {limit} bytes")
        if parse is None:
            return raw, None
        try:
            return parse(raw), None
        except Exception as err:  # noqa: BLE001 - any parse failure is the caller's bytes
            return None, (grpc.StatusCode.INVALID_ARGUMENT,
                          f"request is not a valid message for {method}: {type(err).__name__}")

    metrics = metrics or _NO_METRICS
    if inspect.iscoroutinefunction(behaviour):
        async def checked(raw: bytes, context):
            labels, started, recorded, failed = metrics.start(method), time.perf_counter(), _CodeRecorder(context), True
            try:
                request, invalid = request_of(raw)
                if invalid:
                    await recorded.abort(*invalid)
                answer = await behaviour(request, recorded)
                failed = False
                return answer
            finally:
                metrics.done(labels, recorded.outcome(failed), time.perf_counter() - started)
    else:
        def checked(raw: bytes, context):
            labels, started, recorded, failed = metrics.start(method), time.perf_counter(), _CodeRecorder(context), True
            try:
                request, invalid = request_of(raw)
                if invalid:
                    recorded.abort(*invalid)
                answer = behaviour(request, recorded)
                failed = False
                return answer
            finally:
                metrics.done(labels, recorded.outcome(failed), time.perf_counter() - started)

    return grpc.unary_unary_rpc_method_handler(checked, request_deserializer=None,
                                               response_serializer=handler.response_serializer)


class _NoMetrics:
    def start(self, method: str) -> None:
        return None

    def done(self, labels, code, seconds: float) -> None:
        pass


_NO_METRICS = _NoMetrics()


class _CodeRecorder:
    """A servicer context that remembers the status code a handler sets (abort, set_code): the context of a
    plain function on an asyncio server has no code()."""

    def __init__(self, context):
        self._context, self.code = context, None

    def outcome(self, failed: bool) -> grpc.StatusCode:
        return self.code or (grpc.StatusCode.UNKNOWN if failed else grpc.StatusCode.OK)

    def abort(self, code, details=""):
        # The asyncio health servicer aborts with a code alone (NOT_FOUND for an unknown service).
        self.code = code
        return self._context.abort(code, details)

    def set_code(self, code):
        self.code = code
        return self._context.set_code(code)

    def __getattr__(self, name):
        return getattr(self._context, name)


class _Guard:
    """The guard's decisions, shared by the thread-pool and the asyncio interceptors."""

    def __init__(self, auth: Auth, metrics=None, on_loop: bool = False):
        self._metrics, self._on_loop = metrics, on_loop
        self._expected = None if auth.token is None else (SCHEME + auth.token).encode()
        # method -> its parse-checked handler, built once (a handler per call would be work on every RPC).
        self._checked: dict[str, grpc.RpcMethodHandler] = {}

    def refusal(self, handler_call_details) -> grpc.RpcMethodHandler | None:
        """A handler answering UNAUTHENTICATED (counted like any call), or None when the call may proceed."""
        method = handler_call_details.method
        if self._expected is None or method.startswith(OPEN_SERVICES):
            return None
        supplied = dict(handler_call_details.invocation_metadata or ()).get(METADATA_KEY)
        if supplied is None:
            why = "missing token (metadata 'authorization: Bearer ...')"
        elif not hmac.compare_digest(supplied.encode(), self._expected):
            why = "invalid token"
        else:
            return None
        return _refusal(grpc.StatusCode.UNAUTHENTICATED, why, method, self._metrics, self._on_loop)

    def checked(self, method: str, handler: grpc.RpcMethodHandler | None) -> grpc.RpcMethodHandler | None:
        if handler is None:
            return None
        checked = self._checked.get(method)
        if checked is None:
            checked = self._checked[method] = _parse_checked(handler, method, self._metrics)
        return checked


class GuardInterceptor(grpc.ServerInterceptor):
    """The guard of a thread-pool server."""

    def __init__(self, auth: Auth, metrics=None):
        self._guard = _Guard(auth, metrics)

    def intercept_service(self, continuation, handler_call_details):
        refused = self._guard.refusal(handler_call_details)
        if refused is not None:
            return refused
        return self._guard.checked(handler_call_details.method, continuation(handler_call_details))


class AioGuardInterceptor(grpc.aio.ServerInterceptor):
    """The guard of an asyncio server (`asyncrl.core.wire.grpc_util.build_aio_server`)."""

    def __init__(self, auth: Auth, metrics=None):
        self._guard = _Guard(auth, metrics, on_loop=True)

    async def intercept_service(self, continuation, handler_call_details):
        refused = self._guard.refusal(handler_call_details)
        if refused is not None:
            return refused
        return self._guard.checked(handler_call_details.method, await continuation(handler_call_details))


class TokenInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                       grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self, token: str):
        self._metadata = (METADATA_KEY, SCHEME + token)

    def _details(self, details):
        metadata = [*(details.metadata or ()), self._metadata]
        return _Details(details.method, details.timeout, metadata, details.credentials, details.wait_for_ready,
                        details.compression)

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)


@dataclass(frozen=True)
class _Details(grpc.ClientCallDetails):
    method: str
    timeout: float | None
    metadata: list
    credentials: object
    wait_for_ready: bool | None
    compression: object
