"""An asyncio gRPC server with the synchronous face of `grpc.Server`, for a service whose calls wait long.

A thread-pool server pins one thread per call in flight: a controller holding hundreds of `AcquireLease`
calls (the staleness bound says "not yet") runs out of threads, and heartbeats queue behind them. On an
asyncio server a waiting call is a suspended coroutine, not a thread. Handlers may be plain functions (they
run on `migration_workers` threads, as on a thread-pool server) or coroutines (they run on the event loop and
must not block it).

`build_aio_server` returns an `AioServerThread`: the server and its event loop on a thread of their own, with
`start()`, `stop(grace) -> threading.Event` and `wait_for_termination()`, so callers, tests and
`asyncrl.core.wire.grpc_util.wait_until_stopped` treat it like any other server. `Wakeup` lets threads wake the
coroutines that wait on the loop.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent import futures

import grpc
from grpc_health.v1 import _async as health_async
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from asyncrl.core.runtime.metrics import RpcMetrics
from asyncrl.core.wire.auth import AioGuardInterceptor, Auth
from asyncrl.core.wire.grpc_util import add_port, server_options
from asyncrl.core.wire.limits import CALLS_IN_FLIGHT


class AioServerThread:
    def __init__(self, loop: asyncio.AbstractEventLoop, thread: threading.Thread):
        self.loop, self._thread = loop, thread
        self._server: grpc.aio.Server | None = None
        self._stopped = threading.Event()

    def call(self, coroutine, timeout_s: float | None = 30.0):
        """Run a coroutine on the server's loop from another thread and return its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def start(self) -> None:
        self.call(self._server.start())

    def stop(self, grace: float | None) -> threading.Event:
        """Stop serving (calls in flight get `grace` seconds), then end the loop; the event is set when done."""
        if self._stopped.is_set() or not self.loop.is_running():
            self._stopped.set()
            return self._stopped

        def finished(_future) -> None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._stopped.set()

        asyncio.run_coroutine_threadsafe(self._server.stop(grace), self.loop).add_done_callback(finished)
        return self._stopped

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)


class Wakeup:
    """Wakes every coroutine waiting in `wait` when any thread calls `notify` (a broadcast, like
    `threading.Condition.notify_all`, for coroutines on one loop)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._event = asyncio.Event()  # replaced at every wake-up: waiters of a later round wait afresh

    def notify(self) -> None:
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._fire)

    def _fire(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()

    async def wait(self, timeout_s: float) -> None:
        """Until the next `notify` or `timeout_s`, whichever is first (call on the loop)."""
        event = self._event
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except TimeoutError:
            pass


def build_aio_server(host: str, port: int, register: list, service_names: list[str], auth: Auth,
                     migration_workers: int = 32, registry=None,
                     calls_in_flight: int = CALLS_IN_FLIGHT) -> tuple[AioServerThread, int]:
    """Like `grpc_util.build_server`: `register` callbacks applied, grpc.health.v1 (SERVING for
    `service_names`) and reflection, every call guarded by `AioGuardInterceptor`, requests bounded by method,
    at most `calls_in_flight` at once (held ones included); not yet started. Returns
    the server and the bound port; `register` callbacks may use `server.loop`."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name=f"grpc-aio-{port}", daemon=True)
    thread.start()
    handle = AioServerThread(loop, thread)

    async def build() -> int:
        server = grpc.aio.server(migration_thread_pool=futures.ThreadPoolExecutor(max_workers=migration_workers),
                                 options=server_options(service_names), maximum_concurrent_rpcs=calls_in_flight,
                                 interceptors=[AioGuardInterceptor(auth, RpcMetrics(registry) if registry is not None else None)])
        handle._server = server
        for add in register:
            add(server)
        health_servicer = health_async.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        for name in [*service_names, ""]:
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        reflection.enable_server_reflection([*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
        return add_port(server, f"{host}:{port}", auth)

    try:
        bound = handle.call(build())
    except Exception:
        loop.call_soon_threadsafe(loop.stop)
        raise
    if bound == 0:
        loop.call_soon_threadsafe(loop.stop)
        raise OSError(f"could not bind gRPC server to {host}:{port}")
    return handle, bound
