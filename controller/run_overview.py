"""The runs of a deployment of several LoRA runs, as every run's controller shows them (`/runs`, the status
page's table): each run's state, version, step and last figures, read from that run's own controller.

Each run has a controller of its own, and each controller's Redis user reaches only its run's keys, so the
overview asks the other runs' controllers for their public `/status` (the one the status page serves), every
`interval_s`, a call of at most `timeout_s` and `MAX_STATUS_BYTES` each, to the address the config gives (no
redirect followed). A run whose controller does not answer keeps its last row, marked unreachable with the age
of what is shown. The runs are read from the deployment's config file whenever it changes, so a run added while
the deployment lives (`asyncrl runs add`) appears. What another controller answers is checked field by field: a
value of the wrong type shows as missing.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from asyncrl.core.config.file import load_config
from asyncrl.core.config.runs import run_configs
from asyncrl.core.config.schema import AsyncRLConfig
from asyncrl.core.records.learner_figures import BY_NAME

log = logging.getLogger(__name__)

MAX_STATUS_BYTES = 4 << 20
"""The most of another controller's `/status` read (a few KB per replica): a larger answer is refused."""

ROW_FIGURES = tuple(BY_NAME[name] for name in ("reward_mean", "eval_accuracy", "staleness_mean", "busy_fraction"))
"""The learner's figures each run's row shows, as its own page names and writes them."""


@dataclass(frozen=True)
class RunEntry:
    """A run of the deployment, as its config gives it."""

    name: str
    weight: float
    removed: bool
    status_url: str
    """Its controller's status page (http://host:status_port/)."""


def run_entries(deployment: AsyncRLConfig) -> list[RunEntry]:
    """Every run of `deployment`, removed ones too, in its order (none for a single run)."""
    every = run_configs(deployment, removed=True)
    return [RunEntry(spec.name, spec.weight, spec.removed,
                     f"http://{every[spec.name].controller.host}:{every[spec.name].controller.status_port}/")
            for spec in deployment.runs]


class DeploymentFile:
    """The runs of the deployment's config file, read again only when the file changed (`asyncrl runs add`
    writes it whole, in one rename)."""

    def __init__(self, path: Path):
        self.path = path
        self._seen: tuple[int, int] | None = None
        self._entries: list[RunEntry] = []

    def __call__(self) -> list[RunEntry]:
        stat = self.path.stat()
        if (stat.st_mtime_ns, stat.st_ino) != self._seen:
            self._entries = run_entries(load_config(self.path))
            self._seen = (stat.st_mtime_ns, stat.st_ino)
        return self._entries


def run_row(entry: RunEntry, snapshot: dict | None, own: bool = False) -> dict:
    """The row of `entry` from its controller's `/status` (None: not read yet): plain JSON-able values, each None
    when the snapshot lacks it or holds a value of another type."""
    snap = snapshot if isinstance(snapshot, dict) else {}
    learner = snap.get("learner") if isinstance(snap.get("learner"), dict) else {}
    replicas = [r for r in snap.get("replicas", []) if isinstance(r, dict)] if isinstance(
        snap.get("replicas"), list) else []
    step, total = _int(learner.get("step")), _int(learner.get("total_steps"))
    if entry.removed:
        state = "removed"
    elif not snap:
        state = "not reached yet"
    elif step is not None and total and step >= total:
        state = "finished"
    else:
        state = "training" if learner else "waiting for its learner"
    return {
        "name": entry.name, "weight": entry.weight, "status_url": entry.status_url, "this_run": own,
        "state": state, "version": _int(snap.get("current_version")), "step": step, "total_steps": total,
        "eta": _int(snap.get("eta")),
        **{figure.name: _number(learner.get(figure.name)) for figure in ROW_FIGURES},
        "replicas_alive": sum(r.get("alive") is True for r in replicas), "replicas": len(replicas),
    }


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # a 3xx is an error: another run's controller cannot send this one to a URL of its choosing


_OPENER = urllib.request.build_opener(_NoRedirects, urllib.request.ProxyHandler({}))
"""Straight to the address the deployment's config gives: no redirect followed, no proxy asked."""


def fetch_status(url: str, timeout_s: float) -> dict:
    """`url`/status as JSON (ValueError when it is not a JSON object or larger than MAX_STATUS_BYTES; HTTPError
    for a redirect)."""
    with _OPENER.open(url.rstrip("/") + "/status", timeout=timeout_s) as reply:
        body = reply.read(MAX_STATUS_BYTES + 1)
    if len(body) > MAX_STATUS_BYTES:
        raise ValueError(f"{url}/status: more than {MAX_STATUS_BYTES} bytes")
    status = json.loads(body)
    if not isinstance(status, dict):
        raise ValueError(f"{url}/status: not a JSON object")  # noqa: TRY004 - a bad answer, not a bad argument
    return status


class RunsOverview:
    """Every run's row, refreshed on a thread of its own: this run's from `own_snapshot` at each call of
    `rows()`, the others' from their controllers' last answer."""

    def __init__(self, own: str, own_snapshot: Callable[[], dict], entries: Callable[[], list[RunEntry]],
                 interval_s: float = 2.0, timeout_s: float = 1.0, fetch: Callable[[str, float], dict] = fetch_status):
        self.own = own
        self._own_snapshot = own_snapshot
        self._entries = entries
        self._fetch = fetch
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self._lock = threading.Lock()
        self._known: list[RunEntry] = []
        self._answers: dict[str, tuple[dict, float]] = {}  # run -> (its last /status, when it was read)
        self._failures: dict[str, str] = {}  # run -> why its last read failed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="runs-overview", daemon=True)

    def start(self) -> None:
        """Read the runs on the overview's thread, at once and then every `interval_s`: a controller whose
        siblings cannot be reached starts without waiting out their time-outs."""
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.timeout_s * 2 + self.interval_s)

    def refresh(self) -> None:
        """Read the runs and every other run's `/status` once."""
        try:
            entries = self._entries()
        except Exception as err:  # noqa: BLE001 - a config being rewritten: keep the runs known
            log.warning("runs overview: the deployment's runs could not be read (%s); keeping the last", err)
            entries = self._known
        for entry in entries:
            if entry.name == self.own or entry.removed:
                continue
            try:
                answer = self._fetch(entry.status_url, self.timeout_s)
            except Exception as err:  # noqa: BLE001 - any failure of another run's controller is its row's state
                with self._lock:
                    self._failures[entry.name] = str(err)[:200]
                continue
            with self._lock:
                self._answers[entry.name] = (answer, time.monotonic())
                self._failures.pop(entry.name, None)
        with self._lock:
            self._known = list(entries)

    def rows(self, own: dict | None = None) -> list[dict]:
        """One row per run, in the deployment's order: this run's from `own` (its snapshot, when the caller has
        one), another run's with `read_age_s` (how old what it shows is) and, when its last read failed,
        `unreachable` (why)."""
        with self._lock:
            known, answers, failures = list(self._known), dict(self._answers), dict(self._failures)
        now, rows = time.monotonic(), []
        for entry in known:
            if entry.name == self.own:
                rows.append(run_row(entry, self._own_snapshot() if own is None else own, own=True))
                continue
            answer, at = answers.get(entry.name, (None, None))
            row = run_row(entry, answer)
            row["read_age_s"] = None if at is None else now - at
            if entry.name in failures and not entry.removed:
                row["unreachable"] = failures[entry.name]
            rows.append(row)
        return rows

    def _poll(self) -> None:
        while True:
            self.refresh()
            if self._stop.wait(self.interval_s):
                return
