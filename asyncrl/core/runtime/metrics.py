"""Prometheus metrics: each service keeps its own CollectorRegistry (several services can share a test
process) and serves it on /metrics on its own port.

`service_registry(service, run)` is where a service's registry starts: the process, platform and
garbage-collector collectors, and `asyncrl_service_info{service, version}`; a named run's registry (`run_name`,
each run of `runs:`) adds `run="<name>"` to every series it exposes, so one Prometheus tells the runs apart.
`RpcMetrics` are the per-RPC series every gRPC server keeps (through the guard interceptor,
`asyncrl.core.wire.auth`), named as the gRPC ecosystem names them: `grpc_server_started_total`,
`grpc_server_handled_total{grpc_code}` and `grpc_server_handling_seconds`, each labelled `grpc_service` and
`grpc_method`; refused calls (UNAUTHENTICATED, INVALID_ARGUMENT) count too. Only methods some server of the
project serves get labels of their own (`known_methods`): any other path a caller names, with or without the
token, counts under `grpc_service="unknown", grpc_method="unknown"`, so made-up method names cannot grow the
registry.
"""

from __future__ import annotations

import copy
import functools
import importlib
import importlib.metadata

import grpc
from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)

# From a fraction of a millisecond (a heartbeat) to minutes (a held lease, a weight push, a Score call).
_RPC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                60.0, 300.0)


class RunRegistry(CollectorRegistry):
    """A registry whose every exposed sample carries `run="<name>"` (prometheus_client has no constant labels)."""

    def __init__(self, run: str):
        super().__init__()
        self.run = run

    def collect(self):
        for metric in super().collect():
            labelled = copy.copy(metric)  # a copy: some collectors (platform) hand out the same objects each time
            labelled.samples = [s._replace(labels={**s.labels, "run": self.run}) for s in metric.samples]
            yield labelled

    def restricted_registry(self, names):
        """`/metrics?name[]=...` reads the collectors directly: the names filter this registry's output instead."""
        wanted = set(names)
        return _Filtered(lambda: (m for m in self.collect() if m.name in wanted or
                                  any(s.name in wanted for s in m.samples)))


class _Filtered:
    def __init__(self, collect):
        self.collect = collect


def service_registry(service: str, run: str = "") -> CollectorRegistry:
    """A registry for one service: process (CPU, memory, open files), platform and GC collectors, and an
    info series naming the service and the package version; with `run`, each series labelled `run`."""
    registry = RunRegistry(run) if run else CollectorRegistry()
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(collector)
    Gauge("asyncrl_service_info", "The service behind this endpoint (always 1).", ["service", "version"],
          registry=registry).labels(service=service, version=package_version()).set(1)
    return registry


UNKNOWN = ("unknown", "unknown")
"""The labels of every call to a method no server of the project serves."""

_SERVICE_DESCRIPTORS = ("asyncrl.v1.controller_pb2", "asyncrl.v1.rollout_pb2", "asyncrl.v1.teacher_pb2",
                        "asyncrl.v1.learner_pb2", "grpc_health.v1.health_pb2",
                        "grpc_reflection.v1alpha.reflection_pb2")


@functools.cache
def known_methods() -> frozenset[tuple[str, str]]:
    """(service, method) of every RPC the project's servers serve: its four services, health, reflection."""
    known = set()
    for module in _SERVICE_DESCRIPTORS:
        for service in importlib.import_module(module).DESCRIPTOR.services_by_name.values():
            known.update((service.full_name, method.name) for method in service.methods)
    return frozenset(known)


class RpcMetrics:
    def __init__(self, registry: CollectorRegistry):
        labels = ["grpc_service", "grpc_method"]
        self.started = Counter("grpc_server_started", "RPCs started on the server.", labels, registry=registry)
        self.handled = Counter("grpc_server_handled", "RPCs completed on the server, by status code.",
                               [*labels, "grpc_code"], registry=registry)
        self.seconds = Histogram("grpc_server_handling_seconds", "Time to handle an RPC, by method.", labels,
                                 buckets=_RPC_BUCKETS, registry=registry)

    def start(self, method: str) -> tuple[str, str]:
        service, _, name = method.lstrip("/").partition("/")
        labels = (service, name) if (service, name) in known_methods() else UNKNOWN
        self.started.labels(*labels).inc()
        return labels

    def done(self, labels: tuple[str, str], code: grpc.StatusCode | None, seconds: float) -> None:
        self.handled.labels(*labels, (code or grpc.StatusCode.OK).name).inc()
        self.seconds.labels(*labels).observe(seconds)


def serve_metrics(host: str, port: int, registry: CollectorRegistry) -> int:
    """Start the /metrics HTTP endpoint (port 0 = any free port) for the process's life; returns the bound port."""
    return start_metrics(host, port, registry)[0].server_address[1]


def start_metrics(host: str, port: int, registry: CollectorRegistry):
    """Start the /metrics HTTP endpoint (port 0 = any free port); returns (its server, whose `shutdown()` and
    `server_close()` end it and free the port, the bound port)."""
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server, server.server_address[1]


def package_version() -> str:
    """The installed asyncrl's version ("unknown" when it runs from a tree that is not installed)."""
    try:
        return importlib.metadata.version("asyncrl")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
