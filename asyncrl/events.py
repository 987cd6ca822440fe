"""Append-only JSONL event logs under <run_dir>/events/: the audit trail of a run (admissions, writes,
consumption, versions) and the source of the progress view and plots."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path


class EventLog:
    def __init__(self, run_dir: str | os.PathLike, name: str):
        self.path = Path(run_dir) / "events" / f"{name}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._file = open(self.path, "a", buffering=1)  # noqa: SIM115 - lives as long as the log

    def write(self, kind: str, **fields) -> None:
        record = {"t": time.time(), "kind": kind, **fields}
        line = json.dumps(record, separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_events(run_dir: str | os.PathLike, name: str) -> list[dict]:
    path = Path(run_dir) / "events" / f"{name}.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line being written while we read
                continue
    return out
