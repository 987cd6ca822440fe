"""The network tier's harness: hosts in namespaces of their own, reachable from each other only, links capped,
cut silently or refused, one way or both, taken down, and nothing left behind."""

from __future__ import annotations

import json
import sys

import pytest

from asyncrl.tools.netlab import Lab, LabError, lab_namespaces

PORT = 7070
SERVE = f"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", {PORT})); s.listen()
print("listening", flush=True)
while True:
    c, _ = s.accept()
    first = n = 0
    while chunk := c.recv(1 << 16):
        first = first or time.monotonic()
        n += len(chunk)
    c.sendall(f"{{n}} {{time.monotonic() - first}}".encode()) if n else None
    c.close()
"""


def connect(lab: Lab, src: str, dst: str, payload: int = 0, timeout_s: float = 2.0) -> dict:
    """From `src`, connect to `dst`'s server and send `payload` bytes: {"ok": ..., "error": ..., "seconds":
    connect time, "received"/"rate_mbit": what the server measured}."""
    code = f"""
import json, socket, time
t0 = time.monotonic()
try:
    c = socket.create_connection(("{lab.hosts[dst].address}", {PORT}), timeout={timeout_s})
except OSError as err:
    print(json.dumps({{"ok": False, "error": type(err).__name__, "seconds": time.monotonic() - t0}})); raise SystemExit
out = {{"ok": True, "seconds": time.monotonic() - t0}}
if {payload}:
    c.settimeout(60); c.sendall(b"x" * {payload}); c.shutdown(socket.SHUT_WR)
    n, s = c.recv(100).decode().split()
    out.update(received=int(n), rate_mbit=int(n) * 8 / float(s) / 1e6)
print(json.dumps(out))
"""
    done = lab.call(src, [sys.executable, "-c", code], timeout_s=timeout_s + 90)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def lab():
    with Lab() as lab:
        for name in ("a", "b", "c"):
            lab.add_host(name)
        for name in ("b", "c"):
            server = lab.run(name, [sys.executable, "-u", "-c", SERVE], stdout=-1, text=True)
            assert server.stdout.readline().strip() == "listening"
        yield lab


def test_hosts_reach_each_other_and_nothing_outside_the_lab(lab):
    assert connect(lab, "a", "b")["ok"] and connect(lab, "c", "b")["ok"]
    outside = lab.call("a", [sys.executable, "-c", "import socket; socket.create_connection(('127.0.0.1', 22), 1)"])
    assert outside.returncode != 0  # the machine's own loopback is not the host's
    assert not lab.call("a", ["ip", "-o", "addr"]).stdout.count("10.77.0.") > 1


def test_a_capped_link_carries_its_rate(lab):
    lab.shape("b", 20)
    result = connect(lab, "a", "b", payload=5_000_000, timeout_s=5)
    assert result["received"] == 5_000_000
    assert 14 <= result["rate_mbit"] <= 21, result  # the token bucket's rate, less TCP's headers
    lab.unshape("b")
    assert connect(lab, "a", "b", payload=5_000_000)["rate_mbit"] > 100


def test_a_silent_cut_times_out_a_refusing_one_fails_at_once_and_both_heal(lab):
    lab.cut("a", "b")
    silent = connect(lab, "a", "b", timeout_s=1.5)
    assert (silent["ok"], silent["error"]) == (False, "TimeoutError") and silent["seconds"] >= 1.4
    assert connect(lab, "a", "c")["ok"] and connect(lab, "c", "b")["ok"]  # only that pair
    lab.heal("a", "b")
    assert connect(lab, "a", "b")["ok"]
    lab.cut("a", "b", reject=True)
    refused = connect(lab, "a", "b", timeout_s=5)
    assert (refused["ok"], refused["error"]) == (False, "ConnectionRefusedError") and refused["seconds"] < 1
    lab.heal("a", "b")
    assert connect(lab, "a", "b")["ok"]


def test_a_one_way_cut_lets_a_reach_b_but_not_b_reach_a(lab):
    lab.run("a", [sys.executable, "-u", "-c", SERVE], stdout=-1, text=True).stdout.readline()
    lab.cut("a", "b", one_way=True)
    assert connect(lab, "a", "b", payload=1000)["received"] == 1000  # b answers on a's connection
    assert connect(lab, "b", "a", timeout_s=1)["error"] == "TimeoutError"
    lab.heal("a", "b")
    assert connect(lab, "b", "a")["ok"]


def test_a_link_taken_down_cuts_the_host_from_everyone_until_it_comes_back(lab):
    lab.link("b", up=False)
    assert connect(lab, "a", "b", timeout_s=1)["ok"] is False
    assert connect(lab, "c", "b", timeout_s=1)["ok"] is False
    lab.link("b")
    assert connect(lab, "a", "b", timeout_s=3)["ok"] and connect(lab, "c", "b", timeout_s=3)["ok"]


def test_leaving_the_lab_kills_its_processes_and_deletes_its_namespaces_even_on_an_error():
    with pytest.raises(RuntimeError, match="inside"), Lab() as lab:
        lab.add_host("a")
        sleeper = lab.run("a", ["sleep", "600"])
        orphan = lab.call("a", ["sh", "-c", "sleep 600 > /dev/null 2>&1 & echo $!"]).stdout.strip()
        prefix = lab.prefix
        raise RuntimeError("inside")
    assert sleeper.poll() is not None
    assert not lab_namespaces(prefix)
    assert gone(int(orphan))  # started by someone else in the namespace: killed too


def gone(pid: int) -> bool:
    """No such process, or a zombie waiting for a parent to reap it."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_host_name_taken_twice_is_refused():
    with Lab() as lab:
        lab.add_host("a")
        with pytest.raises(LabError, match="already"):
            lab.add_host("a")
