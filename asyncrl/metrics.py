"""Prometheus metrics: each service process serves /metrics on its own port."""

from __future__ import annotations

from prometheus_client import REGISTRY, start_http_server


def serve_metrics(host: str, port: int) -> int:
    """Start the /metrics HTTP endpoint (port 0 = any free port); returns the bound port."""
    server, _thread = start_http_server(port, addr=host, registry=REGISTRY)
    return server.server_address[1]
