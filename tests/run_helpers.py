"""Helpers of the tests that drive `asyncrl up` as a subprocess: waiting on a run's event logs."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from asyncrl.core.runtime.events import read_events

REPO = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def running_up(*args: str, env: dict[str, str] | None = None):
    """`asyncrl up ARGS` as a subprocess of the repository root (output piped, unbuffered; `env`: its environment,
    the test's by default); stopped with its children on the way out if it is still running."""
    proc = subprocess.Popen([sys.executable, "-m", "asyncrl", "up", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"})
    try:
        yield proc
    finally:
        if proc.poll() is None:
            # SIGTERM: `up` stops its children (they run in sessions of their own and would outlive a SIGKILL of
            # `up`); whatever is left after that is killed, the whole tree.
            proc.terminate()
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                for pid in process_tree(proc.pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                proc.communicate()


def demo_args(run_dir: Path, steps: int, *sets: str) -> list[str]:
    """`asyncrl up` arguments for the demo (examples/tiny-arith.yaml) in `run_dir` for `steps` learner steps,
    plus `--set` for each of `sets` ("key=value")."""
    args = ["--config", str(REPO / "examples/tiny-arith.yaml")]
    for override in (f"run_dir={run_dir}", f"learner.total_steps={steps}", *sets):
        args += ["--set", override]
    return args


def steps_done(run_dir: Path) -> int:
    """Learner `step` records written so far (0 before the run has an events folder)."""
    return sum(e["kind"] == "step" for e in read_events(run_dir, "learner")) if (run_dir / "events").exists() else 0


def wait_for(predicate, timeout_s: float, what: str, poll_s: float = 0.3, run_dir: Path | None = None):
    """Poll `predicate` until it holds and return what it returned then; on a time-out the assertion carries the
    tails of `run_dir`'s service logs (what a CI failure needs to be understood without the run directory)."""
    deadline = time.time() + timeout_s
    while not (value := predicate()):
        assert time.time() < deadline, f"timed out waiting for {what}" + ("" if run_dir is None else log_tails(run_dir))
        time.sleep(poll_s)
    return value


def log_tails(run_dir: Path, lines: int = 12, width: int = 240) -> str:
    """The last `lines` lines of each service log of a run (each cut to `width` characters)."""
    out = []
    for log in sorted((run_dir / "logs").glob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        out.append(f"\n--- {log.name} ---\n" + "\n".join(line[:width] for line in tail))
    return "".join(out)


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    return tree


# Loopback as /proc/net/tcp{,6} spell it: 127.0.0.0/8 (little-endian words), ::1, ::ffff:127.x.x.x.
def _is_loopback(hex_address: str) -> bool:
    if len(hex_address) == 8:
        return hex_address.endswith("7F")
    return hex_address == "00000000000000000000000001000000" or (
        hex_address.startswith("0000000000000000FFFF0000") and hex_address.endswith("7F"))


def listening_sockets(pids: list[int]) -> list[tuple[str, bool]]:
    """(local address in hex as /proc prints it, whether it is loopback) of every TCP socket the processes
    listen on."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            continue
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:
                address = local.rsplit(":", 1)[0]
                found.append((local, _is_loopback(address)))
    return found


def kill_learner_after(run_dir: Path, steps: int, timeout_s: float = 600) -> None:
    """Once the run's learner has written `steps` steps, SIGKILL it (the process `up` started with the run's
    resolved config)."""
    wait_for(lambda: steps_done(run_dir) >= steps, timeout_s, f"{steps} learner steps", run_dir=run_dir)
    marker = f"learner --config {run_dir / 'config.resolved.yaml'}"
    [pid] = subprocess.run(["pgrep", "-f", marker], check=False, capture_output=True, text=True).stdout.split()
    os.kill(int(pid), signal.SIGKILL)


def replica_records(run_dir: Path) -> list:
    """Every rollout replica's typed event records of a run, replica after replica."""
    from asyncrl.core.runtime.events import read_records

    return [ev for path in sorted((run_dir / "events").glob("rollout-*.jsonl")) for ev in read_records(run_dir, path.stem)]


def stopped_intact(out: str) -> bool:
    """`up`'s output of a run stopped before its last step with nothing broken: the audit says INCOMPLETE, why
    (the step it ended at), and that nothing was lost."""
    return ("[up] audit INCOMPLETE" in out and "[up]   why: the run ended at step" in out and " 0 lost" in out
            and "failed:" not in out)
