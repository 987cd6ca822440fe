"""Event logs: writes are whole lines; a tail returns each complete record once, never a half-written one."""

import json

import pytest

from asyncrl.core.records import KINDS, BadRecord, Record, UnknownRecord, parse
from asyncrl.core.records.controller import LeaseCompleted, LeaseGranted
from asyncrl.core.records.learner import Eval, Step
from asyncrl.core.runtime.events import EventLog, EventTail, read_events, read_records


def test_tail_returns_new_complete_records_once(tmp_path):
    log = EventLog(tmp_path, "learner")
    tail = EventTail(tmp_path, "learner")
    assert tail.poll() == []
    log.write(Step(step=1, version=1))
    log.write(Step(step=2, version=2))
    assert [e.step for e in tail.poll()] == [1, 2]
    assert tail.poll() == []
    # A record caught half-written is not returned until its newline arrives.
    with log.path.open("a") as f:
        f.write(json.dumps({"t": 0, "kind": "step", "step": 3, "version": 3})[:10])
    assert tail.poll() == []
    with log.path.open("a") as f:
        f.write(json.dumps({"t": 0, "kind": "step", "step": 3, "version": 3})[10:] + "\n")
    assert [e.step for e in tail.poll()] == [3]
    assert [e["step"] for e in read_events(tmp_path, "learner")] == [1, 2, 3]
    log.close()


def test_a_record_reads_back_as_it_was_written(tmp_path):
    log = EventLog(tmp_path, "controller")
    granted = LeaseGranted(lease_id="l1", replica_id="r1", n=4, admitted_after=8, version=1, eta=None,
                           batch_size=8, prompt_index=3, held_s=0.5)
    log.write(granted)
    log.write(LeaseCompleted(lease_id="l1", replica_id="r1", n=4, num_written=4, returned=0, admitted_after=8))
    log.close()
    back = read_records(tmp_path, "controller")
    assert back[0].t > 0 and back[0] == LeaseGranted(**{**granted.__dict__, "t": back[0].t})
    assert back[1].claimed is None
    raw = read_events(tmp_path, "controller")[0]  # the line's JSON: flat, with its kind
    assert raw["kind"] == "lease_granted" and raw["eta"] is None and raw["prompt_index"] == 3


def test_the_flat_metrics_of_a_step_are_top_level_fields_of_its_line(tmp_path):
    log = EventLog(tmp_path, "learner")
    log.write(Step(step=1, version=1, push_wait_s=0.1, metrics={"reward/mean": 0.5, "staleness/hist": {"0": 8}}))
    log.write(Eval(step=1, version=1, accuracy=0.25, seconds=2.0, by="learner", scores={"pass@k": 0.5}))
    log.close()
    raw = read_events(tmp_path, "learner")
    assert raw[0]["reward/mean"] == 0.5 and raw[0]["staleness/hist"] == {"0": 8} and "metrics" not in raw[0]
    assert raw[1]["pass@k"] == 0.5 and "scores" not in raw[1]
    step, ev = read_records(tmp_path, "learner")
    assert step.metrics == {"reward/mean": 0.5, "staleness/hist": {"0": 8}} and step.push_wait_s == 0.1
    assert ev.scores == {"pass@k": 0.5} and ev.accuracy == 0.25


def test_an_unknown_kind_is_kept_and_a_missing_field_is_named():
    unknown = parse({"t": 1.0, "kind": "from_a_newer_version", "x": 1})
    assert isinstance(unknown, UnknownRecord) and unknown.kind == "from_a_newer_version" and unknown.raw["x"] == 1
    with pytest.raises(BadRecord, match="lease_granted: field 'lease_id' is missing"):
        parse({"kind": "lease_granted", "replica_id": "r"})
    with pytest.raises(BadRecord, match="'kind'"):
        parse({"step": 1})


def test_a_kind_is_declared_once():
    assert KINDS["lease_granted"] is LeaseGranted and KINDS["step"] is Step
    with pytest.raises(TypeError, match="two record classes declare kind 'step'"):
        type("AnotherStep", (Record,), {"KIND": "step"})
