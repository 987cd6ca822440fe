"""Training-free process rewards from the replica's scoring to the learner's advantages, against values worked
out by hand (the seed's token-preserving GRPO with process rewards normalised on their own)."""

from __future__ import annotations

import threading

import pytest
import torch

from asyncrl.core.buffer.trajectory_checks import BadGroup, check_trajectory_group
from asyncrl.core.config.rollout import ProcessRewardConfig
from asyncrl.core.tasks.base import Prompt
from asyncrl.learner.algos import AlgoConfig, build_advantages
from asyncrl.learner.algos.advantages import process_advantages
from asyncrl.learner.algos.groups import Groups
from asyncrl.learner.batch import assemble
from asyncrl.rollout.episodes import turn_boundaries
from asyncrl.rollout.process_scorer import ProcessRewardScorer
from asyncrl.v1 import trajectory_pb2
from tests.unit.test_learner_batch import entry, traj
from tests.unit.test_trajectory_checks import LIMITS, good_group

REWARDS = torch.tensor([[0.0, 1.0, 0.0], [-1.0, 0.0, 3.0]])
WHERE = torch.tensor([[False, True, False], [True, False, True]])
MASK = torch.ones(2, 3, dtype=torch.bool)
ONE_GROUP = Groups.of(torch.tensor([0, 0]))


def test_process_rewards_are_normalised_over_their_own_positions_then_summed_to_go():
    # Over the three positions: values (1, -1, 3), mean 1, Bessel std 2 -> (0, -1, 1) there, 0 elsewhere.
    grpo = process_advantages(REWARDS, MASK, ONE_GROUP, "grpo", eps=0.0, where=WHERE)
    assert grpo.tolist() == [[0.0, 0.0, 0.0], [0.0, 1.0, 1.0]]
    drgrpo = process_advantages(REWARDS, MASK, ONE_GROUP, "drgrpo", eps=0.0, where=WHERE)
    assert drgrpo.tolist() == [[0.0, 0.0, 0.0], [0.0, 2.0, 2.0]]  # centred only: (0, -2, 2)
    # Over every valid token instead (the zeros count), the first row would get a signal of its own.
    assert process_advantages(REWARDS, MASK, ONE_GROUP, "drgrpo", eps=0.0)[0].abs().sum() > 0


def test_the_advantages_add_the_process_term_to_the_outcome_and_report_it():
    cfg = AlgoConfig.model_validate({"advantage": {"estimator": "drgrpo"}})
    result = build_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), MASK.float(), cfg,
                              process_rewards=REWARDS, process_mask=WHERE)
    # Outcome: (1, 0) - 0.5 = +-0.5 on every token; plus the process term above.
    assert result.advantages.tolist() == [[0.5, 0.5, 0.5], [-0.5, 1.5, 1.5]]
    assert result.metrics["process/episodes_per_seq"] == 1.5 and result.metrics["process/utility_mean"] == 1.0
    assert result.metrics["process/seq_frac"] == 1.0


def test_the_batch_carries_process_rewards_where_a_trajectory_has_them():
    with_process = traj("a", 0, [5, 6, 7], [3, 3, 4])
    with_process.process_positions.extend([0, 2])
    with_process.process_rewards.extend([0.25, -0.5])
    batch = assemble([entry("1-0", "a", [with_process, traj("a", 1, [5], [3])])])
    assert batch.process_rewards.tolist() == [[0.25, 0.0, -0.5], [0.0, 0.0, 0.0]]
    assert batch.process_mask.tolist() == [[True, False, True], [False, False, False]]
    assert batch.rows([1]).process_mask.tolist() == [[False]]
    assert assemble([entry("2-0", "b", [traj("b", 0, [5], [3])])]).process_rewards is None


