"""From buffer entries to padded training tensors (pure, no model)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from asyncrl.core.buffer import BufferEntry


class MalformedGroup(ValueError):
    """A group that cannot be trained on; carries its id so the learner can set it aside."""

    def __init__(self, group_id: str, problem: str):
        super().__init__(f"group {group_id!r}: {problem}")
        self.group_id = group_id


@dataclass
class TrainBatch:
    entry_ids: list[str]
    group_ids: list[str]  # one per sequence
    trajectory_ids: list[str]
    sequences: list[list[int]]  # prompt + response token ids
    response_starts: list[int]
    logp_behav: torch.Tensor  # [N, T] float32, 0 on padding
    token_versions: torch.Tensor  # [N, T] long, -1 on padding
    response_mask: torch.Tensor  # [N, T] float32
    rewards: torch.Tensor  # [N] float32
    group_index: torch.Tensor  # [N] long
    logp_teacher: torch.Tensor | None = None  # [N, T] float32 when annotated

    def __len__(self) -> int:
        return len(self.sequences)

    def rows(self, index: list[int]) -> TrainBatch:
        """The sub-batch of the given rows, trimmed to its own longest response."""
        idx = torch.tensor(index, dtype=torch.long)
        width = int(self.response_mask[idx].sum(dim=1).max().item()) if index else 0
        pick = lambda t: None if t is None else t[idx, :width]
        return replace(
            self,
            group_ids=[self.group_ids[i] for i in index],
            trajectory_ids=[self.trajectory_ids[i] for i in index],
            sequences=[self.sequences[i] for i in index],
            response_starts=[self.response_starts[i] for i in index],
            logp_behav=pick(self.logp_behav),
            token_versions=pick(self.token_versions),
            response_mask=pick(self.response_mask),
            rewards=self.rewards[idx],
            group_index=self.group_index[idx],
            logp_teacher=pick(self.logp_teacher),
        )


def check_group(group) -> None:
    if not group.trajectories:
        raise MalformedGroup(group.group_id, "has no trajectories")
    for t in group.trajectories:
        n = len(t.response_token_ids)
        if n == 0:
            raise MalformedGroup(group.group_id, f"trajectory {t.trajectory_id!r} has an empty response")
        if len(t.logp_behav) != n or len(t.weight_version) != n:
            raise MalformedGroup(
                group.group_id,
                f"trajectory {t.trajectory_id!r}: {n} tokens but {len(t.logp_behav)} logp_behav and "
                f"{len(t.weight_version)} weight_version entries",
            )
        if not t.prompt_token_ids:
            raise MalformedGroup(group.group_id, f"trajectory {t.trajectory_id!r} has an empty prompt")


def assemble(entries: list[BufferEntry]) -> TrainBatch:
    """Stack every trajectory of every entry; raises MalformedGroup for the first bad group."""
    for e in entries:
        check_group(e.group)
    trajs = [(gi, t) for gi, e in enumerate(entries) for t in e.group.trajectories]
    width = max(len(t.response_token_ids) for _, t in trajs)
    n = len(trajs)
    logp_behav = torch.zeros(n, width)
    versions = torch.full((n, width), -1, dtype=torch.long)
    mask = torch.zeros(n, width)
    for row, (_, t) in enumerate(trajs):
        k = len(t.response_token_ids)
        logp_behav[row, :k] = torch.tensor(list(t.logp_behav))
        versions[row, :k] = torch.tensor(list(t.weight_version))
        mask[row, :k] = 1.0
    teacher = None
    if all(len(t.logp_teacher) for _, t in trajs):
        teacher = torch.zeros(n, width)
        for row, (_, t) in enumerate(trajs):
            teacher[row, : len(t.logp_teacher)] = torch.tensor(list(t.logp_teacher))
    return TrainBatch(
        entry_ids=[e.entry_id for e in entries],
        group_ids=[t.group_id for _, t in trajs],
        trajectory_ids=[t.trajectory_id for _, t in trajs],
        sequences=[list(t.prompt_token_ids) + list(t.response_token_ids) for _, t in trajs],
        response_starts=[len(t.prompt_token_ids) for _, t in trajs],
        logp_behav=logp_behav,
        token_versions=versions,
        response_mask=mask,
        rewards=torch.tensor([t.reward for _, t in trajs], dtype=torch.float32),
        group_index=torch.tensor([gi for gi, _ in trajs], dtype=torch.long),
        logp_teacher=teacher,
    )


def staleness_stats(batch: TrainBatch, version: int) -> dict:
    """Staleness of each sequence = learner version - oldest weight version among its tokens."""
    masked = batch.token_versions.masked_fill(batch.response_mask == 0, 1 << 62)
    oldest = masked.min(dim=1).values
    stale = (version - oldest).clamp(min=0)
    hist = torch.bincount(stale).tolist()
    spans = (batch.token_versions.max(dim=1).values != oldest).float().mean().item()
    return {
        "staleness/mean": stale.float().mean().item(),
        "staleness/max": int(stale.max().item()),
        "staleness/hist": {str(k): int(v) for k, v in enumerate(hist) if v},
        "staleness/multi_version_frac": spans,
    }
