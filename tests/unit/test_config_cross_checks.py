"""Settings that are valid alone but contradict each other are refused at load, naming the key to change."""

import pytest
from pydantic import ValidationError

from asyncrl.core.config.schema import AsyncRLConfig


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


def test_episodes_that_contradict_the_other_sections_are_refused_naming_the_keys(tmp_path):
    tools = {"type": "tools", "tools": ["examples/agent/tools.py:add"]}
    with pytest.raises(ValidationError, match=r"environment.max_episode_tokens \(16\) must hold at least one turn "
                                              r"\(sampling.max_new_tokens = 32\)"):
        config(environment={**tools, "max_episode_tokens": 16}, sampling={"max_new_tokens": 32})
    with pytest.raises(ValidationError, match=r"environment.episode_timeout_s \(900 s\) must be below "
                                              r"rollout.lease_deadline_s \(600 s\)"):
        config(environment={**tools, "episode_timeout_s": 900}, rollout={"lease_deadline_s": 600})
    # Process rewards score multi-turn episodes at their turns (rollout.process_rewards.markers).
    assert config(environment=tools, rollout={"process_rewards": {"enabled": True}}).rollout.process_rewards.enabled
    with pytest.raises(ValidationError, match="learner.eval_pass_k"):
        config(environment=tools, learner={"eval_pass_k": 2, "eval_samples": 2})
    with pytest.raises(ValidationError, match="environment.tools: name at least one function"):
        config(environment={"type": "tools"})
    (tmp_path / "t.py").write_text("def f(x):\n    return x\n")
    with pytest.raises(ValidationError, match="no JSON schema for the chat template"):
        config(environment={"type": "tools", "tools": [f"{tmp_path}/t.py:f"]})
    assert config(environment={**tools, "episode_timeout_s": 900}, rollout={"lease_deadline_s": 0})


def test_an_openenv_environment_needs_its_server_and_package_named_in_the_error(monkeypatch):
    """`environment.type: openenv`: a missing or malformed url, a missing package, and a token the installed
    client cannot send are each refused at load naming the key."""
    import sys

    with pytest.raises(ValidationError, match="environment.openenv.url: name the OpenEnv server"):
        config(environment={"type": "openenv"})
    with pytest.raises(ValidationError, match=r"environment.openenv.url: must start with http://"):
        config(environment={"type": "openenv", "openenv": {"url": "127.0.0.1:8000"}})
    with pytest.raises(ValidationError, match="action_field"):
        config(environment={"type": "openenv", "openenv": {"url": "http://h:1", "action_field": ""}})
    good = config(environment={"type": "openenv", "openenv": {"url": "ws://h:1", "reset_fields": ["answer"]}})
    assert good.environment.openenv.reset_fields == ["answer"]
    monkeypatch.setitem(sys.modules, "openenv.core.generic_client", None)  # as if it were not installed
    with pytest.raises(ValidationError, match=r"environment.type: openenv needs the openenv package "
                                              r"\(pip install 'asyncrl\[openenv\]'\)"):
        config(environment={"type": "openenv", "openenv": {"url": "http://h:1"}})


@pytest.mark.parametrize("size", [12, 24])
def test_a_hard_group_that_is_not_whole_groups_filling_a_step_is_refused_naming_the_keys(size):
    """12: not whole groups of 8; 24: does not divide the batch of 64 (the learner's batches could not always
    add up to it)."""
    with pytest.raises(ValidationError, match=rf"controller.difficulty.hard_group_size \({size}\) must be a "
                                              r"multiple of sampling.group_size \(8\) that divides "
                                              r"learner.batch_size \(64\)"):
        config(controller={"difficulty": {"hard_group_size": size, "replay_share": 0.3}})


def test_a_hard_group_size_without_hard_prompts_sampled_again_is_refused():
    with pytest.raises(ValidationError, match=r"controller.difficulty.hard_group_size \(16\) needs "
                                              r"controller.difficulty.replay_share > 0"):
        config(controller={"difficulty": {"hard_group_size": 16}})
    assert config(controller={"difficulty": {"hard_group_size": 16, "replay_share": 0.3}})
    assert config(controller={"difficulty": {"hard_group_size": 8}})  # G itself: nothing changes
