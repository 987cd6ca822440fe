"""Floods against real server processes: a caller without the token, or one with it, sends 8 concurrent
200 MiB requests. The refusal comes before the bytes are read, so the server's memory barely moves (it grew by
1.7 GB on a replica's server and 3.1 GB on the controller's when refused calls were read first)."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest
import yaml

from asyncrl.tools.processes import free_port
from tests.conftest import TEST_AUTH
from tests.run_helpers import REPO, wait_for

pytestmark = pytest.mark.integration

FLOOD_CALLS, FLOOD_BYTES = 8, 200 << 20
GROWTH_BOUND_MB = 64

# A replica's server as its service builds it (a thread-pool server, the guard, the bounds, the Rollout
# methods), with the base servicer in place of one holding a model.
REPLICA_SERVER = """
import sys, time
from asyncrl.core.wire.auth import Auth
from asyncrl.core.wire.grpc_util import build_server
from asyncrl.v1 import rollout_pb2_grpc
register = [lambda s: rollout_pb2_grpc.add_RolloutServicer_to_server(rollout_pb2_grpc.RolloutServicer(), s)]
server, port, _ = build_server("127.0.0.1", 0, register, ["asyncrl.v1.Rollout"], Auth(sys.argv[1]))
server.start()
print(port, flush=True)
time.sleep(600)
"""


def controller_process(tmp_path: Path):
    port = free_port("127.0.0.1")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"run_dir": str(tmp_path / "run"), "buffer": {"type": "memory"},
                                      "controller": {"port": port, "status_port": 0, "state_store": "none"}}))
    proc = subprocess.Popen([sys.executable, "-m", "asyncrl.tools.cli", "controller", "--config", str(config)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = ""
    while "asyncrl-controller listening" not in line:
        assert proc.poll() is None, "the controller exited"
        line = proc.stdout.readline()
    return proc, port


def replica_server_process(_tmp_path: Path):
    proc = subprocess.Popen([sys.executable, "-c", REPLICA_SERVER, TEST_AUTH.token], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline())


def memory_mb(pid: int, field: str) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE).group(1)) // 1024


def settled(pid: int) -> None:
    """Until the server's start-up has stopped growing its memory: the controller imports torch on a thread
    of its own after it listens (about 75 MB, `push.fanout.preload_store_client`), so once torch is mapped
    (when the process loads it at all), four readings half a second apart within 1 MB."""
    maps = Path(f"/proc/{pid}/maps")
    loads_torch = "controller" in Path(f"/proc/{pid}/cmdline").read_text()
    wait_for(lambda: not loads_torch or "libtorch_python" in maps.read_text(), 60, "torch to be loaded")
    readings = [memory_mb(pid, "VmRSS")]

    def steady() -> bool:
        readings.append(memory_mb(pid, "VmRSS"))
        return max(readings[-4:]) - min(readings[-4:]) <= 1 and len(readings) >= 4

    wait_for(steady, 30, "the server's memory to settle", poll_s=0.5)


def flood(port: int, method: str, metadata) -> list[grpc.StatusCode]:
    payload, codes = b"x" * FLOOD_BYTES, []

    def call():
        options = [("grpc.max_send_message_length", 2 * FLOOD_BYTES)]
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            try:
                channel.unary_unary(method)(payload, metadata=metadata, timeout=60)
            except grpc.RpcError as err:
                codes.append(err.code())

    threads = [threading.Thread(target=call) for _ in range(FLOOD_CALLS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return codes


@pytest.mark.parametrize("server, method", [(controller_process, "/asyncrl.v1.Controller/Heartbeat"),
                                            (replica_server_process, "/asyncrl.v1.Rollout/UpdateWeights")],
                         ids=["controller", "replica"])
@pytest.mark.parametrize("token, refused", [(None, grpc.StatusCode.UNAUTHENTICATED),
                                            (TEST_AUTH.token, grpc.StatusCode.RESOURCE_EXHAUSTED)],
                         ids=["outsider", "token-holder"])
def test_a_flood_of_large_requests_is_refused_before_it_is_read(tmp_path, server, method, token, refused):
    proc, port = server(tmp_path)
    try:
        settled(proc.pid)
        Path(f"/proc/{proc.pid}/clear_refs").write_text("5")  # the peak (VmHWM) starts again from now
        before = memory_mb(proc.pid, "VmRSS")
        metadata = [("authorization", "Bearer " + token)] if token else None
        codes = flood(port, method, metadata)
        peak = memory_mb(proc.pid, "VmHWM")
    finally:
        proc.kill()
        proc.wait(30)
    assert codes == [refused] * FLOOD_CALLS
    assert peak - before <= GROWTH_BOUND_MB, f"{before} MB before, {peak} MB at the peak"


def test_every_request_bound_names_a_method_some_service_serves():
    from asyncrl.core.runtime.metrics import known_methods
    from asyncrl.core.wire.limits import REQUEST_BYTES

    served = {f"/{service}/{name}" for service, name in known_methods()}
    assert set(REQUEST_BYTES) <= served, set(REQUEST_BYTES) - served
