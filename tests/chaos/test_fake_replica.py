"""A token holder's fake replica on a running demo: it registers, answers the controller's challenges under its
registration's key, heartbeats, and never joins a push (its UpdateWeights hangs), so every push that picks it
waits out the join time-out. Held back after each failure, it registers again under its id and under fresh
ids from the same host (that used to clear the hold-back: a fake in every other push). Now it is in a handful
of pushes (one per back-off period, doubling), and the run completes with a clean audit."""

from __future__ import annotations

import functools
import math
import threading
import time
from concurrent import futures

import grpc
import pytest
import yaml

from asyncrl.core.runtime.events import read_events
from asyncrl.core.wire.auth import liveness_mac
from asyncrl.core.wire.grpc_util import build_server, channel
from asyncrl.rollout.registration_calls import RegisteredReplica
from asyncrl.v1 import controller_pb2 as pb
from asyncrl.v1 import controller_pb2_grpc, rollout_pb2, rollout_pb2_grpc
from tests.conftest import TEST_AUTH
from tests.run_helpers import demo_args, running_up, steps_done, wait_for

pytestmark = pytest.mark.chaos

STEPS = 250


class FakeRollout(rollout_pb2_grpc.RolloutServicer):
    """Answers challenges under the registration's key; UpdateWeights never answers (until the test ends)."""

    def __init__(self, stop: threading.Event):
        self.key = b""
        self.stop = stop

    def GetStatus(self, request, context):
        return rollout_pb2.RolloutStatus(replica_id="fake", challenge_mac=liveness_mac(self.key, request.challenge))

    def UpdateWeights(self, request, context):
        self.stop.wait(120)
        context.abort(grpc.StatusCode.UNAVAILABLE, "never answered")


def fake_replica(stub, stop: threading.Event, servers: list, registered: list) -> None:
    """Register a fake, keep it alive, and once the controller holds it back register again: under its id with
    its key, then under a fresh id at a new port, and so on, about once a second; until the run ends (its
    controller stops answering)."""
    try:
        attack(stub, stop, servers, registered)
    except grpc.RpcError as err:
        if err.code() != grpc.StatusCode.UNAVAILABLE:
            raise


def attack(stub, stop: threading.Event, servers: list, registered: list) -> None:
    replica_id, key, servicer, port = "", b"", None, 0
    for attempt in range(10_000):
        if stop.is_set():
            return
        fresh = attempt % 2 == 0
        if fresh:
            servicer = FakeRollout(stop)
            add = functools.partial(rollout_pb2_grpc.add_RolloutServicer_to_server, servicer)
            server, port, _ = build_server("127.0.0.1", 0, [add], ["asyncrl.v1.Rollout"], TEST_AUTH)
            server.start()
            servers.append(server)
        version = stub.GetStatus(pb.GetStatusRequest(), timeout=10).current_version
        reply = stub.RegisterReplica(pb.RegisterReplicaRequest(
            address=f"127.0.0.1:{port}", replica_id="" if fresh else replica_id, weight_version=version,
            engine="torch", push_key=b"" if fresh else key), timeout=10)  # fmt: skip
        replica_id, key = reply.replica_id, reply.push_key
        servicer.key = key
        registered.append(replica_id)
        while not stop.is_set():  # heartbeat as a replica does, claiming the current version
            version = stub.GetStatus(pb.GetStatusRequest(), timeout=10).current_version
            pulse = stub.Heartbeat(pb.HeartbeatRequest(replica_id=replica_id, weight_version=version), timeout=10)
            if pulse.held_back_s > 0:
                stop.wait(1.0)
                break
            stop.wait(0.3)


def test_a_fake_replica_that_never_joins_costs_a_few_pushes_not_every_other(tmp_path):
    run_dir = tmp_path / "run"
    stop, servers, registered = threading.Event(), [], []
    with running_up(*demo_args(run_dir, STEPS, "learner.eval_every=0")) as proc:
        wait_for(lambda: steps_done(run_dir) >= 3, 300, "3 learner steps")
        config = yaml.safe_load((run_dir / "config.resolved.yaml").read_text())["controller"]
        with channel(f"{config['host']}:{config['port']}", TEST_AUTH) as ch:
            stub = RegisteredReplica(controller_pb2_grpc.ControllerStub(ch))
            attacker = futures.ThreadPoolExecutor(1).submit(fake_replica, stub, stop, servers, registered)
            started = time.time()
            try:
                out, _ = proc.communicate(timeout=900)
            finally:
                stop.set()
                attacker.result(timeout=60)
                for server in servers:
                    server.stop(0)
    assert proc.returncode == 0, out[-5000:]
    assert "[up] audit OK" in out, out[-3000:]
    begun = [e for e in read_events(run_dir, "controller") if e["kind"] == "push_begun" and e["receivers"]]
    fakes = set(registered)
    with_fake = [e for e in begun if fakes & set(e["receivers"])]
    seconds = time.time() - started
    print(f"fake replica: {len(fakes)} registrations, in {len(with_fake)} of {len(begun)} pushes over {seconds:.0f} s")
    # One push per back-off period (10, 20, 40 ... s: doubling across its registrations) where it was one in
    # every few (it re-registered after each failure and was picked again at once); the demo pushes several
    # times a second.
    assert len(begun) >= STEPS and len(with_fake) <= 2 + math.log2(1 + seconds / 10), (len(with_fake), seconds)
    assert len(fakes) >= 2, registered  # it did register again
