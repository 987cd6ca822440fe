"""The status page app in-process (FastAPI TestClient): HTML, /status JSON, /metrics, /healthz."""

from fastapi.testclient import TestClient

from asyncrl.controller.status_page import make_app, render_html
from tests.fakes import acquire, make_state


def test_routes():
    state, _, _, _ = make_state(batch_size=8, eta=None)
    rid = state.register("127.0.0.1:7001", "", 0, "vllm").replica_id
    acquire(state, rid, 8, 0)
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


def test_the_learner_reports_every_step_and_the_page_shows_progress_charts_and_eta():
    from asyncrl.controller.results import LearnerFigures

    state, _, _, _ = make_state()
    for step in range(1, 6):
        accuracy = 0.4 + 0.02 * step if step % 2 == 0 else None
        values = {"reward_mean": 0.1 * step, "staleness_mean": 1.5, "step_seconds": 0.5, "busy_fraction": 0.9}
        if accuracy is not None:
            values["eval_accuracy"] = accuracy
        state.learner_heartbeat(step, step, step * 8, LearnerFigures(total_steps=100, values=values))
    state.learner_heartbeat(5, 5, 40)  # a heartbeat while waiting for data adds no point
    snap = state.snapshot()
    assert [h["step"] for h in snap["history"]] == [1, 2, 3, 4, 5]
    # The last figures stay on show while the learner waits for data; ETA = 95 steps x 0.5 s.
    assert snap["learner"]["step"] == 5 and snap["learner"]["eta_s"] == 47.5
    page = render_html(snap)
    assert "step <b>5</b> of 100" in page and '<progress value="5" max="100">' in page
    assert "training <b>90% of the time</b>" in page and snap["learner"]["busy_fraction"] == 0.9
    assert "reward <b>0.500</b>" in page and "staleness <b>1.50</b>" in page and "ETA 0m47s" in page
    assert snap["learner"]["trajectories_per_s"] == state.batch_size / 0.5
    assert f"throughput <b>{state.batch_size / 0.5:.0f} trajectories/s</b>" in page
    assert page.count("<polyline") == 4  # reward, accuracy (two evaluated steps), staleness, step time
    assert "reward (mean) by step: 0.5" in page


def test_the_page_shows_the_push_reserved_for_the_learner():
    from tests.unit.test_controller_reserved_push import in_band_group, reserving_commit

    state, _, _, _ = make_state()
    keys = in_band_group(state, 7001, 7002)
    assert state.snapshot()["reserved_push"] is None
    reserved = reserving_commit(state, keys, 2)
    snap = state.snapshot()
    assert snap["open_push"] is None and snap["reserved_push"]["push_id"] == reserved.push_id
    assert snap["reserved_push"]["version"] == 3 and len(snap["reserved_push"]["receivers"]) == 2
    page = render_html(snap)
    assert "open push: none open &middot; next reserved: " + reserved.push_id + " (version 3, 2 receivers" in page


def test_the_page_shows_the_length_dynamics_of_the_last_batch():
    from asyncrl.controller.results import LearnerFigures

    state, _, _, _ = make_state()
    for step in (1, 2):
        state.learner_heartbeat(step, step, step * 8, LearnerFigures(total_steps=10, values={
            "reward_mean": 0.5, "length_correct_mean": 10.0 + step, "length_incorrect_mean": 40.0 + step,
            "truncated_fraction": 0.125 * step}))
    snap = state.snapshot()
    assert [h["length_incorrect_mean"] for h in snap["history"]] == [41.0, 42.0]
    page = render_html(snap)
    assert "correct length <b>12 tokens</b>" in page and "incorrect length <b>42 tokens</b>" in page
    assert "truncated <b>25%</b>" in page
    assert "length of correct responses (tokens) by step: 12" in page
    assert "share cut at max_new_tokens by step: 0.25" in page


def test_the_page_shows_where_the_episodes_time_went_and_the_tool_calls_that_failed():
    from asyncrl.controller.results import LearnerFigures

    state, _, _, _ = make_state()
    state.learner_heartbeat(1, 1, 8, LearnerFigures(total_steps=10, values={
        "reward_mean": 0.5, "episode_turns_mean": 2.5, "observation_tokens_mean": 12.0, "environment_share": 0.625,
        "tool_failure_fraction": 0.1}))
    page = render_html(state.snapshot())
    assert "turns per episode <b>2.50</b>" in page and "environment tokens per episode <b>12</b>" in page
    assert "episode time in the environment <b>62%</b>" in page and "tool calls failed <b>10%</b>" in page
