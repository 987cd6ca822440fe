"""The deploy tier (`bash scripts/test_deploy.sh`): deploy/compose.yaml run for real in Docker on this machine.

Images come as a user gets them (base images pulled, or built from Debian packages where no registry answers;
the project's from the unmodified Dockerfile), then the stack runs the demo with two replicas: the learner
trains, Prometheus scrapes every service, a third replica joins, the learner is killed the way a crash kills
it and its restart finishes the run with a clean audit, and `down` leaves nothing behind. Timings and image
sizes go to runs/deploy-tier/report.json."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest

from tests.deploy.compose_stack import (
    CONTROLLER_METRICS,
    ComposeStack,
    learner_override,
    metric,
    prometheus,
)
from tests.deploy.images import GRAFANA, REPO, build_project_images, docker, ensure_base_images, torch_source
from tests.run_helpers import wait_for

pytestmark = [pytest.mark.deploy, pytest.mark.timeout(3600)]

TOTAL_STEPS = 1500
KILL_AT_STEP = 120   # past the first checkpoints (learner.checkpoint.save_every = 50)
STACK_TRACE_MARKERS = ("Exception raised from", "frame #", "terminate called")


def _no_buildx() -> bool:
    return docker("buildx", "version", check=False).returncode != 0


@pytest.fixture(scope="module")
def report():
    out = {}
    yield out
    path = REPO / "runs" / "deploy-tier" / "report.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")


def test_compose_stack_trains_survives_a_learner_crash_and_leaves_nothing(tmp_path, report):
    started = time.monotonic()
    report["base_images"] = ensure_base_images()
    with torch_source() as (torch_pip_args, host_network):
        built = build_project_images(torch_pip_args, host_network)
        report["builds"] = [vars(b) for b in built]
        # The classic builder builds every stage before the target: the first build carries both images' work.
        report["build_seconds_total"] = round(sum(b.seconds for b in built), 1)
        stack = ComposeStack(override=learner_override(tmp_path, TOTAL_STEPS), torch_pip_args=torch_pip_args,
                             classic_builder=_no_buildx())
        env_file = REPO / "deploy" / ".env"
        made_env_file = not env_file.exists()
        subprocess.run(["bash", "deploy/make-compose-env.sh"], cwd=REPO, check=True, capture_output=True)
        report["grafana"] = report["base_images"][GRAFANA] != "missing"
        services = ["redis", "make-model", "controller", "teacher", "rollout", "learner", "prometheus",
                    *(["grafana"] if report["grafana"] else [])]
        try:
            images_before = set(docker("images", "-q", "--no-trunc").stdout.split())
            up_start = time.monotonic()
            stack.run("up", "-d", "--build", "--scale", "rollout=2", *services, timeout=1800)
            # One build per image: compose rebuilt (from the cache) the two images, not one per service.
            dangling = set(docker("images", "-q", "--no-trunc", "--filter", "dangling=true").stdout.split())
            assert len(dangling - images_before) <= len(report["builds"]), dangling - images_before
            _trains(stack, report, up_start)
            _prometheus_scrapes_every_service(report, replicas=2)
            _a_replica_joins(stack, report)
            _learner_crash_is_survived(stack, report)
            _audit_and_plot(stack, report)
            _no_stack_traces(stack)
        finally:
            logs = stack.run("logs", "--no-color", check=False).stdout
            (REPO / "runs" / "deploy-tier").mkdir(parents=True, exist_ok=True)
            (REPO / "runs" / "deploy-tier" / "compose.log").write_text(logs)
            down = stack.run("down", "-v", "--remove-orphans", check=False, timeout=300)
            if made_env_file:
                env_file.unlink()
    assert down.returncode == 0, down.stderr
    assert stack.leftovers() == {"containers": [], "networks": [], "volumes": []}
    report["tier_seconds"] = round(time.monotonic() - started, 1)


def _version() -> float:
    return metric(CONTROLLER_METRICS, "asyncrl_controller_current_version") or 0.0


def _trains(stack: ComposeStack, report: dict, up_start: float) -> None:
    wait_for(lambda: _version() >= 5, 600, "the learner's first steps")
    report["up_to_step_5_s"] = round(time.monotonic() - up_start, 1)

    def all_healthy():
        health = {f"{s}-{i}": stack.container(s, i)["State"].get("Health", {}).get("Status")
                  for s, i in (("controller", 1), ("teacher", 1), ("rollout", 1), ("rollout", 2), ("learner", 1))}
        return all(h == "healthy" for h in health.values())

    wait_for(all_healthy, 300, "every service's health check to pass", poll_s=2)


def _prometheus_scrapes_every_service(report: dict, replicas: int) -> None:
    def healthy():
        targets = prometheus("/api/v1/targets")["activeTargets"]
        up = [t["labels"]["job"] for t in targets if t["health"] == "up"]
        wanted = {"controller": 1, "teacher": 1, "learner": 1, "rollout": replicas, "prometheus": 1}
        return up if all(up.count(job) == n for job, n in wanted.items()) else None

    report[f"prometheus_up_with_{replicas}_replicas"] = sorted(wait_for(
        healthy, 120, f"Prometheus to scrape every service ({replicas} replicas)", poll_s=2))
    rules = [r["name"] for g in prometheus("/api/v1/rules")["groups"] for r in g["rules"]]
    assert "AsyncrlLearnerStalled" in rules, rules
    report["alert_rules"] = len(rules)
    steps = prometheus("/api/v1/query?query=asyncrl_learner_step")["result"]
    assert steps and float(steps[0]["value"][1]) > 0, steps


def _a_replica_joins(stack: ComposeStack, report: dict) -> None:
    serving = {stack.container("rollout", i)["Id"] for i in (1, 2)}
    stack.run("up", "-d", "--no-deps", "--no-recreate", "--scale", "rollout=3", "rollout", timeout=600)
    assert {stack.container("rollout", i)["Id"] for i in (1, 2)} == serving  # the two serving are left alone
    wait_for(lambda: (metric(CONTROLLER_METRICS, "asyncrl_controller_live_replicas") or 0) >= 3, 180,
             "the controller to see 3 live replicas")
    _prometheus_scrapes_every_service(report, replicas=3)


def _learner_crash_is_survived(stack: ComposeStack, report: dict) -> None:
    wait_for(lambda: _version() >= KILL_AT_STEP, 600, f"learner step {KILL_AT_STEP}", poll_s=0.1)
    learner = stack.container("learner")
    assert learner["State"]["Running"], learner["State"]
    # SIGKILL from outside the container, as the kernel's OOM killer or a crash ends it: Docker records a
    # failure (exit 137) and the on-failure policy restarts it. (`docker kill` would read as the user's intent.)
    os.kill(learner["State"]["Pid"], signal.SIGKILL)
    killed_at = _version()
    report["learner_killed_at_version"] = killed_at
    restarted = wait_for(lambda: (c := stack.container("learner"))["RestartCount"] >= 1 and c, 120,
                         "the learner's restart")
    report["learner_restarts"] = restarted["RestartCount"]

    def finished():
        c = stack.container("learner")
        return c if c["State"]["Status"] == "exited" else None

    done = wait_for(finished, 1200, "the restarted learner to finish its run", poll_s=2)
    assert done["State"]["ExitCode"] == 0, done["State"]
    assert _version() == TOTAL_STEPS
    # It resumed from a checkpoint and took the run back to it (Controller.ResetTimeline), not from scratch.
    reset = re.findall(r"reset the run to version (\d+)", stack.run("logs", "--no-color", "learner").stdout)
    assert reset and 0 < int(reset[-1]) <= killed_at, reset
    report["learner_resumed_from_version"] = int(reset[-1])


def _audit_and_plot(stack: ComposeStack, report: dict) -> None:
    audit = stack.run("run", "--rm", "--no-deps", "learner", "audit", "/runs/compose", check=False)
    assert audit.returncode == 0, audit.stdout[-3000:] + audit.stderr[-3000:]
    findings = json.loads(audit.stdout[audit.stdout.index("{"):])
    assert findings["failures"] == [], findings["failures"]
    report["audit"] = {k: findings[k] for k in ("failures", "open_leases", "trained_beyond_eta")}
    plot = stack.run("run", "--rm", "--no-deps", "learner", "plot", "/runs/compose")
    assert plot.stdout.strip().splitlines()[-1].endswith(".png"), plot.stdout


def _no_stack_traces(stack: ComposeStack) -> None:
    for service in ("rollout", "teacher", "controller"):
        logs = stack.run("logs", "--no-color", service).stdout
        assert not any(m in logs for m in STACK_TRACE_MARKERS), f"{service} printed a stack trace:\n{logs[-3000:]}"
