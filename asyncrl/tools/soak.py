"""A chaos soak of a running `asyncrl up`: faults at random moments, the run must keep training.

After a calm phase (the undisturbed training rate), every 2-10 s (uniformly at random) one role, or two at
once, is hit: `kill -9` (then `up` restarts it: the controller from its saved state, Redis on its
append-only file, the learner from its latest checkpoint) or, for a share of the faults, `SIGSTOP` for 1-4 s
and `SIGCONT` (a process that hangs and comes back). Roles: the controller, the teacher, each rollout replica,
the learner and the run's redis-server. After each fault the soak waits until the learner has taken a few
more steps: a run that does not (within `wedge_s`) is reported as wedged and the soak ends there. Then `up` is
stopped with SIGINT, which writes the run's audit: nothing lost, nothing trained twice, η held.

What it reports: every fault with the time to the learner's progress after it, the training rate in the
calm phase and under faults (learner steps of the surviving timeline per second: steps a killed learner
trains again from its checkpoint count once), and the audit.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

from asyncrl.core.config.file import load_config
from asyncrl.core.records.learner import Step
from asyncrl.core.runtime.events import read_records
from asyncrl.tools.audit import surviving

PROGRESS_STEPS = 3
"""Learner steps after a fault that count as the run going again."""


@dataclass
class Fault:
    at_s: float
    """Seconds into the fault phase."""
    kind: str
    """"kill" (SIGKILL) or "pause" (SIGSTOP, then SIGCONT after `paused_s`)."""
    roles: list[str]
    paused_s: float
    step_before: int
    pids: list[int]
    """The processes the signal reached (a role `up` was just starting again may have none)."""
    recovered_s: float | None = None
    """From the kill (or the SIGCONT) to PROGRESS_STEPS more learner steps; None: the run never went on."""


def up_argv(config: str, run_dir: Path, overrides: list[str]) -> list[str]:
    """`asyncrl up` with restarts that never run out and checkpoints often enough to lose little."""
    sets = [f"run_dir={run_dir}", "learner.total_steps=100000000", "controller.max_restarts=100000",
            "teacher.max_restarts=100000", "rollout.max_restarts=100000", "learner.max_restarts=100000",
            "buffer.local_max_restarts=100000", *overrides]
    argv = [sys.executable, "-m", "asyncrl.tools.cli", "--log-level", "WARNING", "up", "--config", config]
    for item in sets:
        argv += ["--set", item]
    return argv


def role_patterns(run_dir: Path) -> dict[str, str]:
    """`pgrep -f` patterns of the run's processes, by role."""
    cfg_path = run_dir / "config.resolved.yaml"
    cfg = load_config(cfg_path)
    roles = {role: f"cli {role} --config {cfg_path}" for role in ("controller", "learner")}
    if cfg.teacher.enabled:
        roles["teacher"] = f"cli teacher --config {cfg_path}"
    for i in range(cfg.rollout.replicas):
        roles[f"replica-{i}"] = f"cli rollout --config {cfg_path} --replica-id replica-{i}"
    if (run_dir / "redis").is_dir():  # the run's own redis-server (it retitles itself "redis-server host:port")
        url = urlsplit(cfg.buffer.redis_url)
        roles["redis"] = f"redis-server {url.hostname}:{url.port}"
    return roles


def pids_of(pattern: str, parent: int) -> list[int]:
    """The processes `up` (pid `parent`) started whose command line holds `pattern`."""
    out = subprocess.run(["pgrep", "-P", str(parent), "-f", pattern], check=False, capture_output=True,
                         text=True).stdout
    return [int(pid) for pid in out.split()]


