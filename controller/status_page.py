"""The controller's HTTP side: a human status page, /status JSON, /metrics (Prometheus), /healthz, and in a
deployment of several runs /runs (every run's row, `asyncrl.controller.run_overview`), also a table on the page.

`make_app(state, overview)` builds the FastAPI app; `StatusPage` serves it with uvicorn on a background thread.
The socket is bound before the thread starts, so port 0 works and `StatusPage.port` is known at once.
"""

from __future__ import annotations

import html
import socket
import threading
import time
from pathlib import Path

import uvicorn
from fastapi import FastAPI, HTTPException
from fastapi.responses import HTMLResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from asyncrl.controller.run_overview import ROW_FIGURES, DeploymentFile, RunsOverview
from asyncrl.controller.state import ControllerState
from asyncrl.core.config.controller import ControllerConfig
from asyncrl.core.records.learner_figures import FIGURES
from asyncrl.core.wire.ports import listening

_REFRESH_S = 2


def make_app(state: ControllerState, overview: RunsOverview | None = None) -> FastAPI:
    app = FastAPI(title="asyncrl controller", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        snap = state.snapshot()
        return render_html(snap, None if overview is None else overview.rows(own=snap))

    @app.get("/status")
    def status() -> dict:
        return state.snapshot()

    @app.get("/runs")
    def runs() -> dict:
        if overview is None:
            raise HTTPException(status_code=404, detail="a single run: no runs: in its config")
        return {"runs": overview.rows()}

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", response_class=PlainTextResponse)
    def healthz() -> str:
        return "ok"

    return app


def _adapter(replica: dict) -> str:
    """A replica's version cell: the checksum of the weights it reports serving, and whether it is the one
    pushed."""
    served = replica.get("adapter_checksum", "")
    if not served:
        return ""
    verdict = "verified" if replica.get("adapter_verified") else "NOT the pushed weights"
    return f" <small>checksum {html.escape(served[:12])} ({verdict})</small>"


def render_html(snap: dict, runs: list[dict] | None = None) -> str:
    """A small self-refreshing page: the learner's progress (step of total, reward, held-out accuracy,
    staleness, step time, throughput, ETA) with charts of the last steps, the admission numbers, the push in flight, the
    replicas table; with `runs` (a deployment of several), every run's row first."""
    esc = html.escape
    eta = "unbounded" if snap["eta"] is None else snap["eta"]
    limit = "∞" if snap["max_admissible"] is None else snap["max_admissible"]
    rows = "".join(
        "<tr>"
        f"<td>{esc(r['replica_id'])}</td><td>{esc(r['address'])}</td><td>{esc(r['engine'])}</td>"
        f"<td>{r['weight_version'] if r['weight_version'] >= 0 else 'none yet'}{_adapter(r)}</td>"
        f"<td>{'yes' if r['alive'] else 'dead: ' + esc(r['dead_reason'])}</td>"
        f"<td>{'yes' if r['needs_sync'] else ''}</td><td>{r['active_leases']}</td>"
        f"<td>{r['last_heartbeat_age_s']:.1f} s</td>"
        f"<td>{_held_back(r)}</td>"
        "</tr>"
        for r in snap["replicas"]
    )
    push, reserved = snap["open_push"], snap["reserved_push"]
    push_line = (
        "none open"
        if push is None
        else f"{esc(push['push_id'])} ({push['mode']}, version {push['version']}, "
        f"{len(push['receivers'])} receivers, {push['age_s']:.1f} s)"
    )
    if reserved is not None:  # the learner orders it without a Begin (docs/architecture.md, "Weight push", in-band)
        push_line += (f" &middot; next reserved: {esc(reserved['push_id'])} (version {reserved['version']}, "
                      f"{len(reserved['receivers'])} receivers, {reserved['age_s']:.1f} s)")
    learner = snap["learner"]
    learner_line = "no heartbeat yet" if learner is None else learner_summary(learner)
    history = snap.get("history", [])
    charts = "".join(
        chart(f"{figure.chart} by step", [(h["step"], h[figure.name]) for h in history
                                          if h.get(figure.name) is not None])
        for figure in FIGURES if figure.chart
    )
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="{_REFRESH_S}">
<title>asyncrl controller</title>
<style>body{{font-family:sans-serif;margin:1.5em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:.2em .6em;text-align:left}}</style></head>
<body><h1>asyncrl controller</h1>
{runs_table(runs)}
<p>version <b>{snap["current_version"]}</b> &middot; admitted N<sub>r</sub> = <b>{snap["admitted"]}</b>
of at most {limit} &middot; held requests <b>{snap["held_requests"]}</b> &middot; &eta; = {eta}
&middot; B = {snap["batch_size"]}</p>
<p>leases: {snap["active_leases"]} active, {snap["leases_granted"]} granted, {snap["leases_expired"]} expired
&middot; next prompt index {snap["next_prompt_index"]}</p>
<p>pushes committed: {snap["pushes_committed"]} &middot; open push: {push_line}</p>
{_difficulty_line(snap.get("difficulty"))}
<p>learner: {learner_line}</p>
<div>{charts}</div>
<table><tr><th>replica</th><th>address</th><th>engine</th><th>version</th><th>alive</th><th>needs sync</th>
<th>leases</th><th>heartbeat age</th><th>pushes</th></tr>{rows}</table>
<p><a href="/status">/status</a> &middot; <a href="/metrics">/metrics</a></p>
</body></html>"""


def runs_table(runs: list[dict] | None) -> str:
    """The deployment's runs, each linked to its own controller's page; "" for a single run."""
    if runs is None:
        return ""
    esc = html.escape

    def cell(value, fmt: str = "{}") -> str:
        return "" if value is None else esc(fmt.format(value))

    def row(r: dict) -> str:
        name = f"<b>{esc(r['name'])}</b> (this run)" if r["this_run"] else (
            f'<a href="{esc(r["status_url"])}">{esc(r["name"])}</a>')
        state = esc(r["state"]) + (f" <small>unreachable: {esc(r['unreachable'])}</small>" if "unreachable" in r
                                   else "")
        if r.get("read_age_s") is not None:
            state += f" <small>({r['read_age_s']:.0f} s ago)</small>"
        step = cell(r["step"]) + (f" of {r['total_steps']}" if r["total_steps"] else "")
        figures = "".join(f"<td>{cell(r[f.name], f.fmt)}</td>" for f in ROW_FIGURES)
        return (f"<tr><td>{name}</td><td>{r['weight']:g}</td><td>{state}</td><td>{cell(r['version'])}</td>"
                f"<td>{step}</td><td>{cell(r['eta'])}</td>{figures}<td>{r['replicas_alive']} of {r['replicas']}</td>"
                "</tr>")

    heads = "".join(f"<th>{esc(f.label)}</th>" for f in ROW_FIGURES)
    return (f"<h2>runs</h2><table><tr><th>run</th><th>share</th><th>state</th><th>version</th><th>step</th>"
            f"<th>&eta;</th>{heads}<th>replicas alive</th></tr>{''.join(map(row, runs))}</table>"
            f"<p><a href=\"/runs\">/runs</a></p><h2>this run</h2>")


def _difficulty_line(difficulty: dict | None) -> str:
    """Pass-rate estimates and hard prompts sampled again (controller.difficulty); empty before any."""
    if not difficulty or not difficulty["tracked"]:
        return ""
    return (f"<p>prompts with a pass rate: {difficulty['tracked']} &middot; hard, may be sampled again: "
            f"{difficulty['hard']} &middot; sampled again: {difficulty['replays']} "
            f"({difficulty['replay_share']:.0%} of the leases at most)</p>")


def _held_back(replica: dict) -> str:
    """Empty, or how long the replica still sits out pushes and why (a failed push, no answer at its address),
    or that the controller has not reached it yet."""
    if not replica.get("held_back_s"):
        return "" if replica.get("reachable", True) else "not reached yet"
    return f"held back {replica['held_back_s']:.0f} s: {html.escape(replica['push_problem'][:200])}"


def learner_summary(learner: dict) -> str:
    """Step (of total, with a progress bar), version, the last step's figures, the ETA."""
    total = learner.get("total_steps") or 0
    parts = [f"step <b>{learner['step']}</b>" + (f" of {total}" if total else "")]
    if total:
        parts[0] += f' <progress value="{min(learner["step"], total)}" max="{total}"></progress>'
    parts.append(f"version {learner['version']}")
    throughput = ("trajectories_per_s", "throughput", "{:.0f} trajectories/s")
    for key, label, fmt in [(f.name, f.label, f.fmt) for f in FIGURES] + [throughput]:
        if learner.get(key) is not None:
            parts.append(f"{label} <b>{fmt.format(learner[key])}</b>")
    if learner.get("eta_s") is not None:
        parts.append(f"ETA {_duration(learner['eta_s'])}")
    parts.append(f"consumed {learner['consumed']}, heartbeat {learner['heartbeat_age_s']:.1f} s ago")
    if learner.get("address"):
        parts.append(f"at {html.escape(learner['address'])}")
    return " &middot; ".join(parts)


def chart(title: str, points: list[tuple[float, float]], width: int = 320, height: int = 90) -> str:
    """An inline SVG line chart of (x, y) points with its title and the y range (empty without two points)."""
    if len(points) < 2:
        return ""
    xs, ys = [x for x, _ in points], [y for _, y in points]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    xspan, yspan = (x1 - x0) or 1.0, (y1 - y0) or 1.0
    pad = 4
    coords = " ".join(
        f"{pad + (x - x0) / xspan * (width - 2 * pad):.1f},{height - pad - (y - y0) / yspan * (height - 2 * pad):.1f}"
        for x, y in points
    )
    return (f'<figure style="display:inline-block;margin:0 1em 1em 0"><figcaption>{html.escape(title)}: '
            f"{ys[-1]:.3g} (range {y0:.3g} to {y1:.3g})</figcaption>"
            f'<svg width="{width}" height="{height}" style="border:1px solid #ccc">'
            f'<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="{coords}"/></svg></figure>')


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


class StatusPage:
    """uvicorn on a daemon thread; `start()` returns the bound port once it serves, `stop()` shuts it down. With
    `overview` (a run of a deployment of several), its reads of the other runs start and stop with the page."""

    def __init__(self, state: ControllerState, host: str, port: int, overview: RunsOverview | None = None):
        self.host = host
        self.overview = overview
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        # Listen now: a client that connects before uvicorn's loop runs waits in the backlog, not refused.
        self._socket.listen(128)
        self.port = self._socket.getsockname()[1]
        config = uvicorn.Config(make_app(state, overview), log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name="controller-status", daemon=True
        )

    def start(self, timeout_s: float = 10.0) -> int:
        if self.overview is not None:
            self.overview.start()
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self._server.started:
            raise RuntimeError(f"status page did not start on {self.host}:{self.port}")
        return self.port

    def stop(self, timeout_s: float = 5.0) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=timeout_s)
        self._socket.close()
        if self.overview is not None:
            self.overview.stop()


def status_page_for(state: ControllerState, cc: ControllerConfig, run: str, deployment_file: Path | None) -> StatusPage:
    """The controller's page on `controller.status_port` (a port it cannot bind refused naming the key); with
    `deployment_file` (the config of the deployment of several runs that `run` is one of), every run's table."""
    overview = (None if deployment_file is None
                else RunsOverview(run, state.snapshot, DeploymentFile(deployment_file)))
    with listening("controller.status_port", cc.host, cc.status_port):
        return StatusPage(state, cc.host, cc.status_port, overview)
