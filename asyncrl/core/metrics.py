"""Prometheus metrics: each service keeps its own CollectorRegistry (several services can share a test
process) and serves it on /metrics on its own port."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, start_http_server


def serve_metrics(host: str, port: int, registry: CollectorRegistry) -> int:
    """Start the /metrics HTTP endpoint (port 0 = any free port); returns the bound port."""
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server.server_address[1]
