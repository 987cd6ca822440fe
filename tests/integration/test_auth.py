"""Every RPC of every service, called as an outsider would from `proto/` alone: without the token or with a
wrong one the answer is UNAUTHENTICATED and the service never sees the call; with the token, bytes that are
not the method's message answer INVALID_ARGUMENT (not INTERNAL); health stays open for orchestrators; a
service without any token configured refuses to start."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from asyncrl.core.wire.auth import MissingToken
from asyncrl.rollout.registration_calls import RegisteredReplica
from asyncrl.services import controller_service, learner_service, rollout_service, teacher_service
from asyncrl.v1 import controller_pb2, learner_pb2, rollout_pb2, teacher_pb2
from tests.conftest import TEST_AUTH
from tests.integration.test_services import local_config

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]

# A tag with wire type 7 (invalid): no message type can parse these bytes.
UNDECODABLE = b"\xff\xff\xff\xff\x0f"
SERVICES = {
    "controller": (controller_service, controller_pb2, "Controller"),
    "rollout": (rollout_service, rollout_pb2, "Rollout"),
    "teacher": (teacher_service, teacher_pb2, "Teacher"),
    "learner": (learner_service, learner_pb2, "Learner"),
}


def every_method():
    for name, (_module, pb, service) in SERVICES.items():
        descriptor = pb.DESCRIPTOR.services_by_name[service]
        for method in descriptor.methods:
            yield name, f"/{descriptor.full_name}/{method.name}"


METHODS = list(every_method())


def call_raw(port: int, method: str, payload: bytes, metadata=None):
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel, pytest.raises(grpc.RpcError) as info:
        channel.unary_unary(method)(payload, metadata=metadata, timeout=10)
    return info.value


def test_every_rpc_of_the_contract_is_covered():
    declared = sum(line.strip().startswith("rpc ") for proto in (REPO / "proto").rglob("*.proto")
                   for line in proto.read_text().splitlines())
    assert len(METHODS) == declared, METHODS


@pytest.mark.parametrize("service, method", METHODS)
def test_without_a_token_every_rpc_is_unauthenticated(servers, service, method):
    err = call_raw(servers[service], method, b"")
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED, (method, err.details())
    assert "missing token" in err.details()


@pytest.mark.parametrize("service, method", METHODS)
def test_with_a_wrong_token_every_rpc_is_unauthenticated(servers, service, method):
    err = call_raw(servers[service], method, b"", metadata=[("authorization", "Bearer not-the-token")])
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED, (method, err.details())
    assert err.details() == "invalid token"


@pytest.mark.parametrize("service, method", METHODS)
def test_undecodable_bytes_are_an_invalid_argument(servers, service, method):
    err = call_raw(servers[service], method, UNDECODABLE, metadata=[("authorization", "Bearer " + TEST_AUTH.token)])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, err.code(), err.details())
    assert method in err.details()


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_health_answers_without_a_token(servers, service):
    with grpc.insecure_channel(f"127.0.0.1:{servers[service]}") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("service", sorted(SERVICES))
@pytest.mark.parametrize("name", ["asyncrl.v1.NoSuchService", "x" * (1 << 20)])
def test_health_of_an_unknown_service_is_not_found(servers, service, name):
    """A name the server does not serve (an unknown one, a 1 MB one) is NOT_FOUND, with and without the token,
    on the thread-pool servers and the controller's asyncio one alike (it used to be UNKNOWN there: the
    health servicer's abort without details broke the guard's code recorder)."""
    for metadata in ([], [("authorization", "Bearer " + TEST_AUTH.token)]):
        with grpc.insecure_channel(f"127.0.0.1:{servers[service]}") as channel, pytest.raises(grpc.RpcError) as err:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=name),
                                                      metadata=metadata, timeout=10)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND, (service, err.value.code(), err.value.details())


def test_a_service_without_a_token_refuses_to_start(tiny_model_dir, monkeypatch):
    monkeypatch.delenv("ASYNCRL_TOKEN")
    config = local_config(tiny_model_dir)
    with pytest.raises(MissingToken, match="ASYNCRL_TOKEN"):
        learner_service.create_server(config)
    config.security.insecure = True
    server, _port = learner_service.create_server(config)
    server.stop(0)


def test_a_live_replica_id_cannot_be_taken_over(tiny_model_dir, tmp_path):
    """RegisterReplica under the id of a live replica (which proves it holds the registration's key through
    Rollout.GetStatus) answers ALREADY_EXISTS; once that replica is gone, its id can be registered again (a
    restart)."""
    from asyncrl.core.wire.grpc_util import channel
    from asyncrl.v1 import controller_pb2_grpc

    config = local_config(tiny_model_dir)
    config.controller.port = 0
    ctl, ctl_port = controller_service.create_server(config, run_dir=str(tmp_path))
    key = []
    replica, replica_port = rollout_service.create_server(config, push_key=lambda: key[0] if key else b"")
    ctl.start()
    replica.start()
    try:
        with channel(f"127.0.0.1:{ctl_port}", TEST_AUTH) as ch:
            stub = RegisteredReplica(controller_pb2_grpc.ControllerStub(ch))

            def register(address):
                return stub.RegisterReplica(controller_pb2.RegisterReplicaRequest(
                    address=address, replica_id="replica-x", weight_version=0, engine="torch"), timeout=10)

            key.append(register(f"127.0.0.1:{replica_port}").push_key)
            with pytest.raises(grpc.RpcError) as info:
                register("127.0.0.1:6666")
            assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
            assert info.value.details().startswith("replica_id:")
            status = stub.GetStatus(controller_pb2.GetStatusRequest(), timeout=10)
            assert [r.address for r in status.replicas] == [f"127.0.0.1:{replica_port}"]
            replica.stop(0).wait()  # the holder is gone: its id is free for its restarted process
            assert register("127.0.0.1:6667").replica_id == "replica-x"
    finally:
        replica.stop(0).wait()
        ctl.stop(0).wait()
        ctl.controller_state.close()
