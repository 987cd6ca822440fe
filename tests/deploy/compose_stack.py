"""deploy/compose.yaml driven as docs/deploy.md tells a user: `docker compose -f deploy/compose.yaml ...` from
the repository, secrets from deploy/.env (made by deploy/make-compose-env.sh), nothing exported, under a
project name of its own so a user's stack on the same engine is left alone."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.images import REPO, docker

COMPOSE_FILE = REPO / "deploy" / "compose.yaml"
PROJECT = "asyncrl-deploy-test"
CONTROLLER_METRICS = "http://127.0.0.1:8080/metrics"
PROMETHEUS = "http://127.0.0.1:9090"
SECRET_VARIABLES = ("ASYNCRL_TOKEN", "ASYNCRL_REDIS_PASSWORD", "ASYNCRL_LEARNER_SECRET", "GRAFANA_ADMIN_PASSWORD")


class ComposeStack:
    def __init__(self, *, override: Path | None, torch_pip_args: str, classic_builder: bool):
        self.files = ["-f", str(COMPOSE_FILE.relative_to(REPO))] + (["-f", str(override)] if override else [])
        # A fresh shell: none of the secrets exported (compose must find them in deploy/.env).
        self.env = {k: v for k, v in os.environ.items() if k not in SECRET_VARIABLES}
        self.env["COMPOSE_PROJECT_NAME"] = PROJECT
        if torch_pip_args:
            self.env["TORCH_PIP_ARGS"] = torch_pip_args
        if classic_builder:
            # No buildx here: `docker build` used the classic builder, so compose's builds use it too and find
            # the layers just built (BuildKit keeps a cache of its own).
            self.env["DOCKER_BUILDKIT"] = "0"

    def run(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
        return docker("compose", *self.files, *args, timeout=timeout, check=check, env=self.env)

    def container(self, service: str, index: int = 1) -> dict:
        ids = self.run("ps", "-a", "-q", service).stdout.split()
        inspected = [json.loads(docker("inspect", cid).stdout)[0] for cid in ids]
        [one] = [c for c in inspected if c["Config"]["Labels"]["com.docker.compose.container-number"] == str(index)]
        return one

    def leftovers(self) -> dict[str, list[str]]:
        label = f"label=com.docker.compose.project={PROJECT}"
        return {kind: docker(*cmd, "--filter", label, "-q").stdout.split()
                for kind, cmd in {"containers": ("ps", "-a"), "networks": ("network", "ls"),
                                  "volumes": ("volume", "ls")}.items()}


def learner_override(tmp: Path, total_steps: int) -> Path:
    """A compose override that only lengthens the learner's run, so every check happens while it trains (the
    demo's 300 steps take about 20 s in containers here)."""
    compose = yaml.safe_load(COMPOSE_FILE.read_text())
    command = compose["services"]["learner"]["command"] + ["--set", f"learner.total_steps={total_steps}"]
    path = tmp / "compose.longer-run.yaml"
    path.write_text(yaml.safe_dump({"services": {"learner": {"command": command}}}))
    return path


def get(url: str, timeout: float = 5) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def metric(url: str, name: str) -> float | None:
    """The unlabelled sample `name` of the Prometheus text at `url`, or None (not served, or not yet)."""
    try:
        text = get(url)
    except OSError:
        return None
    return next((sample.value for family in text_string_to_metric_families(text) for sample in family.samples
                 if sample.name == name and not sample.labels), None)


def prometheus(path: str) -> dict:
    return json.loads(get(PROMETHEUS + path))["data"]
