"""The learner's weight push end to end over real gRPC and gloo: a controller, two Rollout servers with torch
engines on the tiny model, the learner's `WeightPublisher`. Pushes to unchanged members reuse one broadcast
group on every rank, the manifest travels once (plans carry its digest), and a background push sends the
snapshot taken when it started, whatever the next step does to the live weights meanwhile. Every test runs
twice: with replicas that follow their group (pushes after the first go in-band, `push.in_band`) and with
replicas that do not (the controller orders every push)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from asyncrl.core.model.modeling import load_causal_lm, sequence_logprobs
from asyncrl.core.wire.grpc_util import channel as grpc_channel
from asyncrl.learner.seat import SeatedController
from asyncrl.push.sender import WeightPublisher
from asyncrl.rollout.registration_calls import RegisteredReplica
from asyncrl.services import controller_service, rollout_service
from asyncrl.v1 import controller_pb2, controller_pb2_grpc
from tests.conftest import TEST_AUTH, TEST_LEARNER_SECRET
from tests.integration.test_services import local_config
from tests.run_helpers import wait_for

pytestmark = pytest.mark.integration

SEQS, STARTS = [[1, 5, 6, 7, 8, 9, 2], [1, 9, 9, 4, 3]], [4, 3]


@pytest.fixture(params=[True, False], ids=["in-band", "controller-ordered"])
def system(request, tiny_model_dir, tmp_path):
    with push_system(tiny_model_dir, tmp_path, in_band=request.param) as parts:
        yield parts


@contextlib.contextmanager
def push_system(tiny_model_dir, tmp_path, in_band: bool, **transport):
    """A controller and two Rollout servers (torch engines, registered as following their groups or not),
    with this process seated as the learner: yields (config, controller stub, engines, replica servers,
    in_band). `transport`: `learner.weight_transport` fields to set."""
    config = local_config(tiny_model_dir)
    for name, value in transport.items():
        setattr(config.learner.weight_transport, name, value)
    config.controller.port = 0
    config.controller.state_store = "none"
    servers = []
    controller, port = controller_service.create_server(config, run_dir=str(tmp_path))
    controller.start()
    servers.append(controller)
    ch = grpc_channel(f"127.0.0.1:{port}", TEST_AUTH)
    stub = SeatedController(RegisteredReplica(controller_pb2_grpc.ControllerStub(ch)), TEST_LEARNER_SECRET)
    stub.take_seat("127.0.0.1:1", patience_s=0)  # this test plays the learner
    engines, keys = [], {}
    for i in range(2):
        replica, replica_port = rollout_service.create_server(config, push_key=lambda i=i: keys[i])
        replica.start()
        servers.append(replica)
        keys[i] = stub.RegisterReplica(controller_pb2.RegisterReplicaRequest(
            address=f"127.0.0.1:{replica_port}", engine="torch", in_band_pushes=in_band)).push_key
        engines.append(replica.servicer.engine)
    # Both join pushes once the controller has reached them at their addresses.
    wait_for(lambda: all(r["reachable"] for r in controller.controller_state.snapshot()["replicas"]), 10,
             "both replicas reachable")
    try:
        yield config, stub, engines, servers[1:], in_band
    finally:
        ch.close()
        for server in servers:
            server.stop(0).wait()
        controller.controller_state.close()


def replica_logprobs(engine) -> torch.Tensor:
    return torch.tensor([row for row in engine.score(SEQS, STARTS)[0]])


def model_logprobs(model) -> torch.Tensor:
    logp, _ = sequence_logprobs(model.eval(), SEQS, STARTS, None, pad_id=0)
    return logp[0, : len(SEQS[0]) - STARTS[0]]


def test_background_pushes_reuse_one_group_and_send_their_snapshot(system, tiny_model_dir):
    config, stub, engines, replicas, in_band = system
    learner = load_causal_lm(tiny_model_dir.policy)
    publisher = WeightPublisher(stub, learner, config.learner.weight_transport, config.controller.push_timeout_s)
    try:
        first = publisher.push(1)
        assert first.committed and first.new_group and len(first.acked) == 2

        with torch.no_grad():
            for p in learner.parameters():
                p.add_(0.05 * torch.randn_like(p))
        expected = model_logprobs(learner)
        publisher.start(2)
        with torch.no_grad():  # the next step changes the live weights while the push is in flight
            for p in learner.parameters():
                p.mul_(0.5)
        second = publisher.finish()
        assert second.committed and second.background and not second.new_group and second.version == 2
        assert not first.in_band and second.in_band == in_band
        for engine in engines:
            assert engine.weight_version == 2
            assert torch.allclose(replica_logprobs(engine), expected, atol=1e-5)

        publisher.start(3)
        third = publisher.finish()
        assert not third.new_group
        for engine in engines:
            assert torch.allclose(replica_logprobs(engine), model_logprobs(learner), atol=1e-5)
        # Every rank formed the group once; the replicas read the manifest once.
        assert publisher.groups.formed == 1
        assert all(engine._weights.groups.formed == 1 for engine in engines)
        assert [r.servicer.receiver.listener.taken for r in replicas] == ([2, 2] if in_band else [0, 0])
        with pytest.raises(RuntimeError, match="in flight"):
            publisher.start(4)
            publisher.start(5)
        assert publisher.finish().version == 4
    finally:
        publisher.close()


def flat_bytes(tensors) -> bytes:
    return b"".join(t.detach().contiguous().view(torch.uint8).reshape(-1).numpy().tobytes() for t in tensors)


