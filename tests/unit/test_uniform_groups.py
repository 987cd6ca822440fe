"""`sampling.drop_uniform_groups`: which groups teach nothing, and the settings it refuses to combine with."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from asyncrl.core.config.schema import AsyncRLConfig
from asyncrl.rollout.uniform_groups import is_uniform


@pytest.mark.parametrize(("rewards", "uniform"), [
    ([0.0, 0.0, 0.0], True), ([1.0, 1.0], True), ([0.5, 0.5 + 1e-9], True),  # equal within the tolerance
    ([0.0, 1.0, 0.0], False), ([0.25, 0.75], False), ([1.0, 1.0 - 1e-3], False), ([], False),
])  # fmt: skip
def test_a_group_is_uniform_when_every_reward_is_the_same(rewards, uniform):
    assert is_uniform(rewards) is uniform


@pytest.mark.parametrize(("sets", "named"), [
    ({"sampling": {"group_size": 1}, "learner": {"batch_size": 8}}, "sampling.group_size >= 2"),
    ({"learner": {"algo": {"length_penalty": {"type": "uniform"}}}}, "learner.algo.length_penalty.type"),
    ({"learner": {"algo": {"kl": {"mode": "reward"}}}}, "learner.algo.kl.mode: reward"),
    ({"teacher": {"enabled": True, "annotate": True}, "learner": {"algo": {"opd": {"enabled": True}}}},
     "learner.algo.opd.enabled"),
])  # fmt: skip
def test_dropping_uniform_groups_is_refused_where_they_still_carry_a_signal(sets, named):
    data = {**sets, "sampling": {**sets.get("sampling", {}), "drop_uniform_groups": True}}
    with pytest.raises(ValidationError, match=named.replace(".", r"\.").replace(">", ">")):
        AsyncRLConfig.model_validate(data)


def test_dropping_uniform_groups_is_accepted_with_rewards_as_the_only_signal():
    assert AsyncRLConfig.model_validate({"sampling": {"drop_uniform_groups": True}}).sampling.drop_uniform_groups
