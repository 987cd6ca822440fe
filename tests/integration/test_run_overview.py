"""A run's controller reads the other runs' rows from their controllers' /status over real HTTP: an answer
read, one that is not a JSON object, one too large, a redirect, a port nobody listens on and a server that never
answers each end in their row, within the call's time-out; the deployment's runs are read again when its file changes."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from asyncrl.controller.run_overview import MAX_STATUS_BYTES, DeploymentFile, RunEntry, RunsOverview

SNAPSHOT = {"current_version": 3, "eta": 2, "learner": {"step": 3, "total_steps": 10, "reward_mean": 0.5},
            "replicas": [{"alive": True}]}


def serving(body: bytes, delay_s: float = 0.0, redirect_to: str = ""):
    """An HTTP server on a free loopback port answering every GET with `body` after `delay_s` (or a redirect)."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            time.sleep(delay_s)
            self.send_response(302 if redirect_to else 200)
            if redirect_to:
                self.send_header("Location", redirect_to)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def siblings():
    servers = {"good": serving(json.dumps(SNAPSHOT).encode()), "list": serving(b"[1, 2]"),
               "huge": serving(b'{"x": "' + b"a" * MAX_STATUS_BYTES + b'"}'),
               "hangs": serving(json.dumps(SNAPSHOT).encode(), delay_s=30)}
    servers["redirects"] = serving(b"{}", redirect_to=f"http://127.0.0.1:{servers['good'].server_address[1]}/status")
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        nobody = closed.getsockname()[1]
    entries = [RunEntry("own", 1.0, False, "http://127.0.0.1:1/"),
               *(RunEntry(name, 1.0, False, f"http://127.0.0.1:{s.server_address[1]}/") for name, s in servers.items()),
               RunEntry("nobody", 1.0, False, f"http://127.0.0.1:{nobody}/"),
               RunEntry("gone", 1.0, True, f"http://127.0.0.1:{nobody}/")]
    yield entries
    for server in servers.values():
        server.shutdown()


def test_each_other_runs_row_is_what_its_controller_answered_or_why_not(siblings):
    overview = RunsOverview("own", lambda: {**SNAPSHOT, "current_version": 9}, lambda: siblings, timeout_s=0.5)
    started = time.monotonic()
    overview.refresh()
    assert time.monotonic() - started < 5  # the server that never answers costs one time-out
    rows = {row["name"]: row for row in overview.rows()}
    assert list(rows) == [entry.name for entry in siblings]
    assert rows["own"]["this_run"] and rows["own"]["version"] == 9 and "read_age_s" not in rows["own"]
    good = rows["good"]
    assert (good["state"], good["version"], good["step"], good["reward_mean"]) == ("training", 3, 3, 0.5)
    assert "unreachable" not in good and 0 <= good["read_age_s"] < 5
    assert "not a JSON object" in rows["list"]["unreachable"]
    assert f"more than {MAX_STATUS_BYTES} bytes" in rows["huge"]["unreachable"]
    assert "timed out" in rows["hangs"]["unreachable"]
    assert "refused" in rows["nobody"]["unreachable"]
    assert "302" in rows["redirects"]["unreachable"]  # not followed to where the answer points
    for name in ("list", "huge", "hangs", "nobody", "redirects"):
        assert (rows[name]["state"], rows[name]["version"], rows[name]["read_age_s"]) == ("not reached yet", None, None)
    assert rows["gone"]["state"] == "removed" and "unreachable" not in rows["gone"]


def test_a_run_that_stops_answering_keeps_its_last_row_marked_unreachable(siblings):
    good = next(entry for entry in siblings if entry.name == "good")
    runs = [good]
    overview = RunsOverview("own", dict, lambda: runs, timeout_s=0.5)
    overview.refresh()
    runs[:] = [RunEntry("good", 1.0, False, "http://127.0.0.1:1/")]  # nothing answers there any more
    overview.refresh()
    [row] = overview.rows()
    assert row["version"] == 3 and row["read_age_s"] is not None and "unreachable" in row


def test_the_runs_are_read_again_when_the_deployments_file_changes(tmp_path):
    path = tmp_path / "config.resolved.yaml"
    tree = {"model": {"path": "m"}, "learner": {"lora": {"enabled": True}}, "controller": {"status_port": 8080},
            "runs": [{"name": "a"}]}
    path.write_text(yaml.safe_dump(tree))
    runs = DeploymentFile(path)
    assert [e.name for e in runs()] == ["a"]
    tree["runs"].append({"name": "b"})
    written = tmp_path / "next.yaml"
    written.write_text(yaml.safe_dump(tree))
    written.replace(path)  # as `asyncrl runs add` writes it: whole, in one rename
    assert [(e.name, e.status_url) for e in runs()] == [("a", "http://127.0.0.1:8080/"),
                                                        ("b", "http://127.0.0.1:8180/")]


def test_starting_waits_for_no_other_controller(siblings):
    """The first read runs on the overview's thread: the server that never answers does not hold the start."""
    overview = RunsOverview("own", dict, lambda: siblings, interval_s=60, timeout_s=0.5)
    started = time.monotonic()
    overview.start()
    assert time.monotonic() - started < 0.2
    rows = wait_for_rows(overview, len(siblings))
    assert {row["name"] for row in rows} == {entry.name for entry in siblings}
    overview.stop()


def wait_for_rows(overview: RunsOverview, count: int, timeout_s: float = 10.0) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while len(rows := overview.rows()) < count:
        assert time.monotonic() < deadline, rows
        time.sleep(0.05)
    return rows
