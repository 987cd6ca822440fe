"""How `asyncrl up` starts a service process: a fresh interpreter (`spawn`) or a fork of the run's fork server
(`fork`, `asyncrl.tools.fork_server`), chosen by `launch.services` and made by `make_spawner`.

Either way the service is a child of `up` that leads a session of its own and writes to its log file, and `up`
watches it through a `subprocess.Popen` or a `ForkedProcess` (the same calls). A fork server that cannot start,
or dies, leaves the spawner starting fresh interpreters: slower, never a failed start.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Protocol

PR_SET_CHILD_SUBREAPER = 36
READY_TIMEOUT_S = 120.0
"""How long the first start waits for the fork server's imports (about 9 s on two AVX2 cores; a loaded machine
takes longer)."""


SHARED_CORES_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}
"""What `up`'s processes run with unless the user's environment says otherwise. They share the machine's cores,
so an OpenMP thread that waits for its peers must sleep, not spin: a 30M learner on two torch threads beside
two replicas spent 1.07 s more CPU per step than on one thread, spinning, and stepped slower (1.03x); asleep
while waiting, 0.41 s more, and the step took 0.96x (bench/step_bound.py). Read when torch loads, so it is set
for the fork server too."""


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a child of `up` starts with (the fork server's too: what its imports read)."""
    return {**SHARED_CORES_ENV, **os.environ, "PYTHONUNBUFFERED": "1", **(extra or {})}


