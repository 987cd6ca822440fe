"""gRPC over TLS (`security.tls_*`): every service listens with TLS, clients verify the server against the CA;
with `tls_client_auth`, a client without a certificate from that CA is turned away before any handler."""

from __future__ import annotations

import grpc
import pytest

from asyncrl.core.checks.config_error import ConfigError
from asyncrl.core.config.schema import SecurityConfig
from asyncrl.core.wire.auth import resolve_auth
from asyncrl.core.wire.grpc_util import channel
from asyncrl.services import controller_service, learner_service, rollout_service, teacher_service
from asyncrl.v1 import controller_pb2, controller_pb2_grpc
from tests.conftest import TEST_AUTH
from tests.integration.test_services import local_config
from tests.tls_certs import make_pki

SERVICES = {"controller": controller_service, "rollout": rollout_service, "teacher": teacher_service,
            "learner": learner_service}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def security(pki, client_auth: bool, **extra) -> SecurityConfig:
    fields = {"tls_cert_file": str(pki.cert), "tls_key_file": str(pki.key), "tls_ca_file": str(pki.ca), **extra}
    return SecurityConfig(token_env="ASYNCRL_TOKEN", tls_client_auth=client_auth, **fields)


@pytest.fixture(scope="module", params=[False, True], ids=["tls", "mtls"])
def tls_servers(request, tiny_model_dir, pki, tmp_path_factory):
    config = local_config(tiny_model_dir)
    config.controller.port = 0
    config.security = security(pki, request.param)
    started = {}
    for name, module in SERVICES.items():
        kwargs = {"run_dir": str(tmp_path_factory.mktemp("ctl"))} if name == "controller" else {}
        started[name] = module.create_server(config, **kwargs)
        started[name][0].start()
    yield request.param, config.security, {name: port for name, (_s, port) in started.items()}
    for server, _port in started.values():
        server.stop(0).wait()


def health_of(address: str, auth) -> grpc.StatusCode:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with channel(address, auth) as ch:
        try:
            health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
            return grpc.StatusCode.OK
        except grpc.RpcError as err:
            return err.code()


def test_every_service_answers_over_tls_and_refuses_plaintext(tls_servers):
    _client_auth, sec, ports = tls_servers
    auth = resolve_auth(sec)
    for name, port in ports.items():
        assert health_of(f"127.0.0.1:{port}", auth) == grpc.StatusCode.OK, name
        assert health_of(f"127.0.0.1:{port}", TEST_AUTH) == grpc.StatusCode.UNAVAILABLE, name  # plaintext client
    with channel(f"127.0.0.1:{ports['controller']}", auth) as ch:
        status = controller_pb2_grpc.ControllerStub(ch).GetStatus(controller_pb2.GetStatusRequest(), timeout=5)
        assert status.batch_size > 0


def test_client_certificates_when_required(tls_servers, pki):
    client_auth, sec, ports = tls_servers
    no_cert = resolve_auth(sec.model_copy(update={"tls_client_auth": False}))  # verifies the server, no cert
    stranger = resolve_auth(sec.model_copy(update={"tls_cert_file": str(pki.stranger_cert),
                                                   "tls_key_file": str(pki.stranger_key)}))
    for name, port in ports.items():
        expected = grpc.StatusCode.UNAVAILABLE if client_auth else grpc.StatusCode.OK
        assert health_of(f"127.0.0.1:{port}", no_cert) == expected, name
        if client_auth:
            assert health_of(f"127.0.0.1:{port}", stranger) == grpc.StatusCode.UNAVAILABLE, name


def test_a_server_certificate_from_another_authority_is_not_trusted(pki, tiny_model_dir, tmp_path):
    config = local_config(tiny_model_dir)
    config.controller.port = 0
    config.security = security(pki, False, tls_cert_file=str(pki.stranger_cert), tls_key_file=str(pki.stranger_key))
    server, port = controller_service.create_server(config, run_dir=str(tmp_path))
    server.start()
    try:
        assert health_of(f"127.0.0.1:{port}", resolve_auth(security(pki, False))) == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(0).wait()
        server.controller_state.close()


def test_tls_config_errors_name_the_key(pki, tmp_path):
    with pytest.raises(ConfigError, match="security.tls_key_file"):
        resolve_auth(SecurityConfig(token_env="ASYNCRL_TOKEN", tls_cert_file=str(pki.cert)))
    with pytest.raises(ConfigError, match="security.tls_ca_file"):
        resolve_auth(SecurityConfig(token_env="ASYNCRL_TOKEN", tls_cert_file=str(pki.cert),
                                    tls_key_file=str(pki.key), tls_client_auth=True))
    with pytest.raises(ConfigError, match="security.tls_cert_file: .*does not exist"):
        resolve_auth(SecurityConfig(token_env="ASYNCRL_TOKEN", tls_cert_file=str(tmp_path / "nope.pem"),
                                    tls_key_file=str(pki.key)))
