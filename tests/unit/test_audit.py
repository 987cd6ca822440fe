"""The audit on hand-written event logs: it must catch each kind of violation."""

import json

from asyncrl.tools.audit import audit_run


def write(run_dir, name, events):
    path = run_dir / "events" / f"{name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e) + "\n" for e in events))


def lease(lid, admitted_after, version, eta=1, b=4):
    return {"t": 1, "kind": "lease_granted", "lease_id": lid, "replica_id": "r0", "admitted_after": admitted_after,
            "version": version, "eta": eta, "batch_size": b}


def written(gid, eid, t=1.0, v=0):
    return {"t": t, "kind": "group_written", "group_id": gid, "entry_id": eid, "lease_version": v}


def good_run(tmp_path):
    # B=4, η=1: at version 0, N_r up to 8 is admissible (floor(7/4)=1 <= 0+1).
    write(tmp_path, "controller", [lease("l1", 4, 0), lease("l2", 8, 0), {"t": 2, "kind": "push_committed", "version": 1},
                                   lease("l3", 12, 1), {"t": 3, "kind": "push_committed", "version": 1},
                                   {"t": 4, "kind": "push_committed", "version": 2}])
    write(tmp_path, "rollout-r0", [written("g1", "1-0"), written("g2", "2-0"), written("g3", "3-0", v=1),
                                   written("g4", "4-0", t=99.0, v=1)])
    write(tmp_path, "learner", [{"t": 2, "kind": "trained", "group_ids": ["g1"]},
                                {"t": 2, "kind": "step", "version": 1, "staleness/hist": {"0": 4}},
                                {"t": 3, "kind": "trained", "group_ids": ["g2"]},
                                {"t": 3, "kind": "step", "version": 2, "staleness/hist": {"1": 4}},
                                {"t": 5, "kind": "final_buffer", "entry_ids": ["3-0"]}])


def test_clean_run_passes(tmp_path):
    good_run(tmp_path)
    report = audit_run(tmp_path)
    assert report.ok, report.as_dict()
    assert report.leases_granted == 3 and report.left_in_buffer == 1 and report.written_after_end == 1
    assert report.staleness_hist == {"0": 4, "1": 4}


def test_eta_violation_is_caught(tmp_path):
    good_run(tmp_path)
    write(tmp_path, "controller", [lease("l1", 9, 0)])  # floor(8/4) = 2 > 0 + 1
    report = audit_run(tmp_path)
    assert not report.ok and report.eta_violations[0]["lease_id"] == "l1"


def test_double_training_and_loss_are_caught(tmp_path):
    good_run(tmp_path)
    write(tmp_path, "learner", [{"t": 2, "kind": "trained", "group_ids": ["g1", "g1"]},
                                {"t": 5, "kind": "final_buffer", "entry_ids": []}])
    report = audit_run(tmp_path)
    assert report.trained_twice == ["g1"]
    assert report.lost == ["g2", "g3"]  # neither trained nor in the buffer at the end
    assert not report.ok


def test_version_going_back_is_caught(tmp_path):
    good_run(tmp_path)
    write(tmp_path, "controller", [{"t": 1, "kind": "push_committed", "version": 2},
                                   {"t": 2, "kind": "push_committed", "version": 1}])
    assert audit_run(tmp_path).version_errors == ["controller committed 2 then 1"]


def test_group_of_a_killed_replica_is_told_apart_from_an_unknown_one(tmp_path):
    """A replica killed between writing a group and logging it: its lease expired, the group was trained once.
    That is listed, not an error; a trained group nobody wrote or leased is an error."""
    good_run(tmp_path)
    with (tmp_path / "events" / "controller.jsonl").open("a") as f:
        f.write(json.dumps({"t": 2, "kind": "lease_expired", "lease_id": "l9", "replica_id": "r0",
                            "reason": "reregistered"}) + "\n")
    with (tmp_path / "events" / "learner.jsonl").open("a") as f:
        f.write(json.dumps({"t": 4, "kind": "trained", "group_ids": ["r0-l9"]}) + "\n")
    report = audit_run(tmp_path)
    assert report.ok and report.written_by_dead_replica == ["r0-l9"] and report.trained_unwritten == []
    with (tmp_path / "events" / "learner.jsonl").open("a") as f:
        f.write(json.dumps({"t": 4, "kind": "trained", "group_ids": ["r0-l10"]}) + "\n")
    report = audit_run(tmp_path)
    assert not report.ok and report.trained_unwritten == ["r0-l10"]


def resumed_run(tmp_path, with_resume_record=True):
    """Checkpoint at step 1; the dead learner trained g2 in step 1 (after the checkpoint) and died; the resumed
    one (controller restarted at version 1) trains g2 again, then g3."""
    write(tmp_path, "controller", [
        {"t": 0, "kind": "controller_started"}, lease("l1", 4, 0), lease("l2", 8, 0),
        {"t": 2, "kind": "push_committed", "version": 1}, lease("l3", 12, 1),
        {"t": 3, "kind": "push_committed", "version": 2},
        {"t": 10, "kind": "controller_started", "start_version": 1},
        {"t": 12, "kind": "push_committed", "version": 2}, {"t": 13, "kind": "push_committed", "version": 3},
    ])  # fmt: skip
    write(tmp_path, "rollout-r0", [written("g1", "1-0"), written("g2", "2-0"), written("g3", "3-0", t=2.5, v=1)])
    learner = [
        {"t": 2, "kind": "trained", "step": 0, "group_ids": ["g1"]}, {"t": 2, "kind": "step", "step": 1, "version": 1},
        {"t": 2.1, "kind": "checkpoint_saved", "step": 1},
        {"t": 3, "kind": "trained", "step": 1, "group_ids": ["g2"]}, {"t": 3, "kind": "step", "step": 2, "version": 2},
    ]  # fmt: skip
    if with_resume_record:
        learner.append({"t": 11, "kind": "resumed", "from_step": 1, "version": 1})
    learner += [
        {"t": 12, "kind": "trained", "step": 1, "group_ids": ["g2"]}, {"t": 12, "kind": "step", "step": 2, "version": 2},
        {"t": 13, "kind": "trained", "step": 2, "group_ids": ["g3"]}, {"t": 13, "kind": "step", "step": 3, "version": 3},
        {"t": 14, "kind": "final_buffer", "entry_ids": []},
    ]  # fmt: skip
    write(tmp_path, "learner", learner)


