"""A caller holding the run's access token, but not the learner's seat or secret, attacks a running demo: it
tries to take the run back to version 0 (the empty ResetTimeline that used to end a run and lose its buffered
groups), to push weights of its own, to report as the learner and to take the learner's seat, also in the
moments the learner is dead and restarting (it used to win the seat then, 0.05 s after the kill). Every call
is refused (PERMISSION_DENIED), and the run completes with a clean audit."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
import yaml

from asyncrl.core.runtime.events import read_events
from asyncrl.core.wire.grpc_util import channel
from asyncrl.rollout.registration_calls import RegisteredReplica
from asyncrl.v1 import controller_pb2 as pb
from asyncrl.v1 import controller_pb2_grpc, weights_pb2
from tests.chaos.test_kill import kill
from tests.conftest import TEST_AUTH, TEST_STORE_KEY
from tests.run_helpers import demo_args, running_up, steps_done, wait_for

pytestmark = pytest.mark.chaos

STEPS = 60


def test_a_token_holder_cannot_move_a_live_run(tmp_path):
    run_dir = tmp_path / "run"
    with running_up(*demo_args(run_dir, STEPS, "learner.eval_every=0")) as proc:
        wait_for(lambda: steps_done(run_dir) >= 10, 300, "10 learner steps")
        config = yaml.safe_load((run_dir / "config.resolved.yaml").read_text())["controller"]
        # The run's token (the test session's, which `up` and its processes take from the environment).
        with channel(f"{config['host']}:{config['port']}", TEST_AUTH) as ch:
            stub = RegisteredReplica(controller_pb2_grpc.ControllerStub(ch))
            version = stub.GetStatus(pb.GetStatusRequest(), timeout=10).current_version
            tensor = weights_pb2.TensorSpec(name="w", shape=[2], dtype="float32")
            attacks = [
                ("ResetTimeline", pb.ResetTimelineRequest(), grpc.StatusCode.PERMISSION_DENIED),
                ("ResetTimeline", pb.ResetTimelineRequest(learner_key=b"k" * 32), grpc.StatusCode.PERMISSION_DENIED),
                ("BeginWeightPush", pb.BeginWeightPushRequest(
                    version=version + 1, store_address="127.0.0.1:1", store_key=TEST_STORE_KEY, transport="gloo", bucket_bytes=1024,
                    tensors=[tensor]), grpc.StatusCode.PERMISSION_DENIED),
                ("LearnerHeartbeat", pb.LearnerHeartbeatRequest(), grpc.StatusCode.PERMISSION_DENIED),
                ("RegisterLearner", pb.RegisterLearnerRequest(address="127.0.0.1:1"), grpc.StatusCode.PERMISSION_DENIED),
                ("RegisterLearner", pb.RegisterLearnerRequest(address="127.0.0.1:1", proof_unix_s=int(time.time()),
                                                              seat_proof=b"p" * 32), grpc.StatusCode.PERMISSION_DENIED),
            ]
            for method, request, code in attacks:
                with pytest.raises(grpc.RpcError) as refused:
                    getattr(stub, method)(request, timeout=30)
                assert refused.value.code() == code, (method, refused.value.details())
        out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-5000:]
    assert "[up] audit OK" in out, out[-3000:]
    controller = read_events(run_dir, "controller")
    assert not any(e["kind"] == "timeline_reset" for e in controller)
    assert [e["kind"] for e in controller].count("learner_registered") == 1
    steps = [e["step"] for e in read_events(run_dir, "learner") if e["kind"] == "step"]
    assert steps == list(range(1, STEPS + 1))


def test_a_token_holder_cannot_take_the_seat_while_the_learner_restarts(tmp_path):
    """The learner is killed; a token holder asks for its seat every 20 ms until the restarted learner has it
    (and for 2 s after). Every attempt is PERMISSION_DENIED: without the learner secret nobody is seated. The
    restarted learner takes the seat back and the run finishes clean, trained by learners only."""
    run_dir = tmp_path / "run"
    refused, other = [], []
    stop = threading.Event()

    def hammer(address: str) -> None:
        with channel(address, TEST_AUTH) as ch:
            stub = RegisteredReplica(controller_pb2_grpc.ControllerStub(ch))
            while not stop.is_set():
                try:
                    stub.RegisterLearner(pb.RegisterLearnerRequest(address="127.0.0.1:1"), timeout=5)
                    other.append("seated")
                except grpc.RpcError as err:
                    (refused if err.code() == grpc.StatusCode.PERMISSION_DENIED else other).append(err.code())
                time.sleep(0.02)

    with running_up(*demo_args(run_dir, STEPS, "learner.eval_every=0")) as proc:
        wait_for(lambda: steps_done(run_dir) >= 10, 300, "10 learner steps")
        config = yaml.safe_load((run_dir / "config.resolved.yaml").read_text())["controller"]
        attacker = threading.Thread(target=hammer, args=(f"{config['host']}:{config['port']}",), daemon=True)
        attacker.start()
        kill(run_dir, "learner")
        wait_for(lambda: sum(e["kind"] == "learner_registered" for e in read_events(run_dir, "controller")) >= 2,
                 300, "the restarted learner's registration")
        time.sleep(2.0)
        stop.set()
        attacker.join(10)
        out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-5000:]
    assert "[up] audit OK" in out, out[-3000:]
    assert len(refused) > 20 and not other, other[:5]
    registered = [e for e in read_events(run_dir, "controller") if e["kind"] == "learner_registered"]
    assert len(registered) == 2 and all(e["address"] != "127.0.0.1:1" for e in registered)
