"""The typed records of the event logs (`asyncrl.core.runtime.events`): one class per kind, shared by the processes
that write them and the tools that read them. `base` has the record type and the parser; `controller`,
`learner` and `rollout` the records of each log."""

from asyncrl.core.records import controller, learner, rollout  # noqa: F401 - fill KINDS
from asyncrl.core.records.base import KINDS, BadRecord, Record, UnknownRecord, parse

__all__ = ["KINDS", "BadRecord", "Record", "UnknownRecord", "parse"]
