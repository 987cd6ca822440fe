"""Settings that are valid alone but contradict each other are refused at load, naming the key to change."""

import pytest
from pydantic import ValidationError

from asyncrl.core.config import AsyncRLConfig


def config(**sections) -> AsyncRLConfig:
    return AsyncRLConfig.model_validate({"model": {"path": "m"}, **sections})


def test_a_controller_lease_limit_below_the_replicas_own_deadline_is_refused_naming_it():
    with pytest.raises(ValidationError, match=r"controller.lease_max_s \(600 s\) is shorter than "
                                              r"rollout.lease_deadline_s \(3600 s\)"):
        config(controller={"lease_max_s": 600}, rollout={"lease_deadline_s": 3600})
    # Equal, longer, no limit, or the replicas' deadline off: accepted.
    for lease_max, deadline in ((3600, 3600), (7200, 3600), (0, 3600), (600, 0)):
        config(controller={"lease_max_s": lease_max}, rollout={"lease_deadline_s": deadline})
    defaults = config()
    assert defaults.controller.lease_max_s == defaults.rollout.lease_deadline_s == 1800


def test_a_batch_that_is_not_whole_groups_is_refused_naming_both_keys():
    with pytest.raises(ValidationError, match=r"learner.batch_size \(60\) must be a multiple of "
                                              r"sampling.group_size \(8\)"):
        config(learner={"batch_size": 60}, sampling={"group_size": 8})


def test_pass_at_k_evaluated_on_a_replica_is_refused_naming_both_keys():
    with pytest.raises(ValidationError, match=r"learner.eval_by: replica evaluates greedy accuracy only; "
                                              r"learner.eval_pass_k needs"):
        config(learner={"eval_by": "replica", "eval_pass_k": 4})
    config(learner={"eval_by": "replica"})
    config(learner={"eval_by": "learner", "eval_pass_k": 4})
    with pytest.raises(ValidationError, match="eval_by"):
        config(learner={"eval_by": "teacher"})


def test_learner_status_reports_rarer_than_half_the_heartbeat_timeout_are_refused_naming_both_keys():
    """The learner's status reports are its heartbeat too (the seat it keeps when a challenge goes unanswered)."""
    with pytest.raises(ValidationError, match=r"learner.status_interval_s \(6 s\) is more than half "
                                              r"controller.heartbeat_timeout_s \(10 s\)"):
        config(learner={"status_interval_s": 6})
    config(learner={"status_interval_s": 5})
    config(learner={"status_interval_s": 6}, controller={"heartbeat_timeout_s": 12})
    with pytest.raises(ValidationError, match="status_interval_s"):
        config(learner={"status_interval_s": -1})
