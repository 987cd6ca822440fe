"""A real Prometheus (Debian's package) scrapes a local run through deploy/prometheus/prometheus.yml's jobs:
every service answers, `promtool check metrics` passes on every endpoint, every series the Grafana dashboard
queries exists in the scrape and every dashboard query evaluates; the status page shows the learner's
current step; then SIGINT stops the run cleanly (no process left, nothing lost; the audit says where it ended)."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from asyncrl.tools.dashboard import build, queries
from tests.e2e.test_system import DEMO_CONFIG, no_process_left
from tests.run_helpers import REPO, read_events, running_up, steps_done, stopped_intact, wait_for

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(not shutil.which("prometheus") or not shutil.which("promtool"),
                                 reason="needs Debian's prometheus package (scripts/setup.sh installs it)")]

PROMQL_WORDS = {"sum", "by", "rate", "increase", "histogram_quantile", "le", "changes", "without", "count",
                "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression reads: identifiers that are neither functions, keywords, label
    names inside braces or `by (...)`, nor label values."""
    expr = re.sub(r'"[^"]*"', '""', expr)          # label values
    expr = re.sub(r"\{[^}]*\}", "", expr)          # label matchers
    expr = re.sub(r"\b(by|without)\s*\([^)]*\)", "", expr)  # grouping labels
    expr = re.sub(r"\[[^\]]*\]", "", expr)          # range selectors
    return {m.group(1) for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", expr)
            if not m.group(2) and m.group(1) not in PROMQL_WORDS}


def test_metric_names_of_a_query():
    assert metric_names('histogram_quantile(0.9, sum by (le, replica) (rate(a_b_bucket{x="y"}[1m])))') == {"a_b_bucket"}
    assert metric_names('sum by (job) (rate(g_total{grpc_code!="OK"}[1m])) / up') == {"g_total", "up"}


def prom_query(port: int, expr: str) -> list:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as answer:
        body = json.loads(answer.read())
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


def scrape_config(tmp_path: Path, targets: dict[str, list[str]]) -> Path:
    """deploy/prometheus/prometheus.yml with its targets pointed at this machine's ports (same job names,
    same rules file), scraping every second."""
    config = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
    config["global"]["scrape_interval"] = "1s"
    shutil.copy(REPO / "deploy" / "prometheus" / "rules.yml", tmp_path / "rules.yml")
    jobs = []
    for job in config["scrape_configs"]:
        if job["job_name"] in targets:
            jobs.append({"job_name": job["job_name"],
                         "static_configs": [{"targets": targets[job["job_name"]],
                                             "labels": {"service": job["job_name"]}}]})
    assert {j["job_name"] for j in jobs} == set(targets)
    config["scrape_configs"] = jobs
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_prometheus_scrapes_every_service_and_the_dashboard_queries_exist(tmp_path):
    from asyncrl.tools.processes import free_port, free_port_run

    run_dir = tmp_path / "run"
    ports = {name: free_port("127.0.0.1") for name in ("status", "teacher", "learner", "prometheus")}
    ports["rollout"] = free_port_run(2)  # replica i serves its metrics on this port + i
    targets = {"controller": [f"127.0.0.1:{ports['status']}"], "teacher": [f"127.0.0.1:{ports['teacher']}"],
               "learner": [f"127.0.0.1:{ports['learner']}"],
               "rollout": [f"127.0.0.1:{ports['rollout']}", f"127.0.0.1:{ports['rollout'] + 1}"]}
    args = ["--config", str(DEMO_CONFIG), "--set", f"run_dir={run_dir}", "--set", "learner.total_steps=1000",
            "--set", f"controller.status_port={ports['status']}", "--set", f"teacher.metrics_port={ports['teacher']}",
            "--set", f"learner.metrics_port={ports['learner']}", "--set", f"rollout.metrics_port={ports['rollout']}"]
    prometheus = subprocess.Popen(
        ["prometheus", f"--config.file={scrape_config(tmp_path, targets)}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{ports['prometheus']}"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "w"))  # noqa: SIM115
    try:
        with running_up(*args) as proc:
            wait_for(lambda: proc.poll() is not None or steps_done(run_dir) >= 12, 300, "12 learner steps")
            assert proc.poll() is None, proc.communicate()[0][-3000:]

            def all_up() -> bool:
                result = prom_query(ports["prometheus"], "up")
                return len(result) == 5 and all(r["value"][1] == "1" for r in result)

            wait_for(all_up, 60, "every target up in Prometheus")
            time.sleep(3)  # a few more scrapes, so rate() over them has two points
            check_scrape(ports, targets)
            check_status_page(ports["status"], run_dir)

            proc.send_signal(signal.SIGINT)  # = Ctrl-C
            out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 130, out[-3000:]
        assert "[up] interrupted; stopping" in out and "Traceback" not in out, out[-3000:]
        assert stopped_intact(out), out[-3000:]
        no_process_left(run_dir)
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=30)


