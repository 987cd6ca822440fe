"""Redis with a password and with TLS, as `buffer.password_*` and `buffer.tls_*` configure them: the buffer and
the controller's state store connect; a client without the password, or without the CA, is refused."""

from __future__ import annotations

import shutil
import time

import pytest
import redis

from asyncrl.controller.persistence import make_store
from asyncrl.core.buffer import make_buffer
from asyncrl.core.checks.config_error import ConfigError
from asyncrl.core.config.schema import AsyncRLConfig, BufferConfig
from asyncrl.tools.processes import ProcessGroup, free_port
from asyncrl.tools.redis_local import start_local_redis
from tests import buffer_contract as contract
from tests.tls_certs import make_pki

pytestmark = pytest.mark.integration
PASSWORD = "correct horse battery staple"


@pytest.fixture(scope="module")
def redis_with_password(tmp_path_factory):
    group = ProcessGroup(tmp_path_factory.mktemp("redis-pw-logs"))
    url = start_local_redis(group, tmp_path_factory.mktemp("redis-pw"), password=PASSWORD)
    yield url
    group.stop_all()


@pytest.fixture(scope="module")
def redis_with_tls(tmp_path_factory):
    pki = make_pki(tmp_path_factory.mktemp("redis-pki"))
    group = ProcessGroup(tmp_path_factory.mktemp("redis-tls-logs"))
    port = free_port("127.0.0.1")
    child = group.start("redis-tls", [shutil.which("redis-server"), "--port", "0", "--tls-port", str(port),
                                      "--bind", "127.0.0.1", "--tls-cert-file", str(pki.cert),
                                      "--tls-key-file", str(pki.key), "--tls-ca-cert-file", str(pki.ca),
                                      "--tls-auth-clients", "optional", "--requirepass", PASSWORD, "--save", "",
                                      "--dir", str(tmp_path_factory.mktemp("redis-tls"))])
    url = f"rediss://127.0.0.1:{port}/0"
    probe = redis.Redis.from_url(url, password=PASSWORD, ssl_ca_certs=str(pki.ca))
    deadline = time.time() + 20
    while True:
        try:
            probe.ping()
            break
        except redis.ConnectionError:
            assert child.alive() and time.time() < deadline, child.tail()
            time.sleep(0.1)
    yield url, pki
    group.stop_all()


def test_password_from_the_environment_or_a_file(redis_with_password, monkeypatch, tmp_path):
    with pytest.raises(redis.AuthenticationError):
        make_buffer(BufferConfig(redis_url=redis_with_password, password_env="NO_SUCH_VARIABLE"))
    monkeypatch.setenv("ASYNCRL_REDIS_PASSWORD", PASSWORD)
    contract.check_fifo_and_payload(make_buffer(BufferConfig(redis_url=redis_with_password, stream="pw:env")))
    secret = tmp_path / "password"
    secret.write_text(PASSWORD + "\n")
    monkeypatch.delenv("ASYNCRL_REDIS_PASSWORD")
    buffer = make_buffer(BufferConfig(redis_url=redis_with_password, stream="pw:file", password_file=str(secret)))
    contract.check_fifo_and_payload(buffer)
    with pytest.raises(ConfigError, match="buffer.password_file"):
        make_buffer(BufferConfig(redis_url=redis_with_password, password_file=str(tmp_path / "missing")))


def test_tls_buffer_and_controller_store(redis_with_tls, monkeypatch, tmp_path):
    url, pki = redis_with_tls
    monkeypatch.setenv("ASYNCRL_REDIS_PASSWORD", PASSWORD)
    with pytest.raises(redis.ConnectionError):  # the server's certificate is not trusted without the CA
        make_buffer(BufferConfig(redis_url=url, retry_s=0))
    contract.check_fifo_and_payload(make_buffer(BufferConfig(redis_url=url, tls_ca_file=str(pki.ca), stream="tls")))
    # Client certificates, for servers that require them.
    contract.check_fifo_and_payload(make_buffer(BufferConfig(
        redis_url=url, tls_ca_file=str(pki.ca), tls_cert_file=str(pki.cert), tls_key_file=str(pki.key),
        stream="mtls")))
    config = AsyncRLConfig.model_validate({"run_dir": str(tmp_path), "buffer": {"redis_url": url,
                                                                                "tls_ca_file": str(pki.ca)}})
    store = make_store(config.controller, config.buffer)
    assert store.load() is None
    store.clear()
    store.close()
    with pytest.raises(ConfigError, match="rediss://"):
        make_buffer(BufferConfig(redis_url="redis://127.0.0.1:1/0", tls_ca_file=str(pki.ca)))
