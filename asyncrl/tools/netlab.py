"""Hosts of their own on one machine: Linux network namespaces joined by a bridge, with links that can be
shaped, cut and flapped (the network tier's harness; root only).

A `Lab` puts each host in a namespace with one veth into a bridge that lives in the lab's own hub namespace,
at 10.77.0.<n>/24: the hosts reach each other and nothing else (not the machine's own interfaces, not another
lab: every lab's bridge is private, so labs side by side may reuse the addresses). On that link:

- `shape(host, mbit)` caps it with a token bucket (`tc tbf`), both ways: the host's veth for what it sends,
  the bridge's end for what it receives;
- `cut(a, b)` drops every packet between two hosts in both directions (a silent partition: a connect or a send
  waits for its time-out), `cut(a, b, reject=True)` refuses instead (a connect fails at once), and
  `cut(a, b, one_way=True)` lets connections a opens through but drops every new one from b (a reaches b, b
  not a); `heal(a, b)` removes what `cut` added for that pair;
- `link(host, up=False)` takes the host's link down (every peer at once), `link(host)` brings it back.

`run(host, argv)` starts a process in the host's namespace; leaving the lab's `with` kills every process
started in its namespaces (whoever started it) and deletes the namespaces, whatever happened inside.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from typing import Self

SUBNET = "10.77.0"
"""Each lab's hosts are SUBNET.1, SUBNET.2, ... (/24), on a bridge no other lab shares."""


class LabError(RuntimeError):
    """A lab command failed (its command line and what it printed), or the lab cannot run here."""


def why_no_lab() -> str | None:
    """Why network namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc", "iptables"):
        if not shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin"):
            return f"{tool} is not installed (Debian: iproute2, iptables)"
    return None


def _sh(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise LabError(f"{' '.join(argv)}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


@dataclass
class Host:
    name: str
    netns: str
    address: str
    device: str
    """The host's end of its veth (inside its namespace)."""
    bridge_port: str
    """The bridge's end of the host's veth (inside the hub namespace)."""


