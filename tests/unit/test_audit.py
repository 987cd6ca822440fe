"""The audit on hand-written event logs (the records the services write, `asyncrl.core.records`): it must catch
each kind of violation."""

import json

from asyncrl.core.records.controller import (
    ControllerStarted,
    LeaseCompleted,
    LeaseExpired,
    LeaseGranted,
    PushCommitted,
    QuotaReturned,
    TimelineReset,
)
from asyncrl.core.records.learner import (
    CheckpointSaved,
    FinalBuffer,
    LearnerLost,
    LearnerStarted,
    Resumed,
    Step,
    Trained,
)
from asyncrl.core.records.rollout import GroupWritten
from asyncrl.tools.audit import audit_run


def write(run_dir, name, records):
    path = run_dir / "events" / f"{name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r.line()) + "\n" for r in records))


def append(run_dir, name, record):
    with (run_dir / "events" / f"{name}.jsonl").open("a") as f:
        f.write(json.dumps(record.line()) + "\n")


def lease(lid, admitted_after, version, eta=1, b=4):
    return LeaseGranted(t=1, lease_id=lid, replica_id="r0", n=4, admitted_after=admitted_after, version=version,
                        eta=eta, batch_size=b, prompt_index=0, held_s=0.0)


def written(gid, eid, t=1.0, v=0):
    return GroupWritten(t=t, group_id=gid, entry_id=eid, lease_id="l", prompt_index=0, lease_version=v,
                        min_version=v, max_version=v, reward_mean=0.0)


def commit(t, version):
    return PushCommitted(t=t, push_id=f"p{t}", version=version, mode="new", acked=[], dropped=[], seconds=0.1,
                         in_band=False)


def trained(t, group_ids, step=0):
    return Trained(t=t, step=step, version=step, entry_ids=[], group_ids=group_ids, trajectories=len(group_ids))


def step(t, number, version, hist=None):
    return Step(t=t, step=number, version=version, metrics={"staleness/hist": hist} if hist else {})


def started(t, start_version=0):
    return ControllerStarted(t=t, grpc="h:1", http="h:2", eta=1, batch_size=4, start_version=start_version,
                             start_admitted=0, start_prompt_index=0, state_store="none")


def completed(replica_id, lease_id, n):
    return LeaseCompleted(t=2, lease_id=lease_id, replica_id=replica_id, n=n, num_written=n, returned=0,
                          admitted_after=0)


def checkpoint(t, number):
    return CheckpointSaved(t=t, step=number, version=number, path=f"step-{number}", acked=0, seconds=0.1,
                           stall_s=0.0, background=False)


def good_run(tmp_path):
    # B=4, η=1: at version 0, N_r up to 8 is admissible (floor(7/4)=1 <= 0+1).
    write(tmp_path, "controller", [lease("l1", 4, 0), lease("l2", 8, 0), commit(2, 1), lease("l3", 12, 1),
                                   commit(3, 1), commit(4, 2)])
    write(tmp_path, "rollout-r0", [written("g1", "1-0"), written("g2", "2-0"), written("g3", "3-0", v=1),
                                   written("g4", "4-0", t=99.0, v=1)])
    write(tmp_path, "learner", [trained(2, ["g1"]), step(2, 1, 1, hist={"0": 4}), trained(3, ["g2"], step=1),
                                step(3, 2, 2, hist={"1": 4}), FinalBuffer(t=5, entry_ids=["3-0"])])


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
    write(tmp_path, "learner", [trained(2, ["g1", "g1"]), FinalBuffer(t=5, entry_ids=[])])
    report = audit_run(tmp_path)
    assert report.trained_twice == ["g1"]
    assert report.lost == ["g2", "g3"]  # neither trained nor in the buffer at the end
    assert not report.ok


def test_version_going_back_is_caught(tmp_path):
    good_run(tmp_path)
    write(tmp_path, "controller", [commit(1, 2), commit(2, 1)])
    assert audit_run(tmp_path).version_errors == ["controller committed 2 then 1"]


def test_a_replica_writes_its_groups_out_of_lease_order_but_never_goes_back_in_lease_order(tmp_path):
    """Multi-turn episodes finish out of order: the group of an earlier lease may be written after later ones.
    The replica's lease versions are checked in the order the controller granted them."""

    def grant(lid, t, version):
        return LeaseGranted(t=t, lease_id=lid, replica_id="r0", n=4, admitted_after=4, version=version, eta=None,
                            batch_size=4, prompt_index=0, held_s=0.0)

    def wrote(lid, t, version):
        return GroupWritten(t=t, group_id=f"g-{lid}", entry_id=f"{t}-0", lease_id=lid, prompt_index=0,
                            lease_version=version, min_version=version, max_version=version, reward_mean=0.0)

    write(tmp_path, "controller", [grant("a", 1, 0), grant("b", 2, 1), commit(1.5, 1)])
    write(tmp_path, "rollout-r0", [wrote("b", 3, 1), wrote("a", 4, 0)])
    write(tmp_path, "learner", [FinalBuffer(t=5, entry_ids=["3-0", "4-0"])])
    assert audit_run(tmp_path).version_errors == []
    write(tmp_path, "controller", [grant("a", 1, 1), grant("b", 2, 0), commit(1.5, 1)])  # granted going back
    write(tmp_path, "rollout-r0", [wrote("a", 3, 1), wrote("b", 4, 0)])
    assert audit_run(tmp_path).version_errors == ["rollout-r0: lease version went 1 -> 0"]


