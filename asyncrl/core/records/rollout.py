"""A rollout replica's records, in `<run_dir>/events/rollout-<replica id>.jsonl`."""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.core.records.base import Record


@dataclass(frozen=True, kw_only=True)
class GroupWritten(Record):
    """Written right after the group reached the buffer and before its lease completes, so a replica killed in
    between leaves a record or an expiring lease for the audit, never a completed lease alone."""

    KIND = "group_written"
    group_id: str
    entry_id: str
    lease_id: str
    prompt_index: int
    lease_version: int
    min_version: int
    """The oldest weight version among its tokens (-1: no tokens)."""
    max_version: int
    reward_mean: float
    length_mean: float = 0.0
    """Mean tokens the model generated per trajectory (an episode's observations not counted)."""
    turns_mean: float = 0.0
    """Mean model turns per trajectory (0: single-turn samples)."""
    trajectories: int = 0
    """Its trajectories: sampling.group_size, or a hard prompt's larger group (0: written before this field)."""


@dataclass(frozen=True, kw_only=True)
class GroupSkipped(Record):
    """A group not written: its rewards were all equal (`sampling.drop_uniform_groups`), or one of its episodes
    never reached the model's first turn (its environment failed at the start). Its lease completed with
    nothing written, its quota returned."""

    KIND = "group_skipped"
    group_id: str
    lease_id: str
    prompt_index: int
    reward: float
    """The mean reward of its samples (with uniform rewards, the one every sample got)."""
    reason: str = "uniform"
    """"uniform", or "environment_error" (an episode that ended before the model acted: nothing to train)."""
    trajectories: int = 0
    """Its samples (0: written before this field)."""


@dataclass(frozen=True, kw_only=True)
class ProcessRewardsScored(Record):
    """One batch's process rewards scored on the replica (`rollout.process_rewards`)."""

    KIND = "process_rewards_scored"
    groups: int
    responses: int
    """Responses with at least one episode end (the others carry none)."""
    episodes: int
    """Episode ends scored: prefix forwards beyond the empty prefix of each response."""
    seconds: float
    """The replica's time for it (segmentation and the scoring call)."""
    version: int
    """The weight version that scored them."""


@dataclass(frozen=True, kw_only=True)
class GroupRejected(Record):
    """A group kept out of training, dead-lettered with its reason: by a replica (with its `lease_id`: it failed
    the checks before the write) or by the learner (with its `entry_id`: it failed the checks on intake, or
    belongs to a lost timeline)."""

    KIND = "group_rejected"
    group_id: str
    reason: str
    entry_id: str | None = None
    lease_id: str | None = None