def check_scrape(ports: dict, targets: dict) -> None:
    # A series of every service, through the query API.
    for job, series in {"controller": "asyncrl_controller_current_version", "teacher": "asyncrl_teacher_tokens_scored_total",
                        "learner": "asyncrl_learner_step", "rollout": "asyncrl_rollout_tokens_generated_total"}.items():
        result = prom_query(ports["prometheus"], f'{series}{{job="{job}"}}')
        assert result and max(float(r["value"][1]) for r in result) > 0, (job, result)
        info = prom_query(ports["prometheus"], f'asyncrl_service_info{{job="{job}"}}')
        assert {r["metric"]["service"] for r in info} == {job}
    replicas = {r["metric"]["replica"] for r in prom_query(ports["prometheus"], "asyncrl_rollout_weight_version")}
    assert replicas == {"replica-0", "replica-1"}
    lag = {r["metric"]["replica"] for r in prom_query(ports["prometheus"], "asyncrl_controller_replica_version_lag")}
    assert lag == replicas  # the two label sets join

    # promtool's linter on every endpoint's exposition.
    for job, addresses in targets.items():
        for address in addresses:
            with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as answer:
                text = answer.read()
            lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, timeout=30,
                                  check=False)
            assert lint.returncode == 0, (job, lint.stdout.decode() + lint.stderr.decode())

    # The Grafana dashboard: every series it reads exists, every query evaluates.
    dashboard = build()
    assert json.loads((REPO / "deploy" / "grafana" / "dashboards" / "asyncrl.json").read_text()) == dashboard
    names = set().union(*(metric_names(expr) for expr in queries(dashboard)))
    missing = [n for n in sorted(names) if not prom_query(ports["prometheus"], f'count({{__name__="{n}"}})')]
    assert not missing, f"dashboard series absent from the scrape: {missing}"
    for expr in queries(dashboard):
        prom_query(ports["prometheus"], expr)  # asserts status success


def check_status_page(port: int, run_dir: Path) -> None:
    asked_at = time.time()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as answer:
        page = answer.read().decode()
    shown = int(re.search(r"step <b>(\d+)</b> of (\d+)", page).group(1))
    steps = [e for e in read_events(run_dir, "learner") if e["kind"] == "step"]
    # The learner reports at most every learner.status_interval_s (0.25 s) and never stays longer than that
    # behind: a step finished 1.25 s before the page was asked for (the interval, then an RPC and the page's
    # own latency on two busy cores) is on it, and no step after the last one in the event log (or the one just
    # after, when a step ends between the page and the event log read).
    reported = max((e["step"] for e in steps if e["t"] <= asked_at - 1.25), default=0)
    assert reported <= shown <= len(steps) + 1 and shown >= 12, (reported, shown, len(steps))
    assert "<polyline" in page and "ETA" in page and "trajectories/s" in page
