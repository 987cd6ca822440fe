"""Child processes of a local run: start with a log file, watch, stop them all (SIGTERM, then SIGKILL)."""

from __future__ import annotations

import contextlib
import os
import random
import select
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from asyncrl.core.wire.ports import why_not_listenable
from asyncrl.tools.spawners import ForkedProcess, Spawner, SubprocessSpawner, child_env, reap_orphans


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def ephemeral_port_range() -> tuple[int, int]:
    """The ports the kernel hands out by itself (bind to port 0, an outgoing connection's own end)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default
    return low, high


def free_port_run(count: int, host: str = "127.0.0.1", tries: int = 200) -> int:
    """A port p with p .. p + count - 1 all free now, for a run that fixes a port where replica i serves on the
    configured port + i. Picked outside the kernel's ephemeral range, as a user fixes a port: a port inside it
    that is free now can be taken before the replica binds it by any port-0 server or outgoing connection of
    the run itself (a CI run lost a replica's metrics port that way, for good)."""
    low, high = ephemeral_port_range()
    first, last = (10000, low - count) if low - count > 10000 else (high + 1, 65536 - count)
    rng = random.Random()
    for _ in range(tries):
        base = rng.randrange(first, last)
        if all(why_not_listenable(host, port) is None for port in range(base, base + count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports on {host} outside {low}-{high} in {tries} tries")


def process_argv(pid: int) -> list[str]:
    """The command line of process `pid` from /proc; a service forked by `up`'s fork server shows its own as
    one retitled string, split back here. Empty for a zombie."""
    argv = [a for a in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0") if a]
    return shlex.split(argv[0]) if len(argv) == 1 else argv


@dataclass
class Child:
    name: str
    proc: subprocess.Popen | ForkedProcess
    log_path: Path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill_leftovers(self) -> None:
        """SIGKILL what the dead child left running in its process group (it leads a session of its own). A
        vLLM engine runs in processes of its own that outlive a replica killed with SIGKILL: each kept its
        CPU KV cache (a fifth of the machine's memory) until later replicas could not start."""
        if self.alive():
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class ProcessGroup:
    """Processes started for one run (by `spawner`: fresh processes unless given another); `stop_all` is safe
    to call more than once, and the last one (nothing kept) closes the spawner."""

    def __init__(self, log_dir: Path, spawner: Spawner | None = None):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.children: list[Child] = []
        self.spawner = spawner or SubprocessSpawner()

    def start(self, name: str, argv: list[str], env: dict | None = None) -> Child:
        log_path = self.log_dir / f"{name}.log"
        child = Child(name, self.spawner.start(argv, child_env(env), log_path), log_path)
        self.children.append(child)
        return child

    def start_cli(self, name: str, args: list[str], env: dict | None = None) -> Child:
        return self.start(name, [sys.executable, "-m", "asyncrl.tools.cli", *args], env)

    def failed(self) -> list[Child]:
        return [c for c in self.children if c.proc.poll() not in (None, 0)]

    def wait_for_an_exit(self, timeout_s: float) -> None:
        """Return as soon as a child exits, or after `timeout_s` (a supervisor that only looked once a second left
        a dead process unnoticed for half a second on average before restarting it). Every child not reaped yet
        is watched, a dead one too: its pidfd is readable at once, so a child that died just before this call
        ends it (polling first would reap it unseen and sleep the whole time-out on the others). The exits it
        returns for are reaped before it returns, so they do not wake the next wait."""
        fds = []
        try:
            for child in self.children:
                if child.proc.returncode is None:
                    try:
                        fds.append(os.pidfd_open(child.proc.pid))
                    except ProcessLookupError:  # reaped elsewhere meanwhile
                        pass
                    except (OSError, AttributeError):  # not Linux >= 5.3: a plain sleep below
                        fds.clear()
                        break
            if fds:
                select.select(fds, [], [], timeout_s)
            else:
                time.sleep(timeout_s)
        finally:
            for fd in fds:
                os.close(fd)
        for child in self.children:
            child.alive()  # reaps what exited
        if self.spawner.adopts:
            reap_orphans({c.proc.pid for c in self.children} | self.spawner.own_pids())

    def stop(self, names: tuple[str, ...], grace_s: float = 15.0) -> None:
        """Stop (and wait for) only the children named in `names`; the others keep running."""
        self.stop_all(grace_s, keep=tuple(c.name for c in self.children if c.name not in names))

    def stop_all(self, grace_s: float = 15.0, keep: tuple[str, ...] = ()) -> None:
        """SIGTERM every child (except those named in `keep`), SIGKILL what is still running after `grace_s`;
        the stopped ones leave the group."""
        stopping = [c for c in reversed(self.children) if c.name not in keep]
        for child in stopping:
            if child.alive():
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.time() + grace_s
        self.children = [c for c in self.children if c.name in keep]
        for child in stopping:
            try:
                child.proc.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                os.killpg(child.proc.pid, signal.SIGKILL)
                child.proc.wait()
            child.kill_leftovers()
        if not keep:
            self.spawner.close()