@pytest.mark.parametrize(("positions", "values", "says"), [
    ([1, 0], [0.1, 0.2], "must increase strictly within [0, 3)"),
    ([3], [0.1], "must increase strictly within [0, 3)"),
    ([-1], [0.1], "must increase strictly"),
    ([0, 1], [0.1], "2 process_positions but 1 process_rewards"),
    ([0], [float("inf")], "process_rewards must be finite"),
    ([0], [2e4], "process_rewards must be finite"),
])  # fmt: skip
def test_malformed_process_rewards_are_refused_naming_the_field(positions, values, says):
    group = good_group()
    group.trajectories[1].process_positions.extend(positions)
    group.trajectories[1].process_rewards.extend(values)
    with pytest.raises(BadGroup, match=says.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        check_trajectory_group(group, LIMITS)


def test_well_formed_process_rewards_pass():
    group = good_group()
    group.trajectories[0].process_positions.extend([0, 1])
    group.trajectories[0].process_rewards.extend([0.5, -0.25])
    assert check_trajectory_group(group, LIMITS) == 7


class CharTokenizer:
    """One character per token (ids: code points)."""

    def encode_text(self, text):
        return [ord(c) for c in text]

    def decode_response(self, ids):
        return "".join(chr(i) for i in ids)


class ScoringEngine:
    """Each answer token's log-prob is -1 / (its sequence's answer start): longer prefixes, likelier answers."""

    weight_version = 9

    def __init__(self):
        self.calls = []

    def score(self, sequences, starts):
        self.calls.append((sequences, starts))
        return [[-1.0 / start] * (len(seq) - start) for seq, start in zip(sequences, starts)]


def test_the_replica_scores_v_at_each_episode_end_in_one_call_and_writes_the_utilities():
    cfg = ProcessRewardConfig(enabled=True, markers=["So "], max_episode_tokens=64, force_answer="=")
    engine, tok = ScoringEngine(), CharTokenizer()
    response = tok.encode_text("ab So cd")  # one marker: episode 1 = "ab " (ends at 3), then "So cd"
    group = trajectory_pb2.TrajectoryGroup(trajectories=[
        trajectory_pb2.Trajectory(prompt_token_ids=[1, 2], response_token_ids=response),
        trajectory_pb2.Trajectory(prompt_token_ids=[1, 2], response_token_ids=tok.encode_text("abcd")),
    ])
    done = ProcessRewardScorer(cfg, engine, threading.Lock(), tok).score(
        [group], [Prompt(text="", token_ids=[1, 2], metadata={"answer": "42"})])
    # Prefix 0: prompt + "=" -> answer at 3; prefix 1: + "ab " -> answer at 6. U_1 = -1/6 - (-1/3) = 1/6.
    assert engine.calls[0][1] == [3, 6] and len(engine.calls) == 1
    first, second = group.trajectories
    assert list(first.process_positions) == [2] and first.process_rewards[0] == pytest.approx(1 / 6)
    assert first.process_version == 9 and not second.process_positions  # no episode end: nothing to score
    assert (done.responses, done.episodes, done.version) == (1, 1, 9)


def test_a_prompt_without_an_answer_is_not_scored():
    engine = ScoringEngine()
    group = trajectory_pb2.TrajectoryGroup(trajectories=[
        trajectory_pb2.Trajectory(prompt_token_ids=[1], response_token_ids=[ord(c) for c in "a So b"])])
    scorer = ProcessRewardScorer(ProcessRewardConfig(enabled=True, markers=["So "]), engine, threading.Lock(),
                                 CharTokenizer())
    assert scorer.score([group], [Prompt(text="", token_ids=[1])]).responses == 0 and engine.calls == []


def test_turn_boundaries_score_after_each_answered_turn_and_reward_its_last_token():
    # Turn 1 [0, 3), its observation [3, 6), turn 2 [6, 8), observation [8, 10), turn 3 [10, 12) unanswered.
    assert turn_boundaries([3, 8, 12], [3, 8], [6, 10]) == ([6, 10], [2, 7])
    assert turn_boundaries([5], [], []) == ([], [])  # answered at once: the outcome's alone
    assert turn_boundaries([3, 8], [3, 8], [6, 10]) == ([6, 10], [2, 7])  # cut at max_turns: both answered


def test_a_multi_turn_episode_is_scored_after_each_observation():
    cfg = ProcessRewardConfig(enabled=True, force_answer="", max_episodes=16)
    engine, tok = ScoringEngine(), CharTokenizer()
    episode = trajectory_pb2.Trajectory(prompt_token_ids=[1, 2], response_token_ids=tok.encode_text("abcOBSdeOBfg"),
                                        turn_ends=[3, 8, 12], observation_starts=[3, 8], observation_ends=[6, 10])
    group = trajectory_pb2.TrajectoryGroup(trajectories=[episode])
    episode = group.trajectories[0]  # the group holds a copy
    done = ProcessRewardScorer(cfg, engine, threading.Lock(), tok).score(
        [group], [Prompt(text="", token_ids=[1, 2], metadata={"answer": "42"})])
    # Answer starts: 2 (prompt alone), 2 + 6 (after the first observation), 2 + 10 (after the second).
    # V = -1/2, -1/8, -1/12: U_1 = 3/8 on turn 1's last token (2), U_2 = 1/24 on turn 2's (7).
    assert engine.calls[0][1] == [2, 8, 12]
    assert engine.calls[0][0][1] == [1, 2, *tok.encode_text("abcOBS"), *tok.encode_text("42")]
    assert list(episode.process_positions) == [2, 7]
    assert list(episode.process_rewards) == pytest.approx([3 / 8, 1 / 24])
    assert (done.responses, done.episodes) == (1, 2)