def test_group_of_a_killed_replica_is_told_apart_from_an_unknown_one(tmp_path):
    """A replica killed between writing a group and logging it: its lease expired, the group was trained once.
    That is listed, not an error; a trained group nobody wrote or leased is an error."""
    good_run(tmp_path)
    append(tmp_path, "controller", LeaseExpired(t=2, lease_id="l9", replica_id="r0", n=4, returned=4,
                                                admitted_after=0, reason="reregistered"))
    append(tmp_path, "learner", trained(4, ["r0-l9"], step=2))
    report = audit_run(tmp_path)
    assert report.ok and report.written_by_dead_replica == ["r0-l9"] and report.trained_unwritten == []
    append(tmp_path, "learner", trained(4, ["r0-l10"], step=2))
    report = audit_run(tmp_path)
    assert not report.ok and report.trained_unwritten == ["r0-l10"]


def resumed_run(tmp_path, with_resume_record=True):
    """Checkpoint at step 1; the dead learner trained g2 in step 1 (after the checkpoint) and died; the resumed
    one (controller restarted at version 1) trains g2 again, then g3."""
    write(tmp_path, "controller", [
        started(0), lease("l1", 4, 0), lease("l2", 8, 0), commit(2, 1), lease("l3", 12, 1), commit(3, 2),
        started(10, start_version=1), commit(12, 2), commit(13, 3),
    ])
    write(tmp_path, "rollout-r0", [written("g1", "1-0"), written("g2", "2-0"), written("g3", "3-0", t=2.5, v=1)])
    learner = [trained(2, ["g1"], step=0), step(2, 1, 1), checkpoint(2.1, 1), trained(3, ["g2"], step=1), step(3, 2, 2)]
    if with_resume_record:
        learner.append(Resumed(t=11, from_step=1, version=1, path="checkpoints/step-000001"))
    learner += [trained(12, ["g2"], step=1), step(12, 2, 2), trained(13, ["g3"], step=2), step(13, 3, 3),
                FinalBuffer(t=14, entry_ids=[])]
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
    write(tmp_path, "learner", [trained(2, ["g1", "r1-l9"]), step(2, 1, 1), trained(3, ["g2"], step=1), step(3, 2, 2),
                                FinalBuffer(t=5, entry_ids=["3-0"])])
    assert audit_run(tmp_path).trained_unwritten == ["r1-l9"]
    append(tmp_path, "controller", completed("r1", "l9", 8))
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
    append(tmp_path, "controller", completed("intruder", "l1", 4))
    report = audit_run(tmp_path)
    assert report.stolen_leases == [{"lease_id": "l1", "holder": "r0", "completed_by": "intruder"}]
    assert report.open_leases == 2 and not report.ok


def killed_learner_run(tmp_path, closed_by_up: bool):
    """Checkpoint at step 1; the learner trained g2 in step 2 and was killed; the run was stopped before another
    learner started. g2 and g3 are still in the buffer (g2 pending: acked only once a checkpoint covers it)."""
    write(tmp_path, "controller", [lease("l1", 4, 0), lease("l2", 8, 0), lease("l3", 12, 1), commit(2, 1),
                                   commit(3, 2)])
    write(tmp_path, "rollout-r0", [written("g1", "1-0"), written("g2", "2-0"), written("g3", "3-0")])
    learner = [Resumed(t=1, from_step=0, version=0, path="model"), trained(2, ["g1"], step=0), step(2, 1, 1),
               checkpoint(2.1, 1), trained(3, ["g2"], step=1), step(3, 2, 2)]
    if closed_by_up:
        learner += [LearnerLost(t=9, from_step=1, checkpoint="checkpoints/step-000001"),
                    FinalBuffer(t=9, entry_ids=["2-0", "3-0"], snapshot_t=9, written_by="up")]
    write(tmp_path, "learner", learner)


