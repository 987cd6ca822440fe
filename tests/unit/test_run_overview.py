"""The runs of a deployment as every run's controller shows them: each run's row from its controller's /status
(hand-made snapshots), the runs and their pages from the deployment's config, and the page's table."""

from __future__ import annotations

import pytest

from asyncrl.controller.run_overview import RunEntry, run_entries, run_row
from asyncrl.controller.status_page import runs_table
from asyncrl.core.config.schema import AsyncRLConfig

ENTRY = RunEntry("a", 2.0, False, "http://127.0.0.1:8180/")
SNAPSHOT = {"current_version": 7, "eta": 2,
            "learner": {"step": 6, "total_steps": 40, "reward_mean": 0.25, "eval_accuracy": 0.5,
                        "staleness_mean": 1.5, "busy_fraction": 0.4},
            "replicas": [{"alive": True}, {"alive": False}, {"alive": True}]}
EMPTY = {"version": None, "step": None, "total_steps": None, "eta": None, "reward_mean": None,
         "eval_accuracy": None, "staleness_mean": None, "busy_fraction": None, "replicas_alive": 0, "replicas": 0}


@pytest.mark.parametrize(("entry", "snapshot", "expected"), [
    (ENTRY, SNAPSHOT, {"state": "training", "version": 7, "step": 6, "total_steps": 40, "eta": 2,
                       "reward_mean": 0.25, "eval_accuracy": 0.5, "staleness_mean": 1.5, "busy_fraction": 0.4,
                       "replicas_alive": 2, "replicas": 3}),
    (ENTRY, {**SNAPSHOT, "learner": {**SNAPSHOT["learner"], "step": 40}}, {"state": "finished", "step": 40}),
    (ENTRY, {**SNAPSHOT, "learner": None, "replicas": []},
     {**EMPTY, "state": "waiting for its learner", "version": 7, "eta": 2}),
    (ENTRY, None, {**EMPTY, "state": "not reached yet"}),
    (RunEntry("a", 2.0, True, ENTRY.status_url), SNAPSHOT, {"state": "removed"}),
    # What another controller answers is checked field by field: a wrong type shows as missing.
    (ENTRY, {"current_version": "7", "eta": True, "learner": {"step": 1.5, "reward_mean": "high",
                                                            "eval_accuracy": False},
             "replicas": [{"alive": "yes"}, 3]},
     {**EMPTY, "state": "training", "replicas": 1}),
    (ENTRY, {"learner": [], "replicas": {}}, {**EMPTY, "state": "waiting for its learner"}),
])
def test_a_runs_row_from_its_controllers_status(entry, snapshot, expected):
    row = run_row(entry, snapshot)
    assert row == {**row, **expected}
    assert (row["name"], row["weight"], row["status_url"], row["this_run"]) == ("a", 2.0, entry.status_url, False)


def test_every_run_of_the_deployment_with_its_controllers_page():
    cfg = AsyncRLConfig.model_validate({
        "model": {"path": "m"}, "learner": {"lora": {"enabled": True}},
        "controller": {"host": "10.0.0.5", "status_port": 8080},
        "runs": [{"name": "a"}, {"name": "b", "weight": 2, "removed": True}, {"name": "c"}]})
    assert run_entries(cfg) == [RunEntry("a", 1.0, False, "http://10.0.0.5:8080/"),
                                RunEntry("b", 2.0, True, "http://10.0.0.5:8180/"),
                                RunEntry("c", 1.0, False, "http://10.0.0.5:8280/")]
    assert run_entries(cfg.model_copy(update={"runs": []})) == []


def test_the_page_links_every_other_run_and_escapes_what_they_answered():
    own = run_row(ENTRY, SNAPSHOT, own=True)
    other = {**run_row(RunEntry("b", 1.0, False, "http://127.0.0.1:8280/"), None), "read_age_s": 3.2,
             "unreachable": "<urlopen error [Errno 111] Connection refused>"}
    page = runs_table([own, other])
    assert "<b>a</b> (this run)" in page and '<a href="http://127.0.0.1:8280/">b</a>' in page
    assert "6 of 40" in page and "0.500" in page and "40% of the time" in page and "2 of 3" in page
    assert "unreachable: &lt;urlopen error [Errno 111] Connection refused&gt;" in page and "(3 s ago)" in page
    assert runs_table(None) == ""
