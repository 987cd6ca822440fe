"""The status page app in-process (FastAPI TestClient): HTML, /status JSON, /metrics, /healthz."""

from fastapi.testclient import TestClient

from asyncrl.controller.status_page import make_app, render_html
from tests.fakes import make_state


def test_routes():
    state, _, _, _ = make_state(batch_size=8, eta=None)
    rid = state.register("127.0.0.1:7001", "", 0, "vllm").replica_id
    state.acquire(rid, 8, 0)
    client = TestClient(make_app(state))
    page = client.get("/")
    assert page.status_code == 200 and 'http-equiv="refresh"' in page.text
    assert rid in page.text and "unbounded" in page.text
    status = client.get("/status").json()
    assert status["admitted"] == 8 and status["eta"] is None and status["replicas"][0]["engine"] == "vllm"
    metrics = client.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    assert "asyncrl_controller_leases_granted_total 1.0" in metrics.text
    assert "asyncrl_controller_lease_hold_seconds_count 1.0" in metrics.text
    assert client.get("/healthz").text == "ok"


def test_html_escapes_replica_fields():
    state, _, _, _ = make_state()
    state.register("127.0.0.1:7001", "", 0, "torch")
    snap = state.snapshot()
    snap["replicas"][0]["replica_id"] = "<script>"
    assert "<script>" not in render_html(snap) and "&lt;script&gt;" in render_html(snap)