def test_a_learner_killed_at_the_end_counts_from_its_checkpoint(tmp_path):
    killed_learner_run(tmp_path, closed_by_up=False)
    report = audit_run(tmp_path)
    assert report.lost == ["g3"] and not report.ok  # without the buffer's list, unconsumed data looks lost
    killed_learner_run(tmp_path, closed_by_up=True)
    report = audit_run(tmp_path)
    assert report.ok, report.as_dict()
    # g2's step died with the learner: it counts as in the buffer (pending, trained again later), not trained.
    assert report.groups_trained == 1 and report.left_in_buffer == 2 and report.lost == []


def test_a_group_trained_more_than_eta_versions_after_its_oldest_token_is_caught(tmp_path):
    """η at training: with η = 1 (the last controller start's), g3 written with tokens of version 0 and
    trained at version 2 is 2 versions old: a failure; at version 1 it is within η."""
    good_run(tmp_path)
    with (tmp_path / "events" / "controller.jsonl").open("a") as f:
        f.write(json.dumps(started(0).line() | {"eta": 1}) + "\n")
    assert audit_run(tmp_path).trained_beyond_eta == []
    append(tmp_path, "rollout-r0", written("g5", "5-0", v=0))
    append(tmp_path, "learner", trained(6, ["g5"], step=2))
    report = audit_run(tmp_path)
    assert report.trained_beyond_eta == [{"group_id": "g5", "version": 2, "oldest": 0}] and not report.ok
    assert "1 groups trained more than η versions after their oldest token" in report.failures()


def regenerated(lid, prompt):
    return LeaseGranted(t=4, lease_id=lid, replica_id="r0", n=4, admitted_after=4, version=2, eta=None,
                        batch_size=4, prompt_index=9, held_s=0.0, sample_index=prompt, regenerated=True)


def test_a_prompt_generated_again_must_follow_a_drop_of_that_prompt(tmp_path):
    """Each lease granted as a dropped prompt generated again answers one drop of that prompt (`quota_returned`
    with its prompt_index); a drop still queued at the end is counted, not a failure; a regenerated grant
    that no drop asked for (or a second one for one drop) is."""
    good_run(tmp_path)
    append(tmp_path, "controller", QuotaReturned(t=3, entry_id="2-0", returned=4, admitted_after=8, reason="stale",
                                                 prompt_index=1))
    append(tmp_path, "controller", QuotaReturned(t=3, entry_id="3-0", returned=4, admitted_after=4, reason="stale",
                                                 prompt_index=2))
    append(tmp_path, "controller", regenerated("l9", 1))
    report = audit_run(tmp_path)
    assert (report.prompts_dropped, report.prompts_regenerated) == (2, 1) and report.ok, report.as_dict()
    assert "2 stale groups dropped, 1 of their prompts generated again" in report.headline()
    append(tmp_path, "controller", regenerated("l10", 1))
    report = audit_run(tmp_path)
    assert report.regenerated_unasked == [{"lease_id": "l10", "prompt": 1}] and not report.ok


def test_a_run_that_ends_short_of_its_steps_fails_and_says_where(tmp_path):
    """The good run's learner was started for 2 steps and made them; started for 3, it ended short. A
    restart back to a checkpoint counts from there: the voided steps are not reached."""
    good_run(tmp_path)
    log = (tmp_path / "events" / "learner.jsonl").read_text()
    for goal, failures in [(2, []), (3, ["the run ended at step 2 of 3"])]:
        write(tmp_path, "learner", [LearnerStarted(t=0, total_steps=goal, from_step=0)])
        with (tmp_path / "events" / "learner.jsonl").open("a") as f:
            f.write(log)
        report = audit_run(tmp_path)
        assert report.failures() == failures and (report.last_step, report.total_steps) == (2, goal)
    append(tmp_path, "learner", LearnerLost(t=6, from_step=1, checkpoint="step-1"))
    report = audit_run(tmp_path)
    assert report.last_step == 1 and "the run ended at step 1 of 3" in report.failures()


def reset(t, version, previous):
    return TimelineReset(t=t, version=version, admitted=0, prompt_index=0, leases_expired=0,
                         previous_version=previous)


def test_a_timeline_reset_no_resuming_learner_asked_for_fails(tmp_path):
    """A learner restarted from version 1 asks for one reset to 1; a second reset to 1, or one to 0, is someone
    else moving the run back (a caller holding the learner's key)."""
    good_run(tmp_path)
    append(tmp_path, "learner", Resumed(t=6, from_step=1, version=1, path="step-1"))
    append(tmp_path, "controller", reset(6.1, 1, 2))
    assert audit_run(tmp_path).resets_unasked == []
    append(tmp_path, "controller", reset(7, 1, 2))
    append(tmp_path, "controller", reset(8, 0, 2))
    report = audit_run(tmp_path)
    assert report.resets_unasked == ["version 2 -> 1", "version 2 -> 0"]
    assert "2 timeline resets no resuming learner asked for (the first: version 2 -> 1)" in report.failures()
