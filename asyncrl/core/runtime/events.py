"""Append-only JSONL event logs under <run_dir>/events/: the audit trail of a run (admissions, writes,
consumption, versions) and the source of the progress view and plots. Every line is a typed record
(`asyncrl.core.records`): writers write records, readers get them back typed (`read_records`, `EventTail`);
`read_events` gives the raw JSON objects (outside readers, tests of the format)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Protocol

from asyncrl.core.records import Record, parse


class EventLog:
    def __init__(self, run_dir: str | os.PathLike, name: str):
        self.path = Path(run_dir) / "events" / f"{name}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._file = open(self.path, "a", buffering=1)  # noqa: SIM115 - lives as long as the log

    def write(self, record: Record) -> None:
        line = json.dumps({"t": time.time(), "kind": record.KIND, **record.fields()}, separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_events(run_dir: str | os.PathLike, name: str) -> list[dict]:
    """Every complete line of one log as its raw JSON object (a line still being written is left out)."""
    return EventTail(run_dir, name).poll_raw()


def read_records(run_dir: str | os.PathLike, name: str) -> list[Record]:
    """Every complete record of one log, typed."""
    return EventTail(run_dir, name).poll()


class EventTail:
    """Follows one log as it grows: each `poll` returns only the records completed since the last one, so a
    live view reads every byte once instead of the whole file every time."""

    def __init__(self, run_dir: str | os.PathLike, name: str, from_end: bool = False):
        self.path = Path(run_dir) / "events" / f"{name}.jsonl"
        # from_end: only what is written from now on (a resumed run appends to its old log).
        self._offset = self.path.stat().st_size if from_end and self.path.exists() else 0

    def poll(self) -> list[Record]:
        """The records completed since the last poll, typed."""
        return [parse(raw) for raw in self.poll_raw()]

    def poll_raw(self) -> list[dict]:
        """The lines completed since the last poll, as raw JSON objects."""
        if not self.path.exists():
            return []
        with self.path.open("rb") as f:
            f.seek(self._offset)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]  # a line being written is read next time
        self._offset += len(complete)
        return [json.loads(line) for line in complete.splitlines() if line.strip()]


class EventSink(Protocol):
    def write(self, record: Record) -> None: ...

    def close(self) -> None: ...


class NoEvents:
    """An event sink that keeps nothing (unit tests that do not look at the audit trail)."""

    def write(self, record: Record) -> None:
        pass

    def close(self) -> None:
        pass


class MemoryEvents:
    """An event sink that keeps records in a list (unit tests that check the audit trail, benchmarks)."""

    def __init__(self):
        self.typed: list[Record] = []
        self.records: list[dict] = []
        """The same records as the lines a log would hold (without `t`)."""

    def write(self, record: Record) -> None:
        self.typed.append(record)
        self.records.append({"kind": record.KIND, **record.fields()})

    def of_kind(self, kind: str) -> list[dict]:
        return [r for r in self.records if r["kind"] == kind]

    def close(self) -> None:
        pass
