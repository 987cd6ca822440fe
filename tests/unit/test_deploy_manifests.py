"""deploy/: no Docker engine or cluster runs here, so check what can be checked without one: every
container command is a valid `asyncrl` invocation and its config (with overrides) validates."""

from pathlib import Path

import pytest
import yaml

from asyncrl.core.config import load_config
from asyncrl.tools.cli import build_parser

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _check(args: list[str], config_file: Path):
    parsed = build_parser().parse_args(args)
    assert parsed.config.startswith("/etc/asyncrl/")
    return load_config(config_file, parsed.set)


def test_compose_commands_are_valid():
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    assert "--appendonly" in (redis := compose["services"]["redis"]["command"]) and \
        redis[redis.index("--appendonly") + 1] == "yes"
    commands = {name: svc["command"] for name, svc in compose["services"].items() if name != "redis"}
    assert set(commands) == {"make-model", "controller", "teacher", "rollout", "learner"}
    for name, command in commands.items():
        # Every service gets the shared token (compose refuses to start without ASYNCRL_TOKEN exported).
        assert "${ASYNCRL_TOKEN:?" in compose["services"][name]["environment"]["ASYNCRL_TOKEN"], name
        assert "${ASYNCRL_REDIS_PASSWORD:?" in compose["services"][name]["environment"]["ASYNCRL_REDIS_PASSWORD"]
        cfg = _check(command, DEPLOY / "config.yaml")
        assert cfg.buffer.redis_url == "redis://redis:6379/0", name
        if name in ("rollout", "learner"):
            assert cfg.controller.host == "controller"
    assert "--requirepass" in compose["services"]["redis"]["command"]
    learner = compose["services"]["learner"]
    assert learner["restart"] == "on-failure"
    assert _check(learner["command"], DEPLOY / "config.yaml").learner.checkpoint.resume_from == "latest"


def test_k8s_commands_are_valid(tmp_path):
    docs = [d for d in yaml.safe_load_all((DEPLOY / "k8s" / "asyncrl.yaml").read_text()) if d]
    config_map = next(d for d in docs if d["kind"] == "ConfigMap")
    config_file = tmp_path / "config.yaml"
    config_file.write_text(config_map["data"]["config.yaml"])
    containers = [c for d in docs if d["kind"] in ("Deployment", "Job")
                  for c in d["spec"]["template"]["spec"].get("initContainers", []) + d["spec"]["template"]["spec"]["containers"]
                  if c["image"].startswith("asyncrl")]
    roles = {c["args"][0] for c in containers}
    assert roles == {"make-tiny-model", "controller", "teacher", "rollout", "learner"}
    for c in containers:
        _check(c["args"], config_file)
        env = {e["name"]: e for e in c.get("env", [])}
        assert env["ASYNCRL_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "asyncrl-token", "key": "token"}
        assert env["ASYNCRL_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "asyncrl-redis",
                                                                              "key": "password"}
    # The learner restarts in place and resumes from its checkpoint on a persistent volume.
    job = next(d for d in docs if d["kind"] == "Job")
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "OnFailure" and job["spec"]["backoffLimit"] > 0
    [learner] = pod["containers"]
    assert _check(learner["args"], config_file).learner.checkpoint.resume_from == "latest"
    runs = next(v for v in pod["volumes"] if v["name"] == "runs")
    assert runs["persistentVolumeClaim"]["claimName"] == "asyncrl-runs"
    assert {"name": "runs", "mountPath": "/runs"} in learner["volumeMounts"]
    assert any(d["kind"] == "PersistentVolumeClaim" and d["metadata"]["name"] == "asyncrl-runs" for d in docs)
    services = {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
    assert {"asyncrl-redis", "asyncrl-controller", "asyncrl-teacher", "asyncrl-learner"} <= services


@pytest.mark.parametrize("path", ["Dockerfile"])
def test_dockerfile_installs_the_package(path):
    text = (DEPLOY / path).read_text()
    assert "pip install ." in text and 'ENTRYPOINT ["asyncrl"]' in text
