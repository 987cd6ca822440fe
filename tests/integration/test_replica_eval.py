"""Held-out evaluations on a rollout replica (`learner.eval_by: replica`) over real gRPC: a controller and a
rollout replica (torch engine) in this process. The learner-side evaluator finds the replica through the
controller's status, sends the held-out prompts in chunks through the replica's Generate, and gets the same
greedy accuracy as the replica's engine evaluated directly; no live replica, or one registered at an address
nobody answers at, comes back as an error for the learner to evaluate instead."""

from __future__ import annotations

import functools
import threading
import time

import pytest

from asyncrl.core.engines.factory import make_engine
from asyncrl.core.tasks import task_for_run
from asyncrl.core.tasks.evaluate import greedy_accuracy
from asyncrl.core.wire.grpc_util import channel as grpc_channel
from asyncrl.learner.replica_eval import BackgroundEvaluations, ReplicaEvaluator
from asyncrl.rollout.registration_calls import RegisteredReplica
from asyncrl.v1 import controller_pb2, controller_pb2_grpc
from tests.conftest import TEST_AUTH
from tests.integration.test_services import local_config

pytestmark = pytest.mark.integration

MAX_NEW_TOKENS = 8
CHUNK = 7  # prompts per Generate call: the held-out set takes several


@pytest.fixture
def fleet(tiny_model_dir, tmp_path):
    """A controller and one replica's Rollout service; yields (config, controller stub, replica address, engine)."""
    from asyncrl.services import controller_service, rollout_service

    config = local_config(tiny_model_dir)
    config.controller.port = 0
    config.controller.trust_initial_weights = True  # "r0" holds version 0 without a push (no learner here)
    controller, controller_port = controller_service.create_server(config, run_dir=str(tmp_path))
    engine = make_engine(config.rollout.engine, config.model.path, config.model.dtype, seed=config.seed)
    # It answers the controller's challenge with the key of its registration as "r0" (`register`).
    rollout, rollout_port = rollout_service.create_server(config, engine=engine, engine_lock=threading.Lock(),
                                                          replica_id=lambda: "r0",
                                                          push_key=lambda: KEYS.get("r0", b""))
    controller.start()
    rollout.start()
    channel = grpc_channel(f"127.0.0.1:{controller_port}", TEST_AUTH)
    try:
        yield config, RegisteredReplica(controller_pb2_grpc.ControllerStub(channel)), f"127.0.0.1:{rollout_port}", engine
    finally:
        channel.close()
        rollout.stop(0).wait()
        controller.stop(0).wait()
        controller.controller_state.close()


def evaluator(config, stub) -> ReplicaEvaluator:
    return ReplicaEvaluator(stub, functools.partial(grpc_channel, auth=TEST_AUTH), task_for_run(config),
                            MAX_NEW_TOKENS, CHUNK, timeout_s=60)


KEYS: dict[str, bytes] = {}


def register(stub, address: str, replica_id: str) -> None:
    KEYS[replica_id] = stub.RegisterReplica(controller_pb2.RegisterReplicaRequest(
        address=address, replica_id=replica_id, weight_version=0, engine="torch")).push_key


def reached(stub, replica_id: str) -> bool:
    status = stub.GetStatus(controller_pb2.GetStatusRequest(), timeout=10)
    return any(r.replica_id == replica_id and r.reachable for r in status.replicas)


def test_a_replica_evaluates_the_held_out_set_as_its_engine_does(fleet):
    config, stub, address, engine = fleet
    register(stub, address, "r0")
    task = task_for_run(config)
    assert len(task.eval_prompts()) > CHUNK
    result = evaluator(config, stub).evaluate()
    assert result.replica_id == "r0" and result.versions == (0, 0)
    assert result.accuracy == greedy_accuracy(engine, task, max_new_tokens=MAX_NEW_TOKENS)
    # `learner.eval_prompts`: the first few held-out prompts only.
    first = task.eval_prompts()[:3]
    few = ReplicaEvaluator(stub, functools.partial(grpc_channel, auth=TEST_AUTH), task, MAX_NEW_TOKENS, CHUNK,
                           timeout_s=60, prompts=first).evaluate()
    assert few.accuracy == greedy_accuracy(engine, task, first, MAX_NEW_TOKENS)


def test_in_the_background_and_back_as_an_error_when_no_replica_can_run_it(fleet):
    config, stub, address, _engine = fleet
    evaluations = BackgroundEvaluations(evaluator(config, stub))
    assert evaluations.start(step=10, version=10)
    done = evaluations.wait()
    assert (done.step, done.version, done.result) == (10, 10, None)
    assert "no live replica" in done.error

    # Registered where nobody answers (and, having answered nothing, not reached): the call fails.
    register(stub, "127.0.0.1:9", "ghost")
    assert evaluations.start(step=20, version=20)
    assert not evaluations.start(step=21, version=21)  # one at a time
    done = evaluations.wait()
    assert done.result is None and done.error.startswith("UNAVAILABLE")

    # A replica the controller has reached at its address comes before one it has not (same weights).
    register(stub, address, "r0")
    deadline = time.monotonic() + 10
    while not reached(stub, "r0") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert reached(stub, "r0") and not reached(stub, "ghost")
    assert evaluations.start(step=30, version=30)
    while (done := evaluations.poll()) is None:
        time.sleep(0.05)
    assert done.result is not None and done.result.replica_id == "r0", done.error
    assert evaluations.poll() is None
