"""A client channel notices a peer that came back within about a second (`grpc_util.RECONNECT_OPTIONS`), not at
gRPC's default reconnection back-off, which grows to two minutes: a call waiting for a restarted server (the
patient channel's wait-for-ready) is answered soon after the server serves again. With the defaults, a server
back after 6 s is first tried again at about 9 s."""

from __future__ import annotations

import time

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from asyncrl.core.wire.grpc_util import build_server, channel
from tests.conftest import TEST_AUTH

pytestmark = pytest.mark.integration

DOWN_S = 6.0


def serve(port: int):
    server, bound, _ = build_server("127.0.0.1", port, [], [], TEST_AUTH)
    server.start()
    return server, bound


def test_a_waiting_call_reaches_a_restarted_server_within_about_a_second():
    server, port = serve(0)
    with channel(f"127.0.0.1:{port}", TEST_AUTH, patient=True) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        health.Check(health_pb2.HealthCheckRequest(), timeout=5)
        server.stop(0).wait()
        down_at = time.monotonic()
        # The channel sees the server gone and starts backing off while it stays down.
        future = health.Check.future(health_pb2.HealthCheckRequest(), timeout=DOWN_S + 10)
        time.sleep(DOWN_S)
        server, _ = serve(port)
        up_at = time.monotonic()
        try:
            assert future.result().status == health_pb2.HealthCheckResponse.SERVING
            late = time.monotonic() - up_at
        finally:
            server.stop(0).wait()
    print(f"answered {late:.2f} s after the server came back ({up_at - down_at:.1f} s down)")
    assert late < 1.5, late