class Spawner(Protocol):
    adopts: bool
    """Whether this process adopts orphans (then `reap_orphans` must reap them)."""

    def start(self, argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen | ForkedProcess:
        """Start `argv` (a `python -m asyncrl.tools.cli ...` command line for the fork server; anything for a
        fresh process) with exactly `env`, stdout and stderr appended to `log_path`."""

    def own_pids(self) -> set[int]:
        """The processes the spawner runs for itself."""

    def close(self) -> None:
        """Stop what the spawner itself runs (not the processes it started)."""


class SubprocessSpawner:
    adopts = False

    def __init__(self, env: dict[str, str] | None = None):
        pass

    def start(self, argv, env, log_path):
        # The child keeps its own copy of the log descriptor; ours closes right away.
        with open(log_path, "ab") as log_file:
            # Own session: Ctrl-C in the terminal reaches the launcher only, which stops children in order.
            return subprocess.Popen(
                argv, stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def own_pids(self) -> set[int]:
        """The processes the spawner runs for itself."""
        return set()

    def close(self) -> None:
        pass


class ForkedProcess:
    """A service forked by the fork server and adopted by this process (its subreaper): the parts of
    `subprocess.Popen` that `up` uses, on the pid."""

    def __init__(self, pid: int, argv: list[str]):
        self.pid, self.args = pid, argv
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its exit code is lost
                self.returncode = -signal.SIGKILL
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.01)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServerSpawner:
    """Starts `python -m asyncrl.tools.cli ...` command lines as forks of a fork server started here; any other
    command line, and every one once the server is unusable, as a fresh process."""

    def __init__(self, env: dict[str, str] | None = None):
        """`env`: the fork server's environment (what its imports read, e.g. TORCH_CPP_LOG_LEVEL)."""
        self.fallback = SubprocessSpawner()
        self.adopts = False
        self.why_not: str | None = None
        """Why the fork server is not used (None while it is)."""
        self._lock = threading.Lock()
        self._ready = False
        self._server: subprocess.Popen | None = None
        if not become_subreaper():
            self.why_not = "this system cannot adopt forked children (prctl PR_SET_CHILD_SUBREAPER)"
            return
        self.adopts = True
        # The server `asyncrl up` started in its first lines, or one started now: its imports go on while `up`
        # starts Redis, and the first service start waits for them.
        self._server = take_prestarted_server() or start_fork_server(env)

    def start(self, argv, env, log_path):
        args = cli_args(argv)
        if args is not None:
            with self._lock:
                pid = self._fork(args, env, log_path, shlex.join(argv))
            if pid is not None:
                return ForkedProcess(pid, argv)
        return self.fallback.start(argv, env, log_path)

    def _fork(self, args: list[str], env: dict[str, str], log_path: Path, title: str) -> int | None:
        if self.why_not is not None or self._server is None:
            return None
        if not self._ready:
            answer = self._answer(READY_TIMEOUT_S)
            if not answer.get("ready"):
                self._give_up(answer.get("why", "it did not start"))
                return None
            self._ready = True
        request = {"args": args, "env": env, "log": str(log_path), "cwd": os.getcwd(), "title": title}
        try:
            self._server.stdin.write(json.dumps(request) + "\n")
            self._server.stdin.flush()
        except (BrokenPipeError, OSError) as err:
            self._give_up(f"it is gone ({err})")
            return None
        answer = self._answer(30.0)
        if "error" in answer:  # this start failed; the server serves on
            print(
                f"[up] the fork server could not fork {title!r}: {answer['error']}; starting it as a new "
                "process",
                flush=True,
            )
            return None
        if "pid" not in answer:
            self._give_up(answer["why"])
            return None
        return int(answer["pid"])

    def _answer(self, timeout_s: float) -> dict:
        """The server's next line, or {"why": ...} when none comes in time or it exited."""
        out = self._server.stdout
        ready, _, _ = select.select([out], [], [], timeout_s)
        if not ready:
            return {"why": f"no answer in {timeout_s:.0f} s"}
        line = out.readline()
        if not line:
            try:
                code = self._server.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = "its output closed"
            return {"why": f"it exited ({code})"}
        return json.loads(line)

    def _give_up(self, why: str) -> None:
        self.why_not = why
        print(f"[up] the fork server is not used ({why}): every service starts as a new process", flush=True)
        self.close()

    def own_pids(self) -> set[int]:
        return set() if self._server is None else {self._server.pid}

    def close(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        # It holds nothing that must be flushed or stopped in order: no need to wait for it to end itself.
        server.kill()
        server.wait()
        for pipe in (server.stdin, server.stdout):
            with contextlib.suppress(OSError):
                pipe.close()


def start_fork_server(env: dict[str, str] | None) -> subprocess.Popen:
    """A fork server (`asyncrl.tools.fork_server`), its imports begun; `env` is what they read."""
    return subprocess.Popen([sys.executable, "-m", "asyncrl.tools.fork_server"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=env, start_new_session=True, text=True, bufsize=1)


_prestarted: list[subprocess.Popen] = []
"""The fork server `asyncrl up` started in its first lines, until a `ForkServerSpawner` takes it."""


def prestart_fork_server(env: dict[str, str]) -> None:
    """Start the run's fork server now, before the configuration is read: `up`'s own start then overlaps its
    imports. The first `ForkServerSpawner` takes it; one nobody takes (a refused config, `launch.services:
    spawn`) is killed when this process exits."""
    _prestarted.append(start_fork_server(env))


def take_prestarted_server() -> subprocess.Popen | None:
    return _prestarted.pop() if _prestarted else None


def discard_prestarted_server() -> None:
    while _prestarted:
        server = _prestarted.pop()
        server.kill()
        server.wait()


atexit.register(discard_prestarted_server)


def cli_args(argv: list[str]) -> list[str] | None:
    """The asyncrl arguments of `python -m asyncrl.tools.cli ARGS` run by this interpreter, else None."""
    prefix = [sys.executable, "-m", "asyncrl.tools.cli"]
    return argv[len(prefix) :] if argv[: len(prefix)] == prefix else None


def become_subreaper() -> bool:
    """Adopt the orphans of this process's descendants (Linux >= 3.4): a twice-forked service becomes our child."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def reap_orphans(known: set[int]) -> list[int]:
    """Reap the exited processes this subreaper adopted that it does not watch (what a killed service left,
    e.g. a vLLM engine process `kill_leftovers` ended), so none stays a zombie; their pids."""
    me, reaped = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in known:
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
        except OSError:
            continue
        if state == "Z" and int(ppid) == me:
            try:
                os.waitpid(int(entry), os.WNOHANG)
                reaped.append(int(entry))
            except ChildProcessError:
                pass
    return reaped


SPAWNERS = {"spawn": SubprocessSpawner, "fork": ForkServerSpawner}


def make_spawner(kind: str, env: dict[str, str] | None = None) -> Spawner:
    """The spawner `launch.services` names (the config's schema allows only these keys)."""
    if kind != "fork":
        discard_prestarted_server()
    return SPAWNERS[kind](env)