class StepCounter:
    """Learner `step` records written so far, reading only what was appended since the last call (the log
    grows by megabytes a minute; parsing it whole after every fault would take longer than the recovery it
    times)."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / "events" / "learner.jsonl"
        self.offset = self.steps = 0

    def count(self) -> int:
        if self.path.exists():
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
            complete = data[: data.rfind(b"\n") + 1]
            self.offset += len(complete)
            self.steps += complete.count(b'"kind":"step"')
        return self.steps


def surviving_step(run_dir: Path) -> int:
    """The last learner step of the surviving timeline (a killed learner's steps after its checkpoint are not)."""
    if not (run_dir / "events" / "learner.jsonl").exists():
        return 0
    return max((e.step for e in surviving(read_records(run_dir, "learner")) if isinstance(e, Step)), default=0)


def signal_role(pattern: str, sig: int, parent: int) -> list[int]:
    """Send `sig` to the role's process; the pids it reached ([] when the role has no process right now: `up`
    is starting it again)."""
    hit = []
    for pid in pids_of(pattern, parent):
        try:
            os.kill(pid, sig)
            hit.append(pid)
        except ProcessLookupError:
            pass
    return hit


def soak(config: str, run_dir: Path, overrides: list[str], calm_s: float, chaos_s: float, seed: int,
         pause_share: float = 0.25, wedge_s: float = 120.0, log=print) -> dict:
    """Run `up`, measure `calm_s` undisturbed, then inject faults for `chaos_s`; returns the report."""
    rng = random.Random(seed)
    repo = Path(__file__).resolve().parents[2]
    output = open(run_dir.with_name(run_dir.name + ".up.log"), "w")  # noqa: SIM115 - closed below
    up = subprocess.Popen(up_argv(config, run_dir, overrides), cwd=repo, stdout=output, stderr=subprocess.STDOUT)
    faults: list[Fault] = []
    wedged = None
    try:
        counter = StepCounter(run_dir)
        if not _wait(lambda: counter.count() >= 20, 600, up):
            raise RuntimeError(f"the run did not reach 20 learner steps (see {output.name})")
        t0, s0 = time.time(), surviving_step(run_dir)
        time.sleep(calm_s)
        t1, s1 = time.time(), surviving_step(run_dir)
        calm_rate = (s1 - s0) / (t1 - t0)
        log(f"[soak] calm: {s1 - s0} steps in {t1 - t0:.0f} s ({calm_rate:.1f}/s); faults for {chaos_s:.0f} s")
        roles = role_patterns(run_dir)
        end = t1 + chaos_s
        while time.time() < end and wedged is None:
            time.sleep(rng.uniform(2, 10))
            chosen = rng.sample(sorted(roles), 2 if rng.random() < 0.2 else 1)
            kind = "pause" if rng.random() < pause_share else "kill"
            fault = Fault(round(time.time() - t1, 1), kind, chosen, 0.0, 0, [])
            if kind == "kill":
                for role in chosen:
                    fault.pids += signal_role(roles[role], signal.SIGKILL, up.pid)
            else:
                fault.paused_s = round(rng.uniform(1, 4), 1)
                for role in chosen:
                    fault.pids += signal_role(roles[role], signal.SIGSTOP, up.pid)
                time.sleep(fault.paused_s)
                for pid in fault.pids:
                    os.kill(pid, signal.SIGCONT)
            # Counted after the signal: steps a learner took before it was killed are not its recovery.
            hit, fault.step_before = time.time(), counter.count()
            if _wait(lambda f=fault: counter.count() >= f.step_before + PROGRESS_STEPS, wedge_s, up):
                fault.recovered_s = round(time.time() - hit, 1)
            else:
                wedged = f"no learner progress {wedge_s:.0f} s after {kind} of {chosen}" if up.poll() is None \
                    else f"`asyncrl up` ended (exit {up.returncode}) after {kind} of {chosen}"
            faults.append(fault)
            log(f"[soak] {fault.at_s:6.1f}s {kind} {' + '.join(chosen)} (pids {fault.pids})"
                + (f" for {fault.paused_s} s" if kind == "pause" else "")
                + (f": training again after {fault.recovered_s} s" if fault.recovered_s is not None else f": {wedged}"))
        t2 = time.time()
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)  # `up` stops everything, then writes the audit
            try:
                up.wait(timeout=300)
            except subprocess.TimeoutExpired:
                up.kill()
        output.close()
    s2 = surviving_step(run_dir)  # after `up` closed the learner's log: a learner killed last counts from its checkpoint
    summary_file = run_dir / "summary.json"
    audit = json.loads(summary_file.read_text())["audit"] if summary_file.exists() else {"ok": False}
    recovered = sorted(f.recovered_s for f in faults if f.recovered_s is not None)
    return {
        "seed": seed, "calm_s": round(t1 - t0, 1), "chaos_s": round(t2 - t1, 1),
        "calm_steps_per_s": round(calm_rate, 2), "chaos_steps_per_s": round((s2 - s1) / (t2 - t1), 2),
        "chaos_over_calm": round((s2 - s1) / (t2 - t1) / calm_rate, 3),
        "faults": len(faults), "kills": sum(f.kind == "kill" for f in faults),
        "pauses": sum(f.kind == "pause" for f in faults),
        "recovery_p50_s": recovered[len(recovered) // 2] if recovered else None,
        "recovery_max_s": recovered[-1] if recovered else None,
        # The soak stops its run itself, short of its steps: what counts is that nothing broke.
        "wedged": wedged, "audit_ok": bool(audit.get("intact")), "audit": audit.get("headline", ""),
        "fault_log": [asdict(f) for f in faults],
    }


def _wait(predicate, timeout_s: float, up: subprocess.Popen) -> bool:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if predicate():
            return True
        if up.poll() is not None:
            return False
        time.sleep(0.25)
    return False