def test_a_resumed_run_counts_against_the_surviving_policy(tmp_path):
    resumed_run(tmp_path)
    report = audit_run(tmp_path)
    assert report.ok, report.as_dict()
    assert report.groups_trained == 3 and report.trained_twice == [] and report.version_errors == []


def test_without_the_resume_record_the_retrained_group_counts_twice(tmp_path):
    resumed_run(tmp_path, with_resume_record=False)
    report = audit_run(tmp_path)
    assert report.trained_twice == ["g2"] and not report.ok
    assert "learner published 2 then 2" in report.version_errors


def test_a_group_whose_lease_completed_as_written_is_accounted_for(tmp_path):
    good_run(tmp_path)
    write(tmp_path, "learner", [{"t": 2, "kind": "trained", "group_ids": ["g1", "r1-l9"]},
                                {"t": 2, "kind": "step", "version": 1},
                                {"t": 3, "kind": "trained", "group_ids": ["g2"]},
                                {"t": 3, "kind": "step", "version": 2},
                                {"t": 5, "kind": "final_buffer", "entry_ids": ["3-0"]}])  # fmt: skip
    assert audit_run(tmp_path).trained_unwritten == ["r1-l9"]
    with (tmp_path / "events" / "controller.jsonl").open("a") as f:
        f.write(json.dumps({"t": 2, "kind": "lease_completed", "replica_id": "r1", "lease_id": "l9", "n": 8,
                            "num_written": 8}) + "\n")  # fmt: skip
    report = audit_run(tmp_path)
    assert report.trained_unwritten == [] and report.written_by_dead_replica == ["r1-l9"] and report.ok


def test_a_learner_starting_over_without_resuming_is_a_fall_back(tmp_path):
    """The failure this catches: a learner restarted by hand from the base weights while the run's versions
    went on (its step numbers start again at 1, with no `resumed` record)."""
    resumed_run(tmp_path)
    assert audit_run(tmp_path).fell_back == []
    resumed_run(tmp_path, with_resume_record=False)
    report = audit_run(tmp_path)
    assert report.fell_back == ["step 2 (version 2) after step 2 without resuming"] and not report.ok


def test_a_lease_completed_by_another_replica_is_stolen_and_open_leases_are_counted(tmp_path):
    good_run(tmp_path)
    assert audit_run(tmp_path).open_leases == 3
    with (tmp_path / "events" / "controller.jsonl").open("a") as f:
        f.write(json.dumps({"t": 2, "kind": "lease_completed", "replica_id": "intruder", "lease_id": "l1", "n": 4,
                            "num_written": 4}) + "\n")  # fmt: skip
    report = audit_run(tmp_path)
    assert report.stolen_leases == [{"lease_id": "l1", "holder": "r0", "completed_by": "intruder"}]
    assert report.open_leases == 2 and not report.ok


def killed_learner_run(tmp_path, closed_by_up: bool):
    """Checkpoint at step 1; the learner trained g2 in step 2 and was killed; the run was stopped before another
    learner started. g2 and g3 are still in the buffer (g2 pending: acked only once a checkpoint covers it)."""
    write(tmp_path, "controller", [lease("l1", 4, 0), lease("l2", 8, 0), lease("l3", 12, 1),
                                   {"t": 2, "kind": "push_committed", "version": 1},
                                   {"t": 3, "kind": "push_committed", "version": 2}])
    write(tmp_path, "rollout-r0", [written("g1", "1-0"), written("g2", "2-0"), written("g3", "3-0")])
    learner = [{"t": 1, "kind": "resumed", "from_step": 0, "version": 0},
               {"t": 2, "kind": "trained", "step": 0, "group_ids": ["g1"]}, {"t": 2, "kind": "step", "step": 1, "version": 1},
               {"t": 2.1, "kind": "checkpoint_saved", "step": 1},
               {"t": 3, "kind": "trained", "step": 1, "group_ids": ["g2"]}, {"t": 3, "kind": "step", "step": 2, "version": 2}]
    if closed_by_up:
        learner += [{"t": 9, "kind": "learner_lost", "from_step": 1, "checkpoint": "checkpoints/step-000001"},
                    {"t": 9, "kind": "final_buffer", "entry_ids": ["2-0", "3-0"], "snapshot_t": 9, "written_by": "up"}]
    write(tmp_path, "learner", learner)  # fmt: skip


def test_a_learner_killed_at_the_end_counts_from_its_checkpoint(tmp_path):
    killed_learner_run(tmp_path, closed_by_up=False)
    report = audit_run(tmp_path)
    assert report.lost == ["g3"] and not report.ok  # without the buffer's list, unconsumed data looks lost
    killed_learner_run(tmp_path, closed_by_up=True)
    report = audit_run(tmp_path)
    assert report.ok, report.as_dict()
    # g2's step died with the learner: it counts as in the buffer (pending, trained again later), not trained.
    assert report.groups_trained == 1 and report.left_in_buffer == 2 and report.lost == []
