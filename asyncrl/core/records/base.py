"""`Record`: one typed line of an event log, the contract between the processes that write the logs and the
tools that read them (the audit, the plots, `up`'s supervisor and progress view, the benchmarks).

A record class names its kind (`KIND`, the line's `kind`) and its fields; a line is `{"t", "kind", fields...}`
in JSON. `FLAT` names a dict field whose items are written as top-level fields of the line (the learner's open
set of training metrics); reading a line back puts every key that is not a declared field there. Lines of a
kind nobody declares (a newer writer) read back as `UnknownRecord`; a declared kind missing a field without a
default is an error naming both.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

KINDS: dict[str, type[Record]] = {}
"""Every declared kind -> its record class (filled as the record modules are imported)."""


@dataclass(frozen=True, kw_only=True)
class Record:
    KIND: ClassVar[str] = ""
    FLAT: ClassVar[str] = ""
    t: float = 0.0
    """Unix seconds the log wrote the record at (0 until written)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.KIND:
            if cls.KIND in KINDS:
                raise TypeError(f"two record classes declare kind {cls.KIND!r}: {KINDS[cls.KIND]} and {cls}")
            KINDS[cls.KIND] = cls

    def fields(self) -> dict[str, Any]:
        """The line's fields but `t` and `kind` (the `FLAT` dict spread among them)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "t":
                continue
            value = getattr(self, f.name)
            if f.name == self.FLAT:
                out.update(value)
            else:
                out[f.name] = value
        return out

    def line(self) -> dict[str, Any]:
        """The whole line: kind and fields (and `t` when written)."""
        return {"t": self.t, "kind": self.KIND, **self.fields()}


@dataclass(frozen=True, kw_only=True)
class UnknownRecord(Record):
    """A line of a kind no record class declares (written by a newer version): kept whole, never an error."""

    kind: str
    raw: dict = field(default_factory=dict)


class BadRecord(ValueError):
    """A line of a declared kind that lacks a field without a default, or is not an object."""


def parse(raw: dict) -> Record:
    """The typed record of one line (a JSON object)."""
    if not isinstance(raw, dict) or "kind" not in raw:
        raise BadRecord(f"an event line must be an object with a 'kind', got {str(raw)[:80]!r}")
    cls = KINDS.get(raw["kind"])
    if cls is None:
        return UnknownRecord(t=raw.get("t", 0.0), kind=raw["kind"], raw=raw)
    declared = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "kind":
            continue
        if key in declared and key != cls.FLAT:
            values[key] = value
        else:
            rest[key] = value
    if cls.FLAT:
        values[cls.FLAT] = rest
    for name, f in declared.items():
        if name not in values and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise BadRecord(f"{raw['kind']}: field {name!r} is missing")
    return cls(**values)
