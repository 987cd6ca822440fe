"""Fixed ports: `asyncrl up` refuses a run whose ports collide or are taken, naming the key, before it starts
anything; a service that cannot listen on its configured port says which key (`asyncrl.core.wire.ports`)."""

from __future__ import annotations

import socket

import pytest
from prometheus_client import CollectorRegistry

from asyncrl.core.checks.config_error import ConfigError
from asyncrl.core.config.schema import AsyncRLConfig
from asyncrl.core.runtime.metrics import serve_metrics
from asyncrl.core.wire.grpc_util import build_server
from asyncrl.core.wire.ports import listening, why_not_listenable
from asyncrl.tools.port_plan import check_ports, planned_ports
from asyncrl.tools.processes import free_port_run
from tests.conftest import TEST_AUTH


def config(**sections) -> AsyncRLConfig:
    base = {"controller": {"port": 0, "status_port": 0}, "teacher": {"enabled": False, "port": 0}}
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return AsyncRLConfig.model_validate(base)


@pytest.fixture
def held_port():
    """A port another program listens on (this test's socket), the port before it free."""
    free = free_port_run(2)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", free + 1))
        holder.listen()
        yield free + 1


def test_every_replica_counts_up_from_the_configured_ports_and_zero_ports_are_not_planned():
    cfg = config(rollout={"replicas": 3, "port": 9100, "metrics_port": 9200}, learner={"metrics_port": 9300},
                 teacher={"enabled": True, "model_path": "/m", "port": 9400})
    planned = {(p.key, p.owner, p.port) for p in planned_ports(cfg)}
    assert planned == {("rollout.port", "replica-0", 9100), ("rollout.port", "replica-1", 9101),
                       ("rollout.port", "replica-2", 9102), ("rollout.metrics_port", "replica-0", 9200),
                       ("rollout.metrics_port", "replica-1", 9201), ("rollout.metrics_port", "replica-2", 9202),
                       ("learner.metrics_port", "the learner", 9300), ("teacher.port", "the teacher", 9400)}
    assert planned_ports(config()) == []  # every port picked by its process


def test_overlapping_replica_ranges_are_refused_naming_both_keys():
    base = free_port_run(4)
    cfg = config(rollout={"replicas": 3, "port": base, "metrics_port": base + 2})
    with pytest.raises(ConfigError) as refused:
        check_ports(cfg)
    message = str(refused.value)
    assert message.startswith(f"rollout.port: replica-2's 127.0.0.1:{base + 2} is also rollout.metrics_port "
                              f"(replica-0's 127.0.0.1:{base + 2}); give them ports that do not overlap")


def test_a_wildcard_address_clashes_with_any_address_on_the_same_port():
    port = free_port_run(1)
    cfg = config(controller={"host": "0.0.0.0", "port": port}, learner={"host": "127.0.0.1", "metrics_port": port})
    with pytest.raises(ConfigError, match=rf"^learner.metrics_port: the learner's 127.0.0.1:{port} is also "
                                          rf"controller.port \(the controller's 0.0.0.0:{port}\)"):
        check_ports(cfg)


def test_a_port_another_program_holds_is_refused_naming_the_key(held_port):
    cfg = config(rollout={"replicas": 2, "metrics_port": held_port - 1})
    with pytest.raises(ConfigError) as refused:
        check_ports(cfg)
    assert str(refused.value) == (f"rollout.metrics_port: cannot listen on replica-1's 127.0.0.1:{held_port}: "
                                  "another program listens there; choose another port, or 0 for any free one")


def test_free_ports_pass_and_an_address_this_machine_lacks_is_named():
    base = free_port_run(3)
    check_ports(config(rollout={"replicas": 2, "port": base}, learner={"port": base + 2}))
    assert why_not_listenable("127.0.0.1", base) is None
    assert why_not_listenable("192.0.2.1", base) == "192.0.2.1 is not an address of this machine"  # TEST-NET-1


def test_a_service_that_cannot_listen_names_its_key(held_port):
    taken = rf"cannot listen on 127.0.0.1:{held_port}: another program listens there$"
    with pytest.raises(ConfigError, match="^rollout.port: " + taken), listening("rollout.port", "127.0.0.1", held_port):
        build_server("127.0.0.1", held_port, [], [], TEST_AUTH)
    with (pytest.raises(ConfigError, match="^teacher.metrics_port: " + taken),
          listening("teacher.metrics_port", "127.0.0.1", held_port)):
        serve_metrics("127.0.0.1", held_port, CollectorRegistry())


def test_other_errors_pass_through_unchanged():
    with pytest.raises(RuntimeError, match="^not a bind failure$"), listening("rollout.port", "127.0.0.1", 1):
        raise RuntimeError("not a bind failure")
    # A TLS file that is missing is not the port's fault.
    with pytest.raises(FileNotFoundError), listening("controller.port", "127.0.0.1", 1):
        open("/nonexistent/server.crt")  # noqa: SIM115
    # A host name that does not resolve is the config's (as getaddrinfo says it; raised here, no DNS needed).
    with (pytest.raises(ConfigError, match=r"^learner.port: cannot listen on nohost:5: nohost does not resolve"),
          listening("learner.port", "nohost", 5)):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")


def test_up_refuses_taken_ports_before_it_starts_anything(tmp_path, capsys, held_port, tiny_model_dir):
    from asyncrl.tools.cli import main

    config_file = tmp_path / "c.yaml"
    config_file.write_text(f"run_dir: {tmp_path}/runs/r-{{time}}\nmodel: {{path: {tiny_model_dir.policy}}}\n"
                           f"rollout: {{replicas: 2, metrics_port: {held_port - 1}}}\n")
    assert main(["up", "--config", str(config_file)]) == 2
    assert capsys.readouterr().err.startswith("asyncrl up: config error: rollout.metrics_port: cannot listen on "
                                              f"replica-1's 127.0.0.1:{held_port}: another program listens there")
    assert list((tmp_path / "runs").iterdir()) == []  # nothing started, no run directory left behind
