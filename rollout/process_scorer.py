"""Training-free process rewards on the replica (`rollout.process_rewards`): for every response of a batch, the
episode ends (`rollout.episodes`: at discourse markers, or at the turns of a multi-turn episode), V(prefix) at
each of them scored in one engine call with the policy that generated the batch, and each episode's marginal
utility written into its trajectory. It runs in the
replica's finishing step, beside the reward, so the learner's path never waits for it (the seed measured
60-70% off the training step by moving it there)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from asyncrl.core.config.rollout import ProcessRewardConfig
from asyncrl.rollout.episodes import (
    episode_ends,
    marginal_utilities,
    prefix_value,
    scoring_requests,
    turn_boundaries,
)


@dataclass(frozen=True)
class ProcessScoring:
    """What one batch's scoring cost."""

    responses: int
    episodes: int
    """Episode ends scored (each a prefix forward)."""
    seconds: float
    version: int


class ProcessRewardScorer:
    def __init__(self, cfg: ProcessRewardConfig, engine, engine_lock: threading.Lock, tokenizer):
        """`cfg`: the `rollout.process_rewards` section; `tokenizer`: the task's `ModelTokenizer`."""
        self.cfg, self.engine, self.engine_lock, self.tokenizer = cfg, engine, engine_lock, tokenizer
        self.force = tokenizer.encode_text(cfg.force_answer)

    def score(self, groups: list, prompts: list) -> ProcessScoring:
        """Fill `process_positions`, `process_rewards` and `process_version` of every trajectory of `groups`
        (TrajectoryGroups, one per prompt of `prompts`) whose prompt has an answer and whose response has
        episode ends; one `engine.score` call for the whole batch."""
        started = time.perf_counter()
        sequences, starts, owners = [], [], []  # owners: (trajectory, reward positions, sequences scored)
        for group, prompt in zip(groups, prompts):
            answer = prompt.metadata.get(self.cfg.answer_key)
            if answer is None:
                continue
            answer_ids = self.tokenizer.encode_text(str(answer))
            for trajectory in group.trajectories:
                response = list(trajectory.response_token_ids)
                ends, positions = self._episodes(trajectory, response)
                if not ends or not answer_ids:
                    continue
                seqs, firsts = scoring_requests(trajectory.prompt_token_ids, response, ends, self.force, answer_ids)
                sequences += seqs
                starts += firsts
                owners.append((trajectory, positions, len(seqs)))
        if not sequences:
            return ProcessScoring(0, 0, time.perf_counter() - started, self.engine.weight_version)
        with self.engine_lock:
            version = self.engine.weight_version
            logprobs = self.engine.score(sequences, starts)
        at = 0
        for trajectory, positions, count in owners:
            values = [prefix_value(lp) for lp in logprobs[at: at + count]]
            at += count
            trajectory.process_positions.extend(positions)
            trajectory.process_rewards.extend(marginal_utilities(values))
            trajectory.process_version = version
        return ProcessScoring(len(owners), len(sequences) - len(owners), time.perf_counter() - started, version)

    def _episodes(self, trajectory, response: list[int]) -> tuple[list[int], list[int]]:
        """(prefix ends V is scored at, the response positions their utilities go on), the first
        `max_episodes`: a multi-turn episode's answered turns, else the response cut at the markers."""
        if len(trajectory.turn_ends):
            ends, positions = turn_boundaries(trajectory.turn_ends, trajectory.observation_starts,
                                              trajectory.observation_ends)
        else:
            pieces = [self.tokenizer.decode_response([token]) for token in response]
            ends = episode_ends(pieces, self.cfg.markers, self.cfg.max_episode_tokens)
            positions = [end - 1 for end in ends]
        return ends[: self.cfg.max_episodes], positions[: self.cfg.max_episodes]
