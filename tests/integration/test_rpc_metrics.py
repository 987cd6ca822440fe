"""Every gRPC server counts and times its RPCs by method and status code (refused calls too), next to the
process and Python collectors and an info series naming the service."""

from __future__ import annotations

import grpc
import pytest
from prometheus_client import generate_latest

from asyncrl.core.wire.auth import Auth
from asyncrl.core.wire.grpc_util import channel
from asyncrl.rollout.registration_calls import RegisteredReplica
from asyncrl.services import controller_service, teacher_service
from asyncrl.v1 import controller_pb2, controller_pb2_grpc, teacher_pb2, teacher_pb2_grpc
from tests.conftest import TEST_AUTH
from tests.integration.test_services import local_config

pytestmark = pytest.mark.integration


def sample(text: str, name: str, **labels) -> float:
    """The value of the series `name` with these labels in a Prometheus exposition (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_controller_and_teacher_count_their_rpcs(tiny_model_dir, tmp_path):
    config = local_config(tiny_model_dir)
    config.controller.port = 0
    ctl, ctl_port = controller_service.create_server(config, run_dir=str(tmp_path))
    teacher, teacher_port = teacher_service.create_server(config)
    ctl.start()
    teacher.start()
    try:
        with channel(f"127.0.0.1:{ctl_port}", TEST_AUTH) as ch:
            stub = RegisteredReplica(controller_pb2_grpc.ControllerStub(ch))
            rid = stub.RegisterReplica(controller_pb2.RegisterReplicaRequest(address="127.0.0.1:9",
                                                                             engine="torch")).replica_id
            stub.AcquireLease(controller_pb2.AcquireLeaseRequest(replica_id=rid, num_trajectories=8, wait_s=0))
            with pytest.raises(grpc.RpcError):  # unknown replica: NOT_FOUND, from the coroutine handler
                stub.AcquireLease(controller_pb2.AcquireLeaseRequest(replica_id="nobody", num_trajectories=8))
        with channel(f"127.0.0.1:{ctl_port}", Auth("wrong")) as ch, pytest.raises(grpc.RpcError):
            controller_pb2_grpc.ControllerStub(ch).GetStatus(controller_pb2.GetStatusRequest())
        with channel(f"127.0.0.1:{teacher_port}", TEST_AUTH) as ch, pytest.raises(grpc.RpcError):
            teacher_pb2_grpc.TeacherStub(ch).Score(teacher_pb2.ScoreRequest())  # no sequences: INVALID_ARGUMENT

        text = ctl.controller_state.metrics.exposition().decode()
        svc = "asyncrl.v1.Controller"
        assert sample(text, "grpc_server_handled_total", grpc_method="RegisterReplica", grpc_code="OK") == 1
        assert sample(text, "grpc_server_handled_total", grpc_method="AcquireLease", grpc_code="OK") == 1
        assert sample(text, "grpc_server_handled_total", grpc_method="AcquireLease", grpc_code="NOT_FOUND") == 1
        assert sample(text, "grpc_server_handled_total", grpc_service=svc, grpc_method="GetStatus",
                      grpc_code="UNAUTHENTICATED") == 1
        assert sample(text, "grpc_server_handling_seconds_count", grpc_method="AcquireLease") == 2
        assert sample(text, "grpc_server_started_total", grpc_method="AcquireLease") == 2
        assert sample(text, "asyncrl_service_info", service="controller") == 1
        assert "process_resident_memory_bytes" in text and "python_gc_objects_collected_total" in text

        teacher_text = generate_latest(teacher.servicer.scorer.metrics.registry).decode()
        assert sample(teacher_text, "grpc_server_handled_total", grpc_method="Score",
                      grpc_code="INVALID_ARGUMENT") == 1
        assert sample(teacher_text, "asyncrl_service_info", service="teacher") == 1
    finally:
        ctl.stop(0).wait()
        ctl.controller_state.close()
        teacher.stop(0).wait()


def test_made_up_method_names_share_one_series_and_do_not_grow_the_registry(tiny_model_dir, tmp_path):
    # An outsider without the token calling thousands of method names that do not exist (4 KiB names too) used
    # to add a series per name: /metrics grew from 35 KB to 116 MB.
    config = local_config(tiny_model_dir)
    config.controller.port = 0
    ctl, ctl_port = controller_service.create_server(config, run_dir=str(tmp_path))
    ctl.start()
    try:
        before = len(ctl.controller_state.metrics.exposition())
        with grpc.insecure_channel(f"127.0.0.1:{ctl_port}") as ch:
            for i in range(300):
                name = f"/asyncrl.v1.Controller/Nope{i}" if i % 2 else f"/made.up{i}/{'x' * 4096}"
                call = ch.unary_unary(name, request_serializer=bytes, response_deserializer=bytes)
                with pytest.raises(grpc.RpcError):
                    call(b"", timeout=10)
        text = ctl.controller_state.metrics.exposition().decode()
        assert sample(text, "grpc_server_started_total", grpc_service="unknown", grpc_method="unknown") == 300
        assert "Nope" not in text and "made.up" not in text
        assert len(text) - before < 4096, len(text) - before
    finally:
        ctl.stop(0)