@dataclass
class Lab:
    """The hosts, their links and what runs on them; a context manager that tears it all down."""

    prefix: str = field(default_factory=lambda: "arl" + secrets.token_hex(2))
    """Namespace and interface names start with it (interface names are at most 15 characters)."""
    hosts: dict[str, Host] = field(default_factory=dict)
    _rules: dict[tuple[str, str], list[tuple[str, list[str]]]] = field(default_factory=dict)
    _processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def hub(self) -> str:
        return f"{self.prefix}-hub"

    def __enter__(self) -> Self:
        why = why_no_lab()
        if why:
            raise LabError(why)
        _sh("ip", "netns", "add", self.hub)
        try:
            _sh("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
            _sh("ip", "-n", self.hub, "link", "set", "br0", "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def add_host(self, name: str) -> Host:
        """A new host on the bridge, its address the next in SUBNET."""
        if name in self.hosts:
            raise LabError(f"host {name!r} is already in the lab")
        index = len(self.hosts) + 1
        host = Host(name=name, netns=f"{self.prefix}-{name}", address=f"{SUBNET}.{index}",
                    device=f"{self.prefix}h{index}", bridge_port=f"{self.prefix}b{index}")
        _sh("ip", "netns", "add", host.netns)
        self.hosts[name] = host
        # Both ends made in their namespaces at once: nothing is ever left on the machine's own interfaces.
        _sh("ip", "link", "add", host.device, "netns", host.netns, "type", "veth", "peer", "name", host.bridge_port,
            "netns", self.hub)
        _sh("ip", "-n", self.hub, "link", "set", host.bridge_port, "master", "br0", "up")
        _sh("ip", "-n", host.netns, "addr", "add", f"{host.address}/24", "dev", host.device)
        _sh("ip", "-n", host.netns, "link", "set", host.device, "up")
        _sh("ip", "-n", host.netns, "link", "set", "lo", "up")
        return host

    # -- processes ---------------------------------------------------------------------------------------
    def run(self, host: str, argv: list[str], **popen) -> subprocess.Popen:
        """`argv` started in `host`'s namespace (`subprocess.Popen` keywords as given); killed when the lab
        closes."""
        proc = subprocess.Popen(["ip", "netns", "exec", self.hosts[host].netns, *argv], **popen)
        self._processes.append(proc)
        return proc

    def call(self, host: str, argv: list[str], timeout_s: float = 60) -> subprocess.CompletedProcess:
        """`argv` run to its end in `host`'s namespace: its exit status and output (text)."""
        return subprocess.run(["ip", "netns", "exec", self.hosts[host].netns, *argv], capture_output=True,
                              text=True, timeout=timeout_s, check=False)

    # -- links -------------------------------------------------------------------------------------------
    def shape(self, host: str, mbit: float, burst_kb: int = 64, latency_ms: int = 50) -> None:
        """Cap `host`'s link at `mbit` megabits per second each way (a token bucket on each end of its veth)."""
        h = self.hosts[host]
        for netns, device in ((h.netns, h.device), (self.hub, h.bridge_port)):
            _sh("ip", "netns", "exec", netns, "tc", "qdisc", "replace", "dev", device, "root", "tbf",
                "rate", f"{mbit}mbit", "burst", f"{burst_kb}kb", "latency", f"{latency_ms}ms")

    def unshape(self, host: str) -> None:
        h = self.hosts[host]
        for netns, device in ((h.netns, h.device), (self.hub, h.bridge_port)):
            subprocess.run(["ip", "netns", "exec", netns, "tc", "qdisc", "del", "dev", device, "root"],
                           capture_output=True, check=False)

    def cut(self, a: str, b: str, reject: bool = False, one_way: bool = False) -> None:
        """Partition `a` from `b`: every packet dropped both ways (or refused, `reject`); `one_way`: only the
        connections `b` opens to `a` (a still reaches b, and b answers on the connections a opened)."""
        ha, hb = self.hosts[a], self.hosts[b]
        if one_way:
            new_only = ["-m", "conntrack", "--ctstate", "NEW", "-j", "DROP"]
            rules = [(hb.netns, ["OUTPUT", "-d", ha.address, *new_only])]
        elif reject:
            # Each side refuses what the other sends (a TCP reset, else ICMP unreachable) but lets the other's
            # refusals in: a connect then fails at once instead of timing out.
            rules = [(h.netns, ["INPUT", "-s", peer.address, *spec]) for h, peer in ((ha, hb), (hb, ha)) for spec in (
                ["-p", "tcp", "--tcp-flags", "RST", "RST", "-j", "ACCEPT"], ["-p", "icmp", "-j", "ACCEPT"],
                ["-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"], ["-j", "REJECT"])]
        else:
            rules = [(h.netns, [chain, flag, peer.address, "-j", "DROP"]) for h, peer in ((ha, hb), (hb, ha))
                     for chain, flag in (("INPUT", "-s"), ("OUTPUT", "-d"))]
        for netns, rule in rules:
            _sh("ip", "netns", "exec", netns, "iptables", "-w", "-A", *rule)
        self._rules.setdefault(self._pair(a, b), []).extend(rules)

    def heal(self, a: str, b: str) -> None:
        """Remove every rule `cut` added between `a` and `b`."""
        for netns, rule in self._rules.pop(self._pair(a, b), []):
            _sh("ip", "netns", "exec", netns, "iptables", "-w", "-D", *rule)

    def link(self, host: str, up: bool = True) -> None:
        """Take `host`'s link down (to every peer at once) or bring it back. Back up, every host's neighbour
        entries are flushed: one that failed or was still resolving while the link was down would fail a
        peer's next connect at once ("no route to host") until its kernel tried the address again."""
        h = self.hosts[host]
        _sh("ip", "-n", h.netns, "link", "set", h.device, "up" if up else "down")
        if up:
            for other in self.hosts.values():
                _sh("ip", "-n", other.netns, "neigh", "flush", "all")

    @staticmethod
    def _pair(a: str, b: str) -> tuple[str, str]:
        return (a, b) if a <= b else (b, a)

    # -- teardown ----------------------------------------------------------------------------------------
    def close(self) -> None:
        """Kill every process in the lab's namespaces, then delete them (their veths and the bridge go
        too)."""
        names = [h.netns for h in self.hosts.values()] + [self.hub]
        for netns in names:
            for pid in _netns_pids(netns):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc in self._processes:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for netns in names:
            subprocess.run(["ip", "netns", "del", netns], capture_output=True, check=False)
        self.hosts.clear()
        self._rules.clear()


def _netns_pids(netns: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, check=False)
    return [int(pid) for pid in done.stdout.split()] if done.returncode == 0 else []


def lab_namespaces(prefix: str) -> list[str]:
    """The namespaces whose names start with `prefix` (what a lab left, if anything)."""
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return [line.split()[0] for line in done.stdout.splitlines() if line.startswith(prefix)]
