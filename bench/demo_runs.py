"""The demo run from a benchmark: the whole `asyncrl up` in line (`run_demo`) or on a thread while the
benchmark acts on it (`DemoInBackground`), and the CPU its processes used (`sample_cpu`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from asyncrl.tools.processes import process_argv


def run_demo(run_dir: Path, overrides: list[str], timeout_s: float = 1800,
             cpu_samples: list | None = None, example: str = "tiny-arith", memory_peaks: dict | None = None,
             events_dir: Path | None = None, config: Path | None = None) -> list[dict]:
    """`asyncrl up` on examples/<example>.yaml (the demo's) with `--set` overrides, into `run_dir`; returns the learner's
    events (raises SystemExit with the output's tail when the run fails). With `cpu_samples` (a list), the CPU
    time of every process of the run is sampled into it every half second (`sample_cpu`); with `memory_peaks` (a
    dict), each role's peak resident memory (`sample_memory`). `events_dir`: where the learner's events are
    (a run of a deployment of several: `run_dir/<run>`); `config`: a config file instead of the example's."""
    repo = Path(__file__).resolve().parents[1]
    argv = [sys.executable, "-m", "asyncrl", "--log-level", "WARNING", "up",
            "--config", str(config or repo / "examples" / f"{example}.yaml"), "--set", f"run_dir={run_dir}"]
    for override in overrides:
        argv += ["--set", override]
    with tempfile.TemporaryFile("w+") as output:
        proc = subprocess.Popen(argv, cwd=repo, stdout=output, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None and time.monotonic() < deadline:
            if cpu_samples is not None:
                cpu_samples.append(sample_cpu(proc.pid))
            if memory_peaks is not None:
                for role, peak in sample_memory(proc.pid).items():
                    memory_peaks[role] = max(memory_peaks.get(role, 0), peak)
            time.sleep(0.5)
        if proc.poll() is None:
            proc.kill()
        output.seek(0)
        tail = output.read()[-3000:]
    if proc.wait() != 0:
        raise SystemExit(f"asyncrl up {' '.join(overrides)} failed:\n{tail}")
    return [json.loads(line) for line in ((events_dir or run_dir) / "events" / "learner.jsonl").read_text().splitlines()]


class DemoInBackground:
    """`run_demo` on a thread of its own, for a benchmark that acts on the run while it trains: `done` is set
    once the run ended; `events()` waits for it and returns the learner's events (SystemExit when it failed)."""

    def __init__(self, run_dir: Path, overrides: list[str], **run_demo_args):
        self.done = threading.Event()
        self._result: dict = {}
        self._thread = threading.Thread(target=self._run, args=(run_dir, overrides), kwargs=run_demo_args)
        self._thread.start()

    def _run(self, run_dir: Path, overrides: list[str], **run_demo_args) -> None:
        try:
            self._result["events"] = run_demo(run_dir, overrides, **run_demo_args)
        except SystemExit as failed:
            self._result["error"] = str(failed)
        finally:
            self.done.set()

    def events(self) -> list[dict]:
        self._thread.join()
        if "error" in self._result:
            raise SystemExit(self._result["error"])
        return self._result["events"]


def _process_tree(root_pid: int) -> list[tuple[int, str, int]]:
    """(pid, role, owner) of every process under `root_pid`, from /proc (Linux): roles are the `asyncrl`
    subcommands (learner, rollout, teacher, controller, check), `redis-server`, `up`'s fork server and `up`. A
    process a service started itself (vLLM's engine core and its worker) takes that service's role, and its
    owner is the service's process (a service's own process is its own owner)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    out, todo = [], [(root_pid, None)]
    while todo:
        pid, service = todo.pop()
        try:
            argv = process_argv(pid) or [""]  # a zombie's is empty
        except OSError:
            continue  # exited meanwhile
        role = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a.endswith("asyncrl.tools.cli")), "")
        if "asyncrl.tools.fork_server" in argv:
            role = "fork-server"
        if "redis-server" in argv[0]:
            role = "redis-server"
        if role in ("", "--log-level"):
            role, owner = service if service is not None else ("up", pid)
        else:
            owner = pid
        out.append((pid, role, owner))
        inherited = (role, owner) if role not in ("up", "fork-server") else None
        todo += [(child, inherited) for child in children.get(pid, [])]
    return out


def sample_cpu(root_pid: int) -> tuple[float, dict[str, float]]:
    """(time, role -> CPU seconds used so far) over the process tree under `root_pid` (`_process_tree`)."""
    ticks, used = os.sysconf("SC_CLK_TCK"), {}
    for pid, role, _owner in _process_tree(root_pid):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        used[role] = used.get(role, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return time.time(), used


def sample_memory(root_pid: int) -> dict[str, int]:
    """Role -> the largest peak resident memory (VmHWM, bytes) of one service of that role under `root_pid`:
    its own process's and those of the processes it started (vLLM's engine core and worker), summed."""
    services: dict[tuple[str, int], int] = {}
    for pid, role, owner in _process_tree(root_pid):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        kib = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0)
        services[role, owner] = services.get((role, owner), 0) + kib * 1024
    peaks: dict[str, int] = {}
    for (role, _owner), peak in services.items():
        peaks[role] = max(peaks.get(role, 0), peak)
    return peaks


def cpu_ms_per_step(samples: list, start_t: float, end_t: float, steps: int) -> dict[str, float]:
    """Each role's CPU milliseconds per learner step between two instants (the nearest samples)."""
    first = min(samples, key=lambda s: abs(s[0] - start_t))[1]
    last = min(samples, key=lambda s: abs(s[0] - end_t))[1]
    return {role: round(1000 * (cpu - first.get(role, 0.0)) / steps, 1) for role, cpu in sorted(last.items())}
