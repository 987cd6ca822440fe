"""From buffer entries to padded training tensors (pure, no model)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch

from asyncrl.core.buffer import BufferEntry
from asyncrl.core.model.routing import RoutingShape, read_proto


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
    response_mask: torch.Tensor  # [N, T] float32: 1 on the tokens trained (the model's), 0 on observations and padding
    rewards: torch.Tensor  # [N] float32
    group_index: torch.Tensor  # [N] long
    logp_teacher: torch.Tensor | None = None  # [N, T] float32 when annotated
    routing: torch.Tensor | None = None
    """MoE rollouts with captured routing: expert ids [N, S, layers, top_k] aligned with `sequences` (S the
    longest sequence), uint8 (int32 beyond 256 experts)."""
    routing_mask: torch.Tensor | None = None
    """[N, S] bool: positions whose routing the rollout captured."""
    routing_bytes: int = 0
    """Wire bytes of the routing data in this batch."""
    finished: torch.Tensor | None = None
    """[N] bool: the response ended with EOS (False: cut at max_new_tokens)."""
    process_rewards: torch.Tensor | None = None
    """[N, T] float32: training-free process rewards on their episodes' last tokens, 0 elsewhere (None: no
    trajectory of the batch carries any)."""
    process_mask: torch.Tensor | None = None
    """[N, T] bool: where `process_rewards` has a value."""
    turns: torch.Tensor | None = None
    """[N] long: model turns of each multi-turn episode (None: no trajectory of the batch is one)."""
    observation_tokens: torch.Tensor | None = None
    episode_figures: dict = field(default_factory=dict)
    """Multi-turn batches: where its episodes' time went and how their tool calls fared (`episode_figures`)."""
    """[N] long: tokens the environment wrote into each episode's response (out of the loss)."""

    def __len__(self) -> int:
        return len(self.sequences)

    def to(self, device: torch.device | str) -> TrainBatch:
        """The batch with its tensors on `device` (the learner's: its log-probs meet them in the objective)."""
        move = lambda t: None if t is None else t.to(device)
        return replace(self, logp_behav=move(self.logp_behav), token_versions=move(self.token_versions),
                       response_mask=move(self.response_mask), rewards=move(self.rewards),
                       group_index=move(self.group_index), logp_teacher=move(self.logp_teacher),
                       routing=move(self.routing), routing_mask=move(self.routing_mask),
                       finished=move(self.finished), process_rewards=move(self.process_rewards),
                       process_mask=move(self.process_mask), turns=move(self.turns),
                       observation_tokens=move(self.observation_tokens))

    def rows(self, index: list[int]) -> TrainBatch:
        """The sub-batch of the given rows, trimmed to its own longest response."""
        idx = torch.tensor(index, dtype=torch.long)
        width = trained_width(self.response_mask[idx]) if index else 0
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
            routing=None if self.routing is None else self.routing[idx, : self._seq_width(index)],
            routing_mask=None if self.routing_mask is None else self.routing_mask[idx, : self._seq_width(index)],
            finished=None if self.finished is None else self.finished[idx],
            process_rewards=pick(self.process_rewards),
            process_mask=pick(self.process_mask),
            turns=None if self.turns is None else self.turns[idx],
            observation_tokens=None if self.observation_tokens is None else self.observation_tokens[idx],
        )

    def _seq_width(self, index: list[int]) -> int:
        return max((len(self.sequences[i]) for i in index), default=0)


def check_group(group, routing_shape: RoutingShape | None = None) -> None:
    """MalformedGroup naming the first problem; routed experts are checked against the learner's MoE shape
    (`routing_shape`; None: a dense learner ignores them)."""
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
        if routing_shape is not None and t.HasField("routed_experts"):
            try:
                _routed_ids(t, routing_shape)
            except ValueError as err:
                raise MalformedGroup(group.group_id, f"trajectory {t.trajectory_id!r}: {err}") from None


def _routed_ids(t, shape: RoutingShape) -> np.ndarray:
    routed = read_proto(t.routed_experts)
    length = len(t.prompt_token_ids) + len(t.response_token_ids)
    _, layers, top_k = routed.ids.shape
    if (layers, top_k, routed.num_experts) != (shape.num_layers, shape.top_k, shape.num_experts):
        raise ValueError(
            f"routed_experts: {layers} layers x top-{top_k} of {routed.num_experts} experts, the learner's model "
            f"has {shape.num_layers} x top-{shape.top_k} of {shape.num_experts}"
        )
    if not length - 1 <= routed.ids.shape[0] <= length:
        raise ValueError(
            f"routed_experts.num_tokens ({routed.ids.shape[0]}) must be {length - 1} or {length} for a sequence of "
            f"{length} tokens"
        )
    return routed.ids


def _stack_routing(trajs, shape: RoutingShape) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(ids [N, S, layers, k], captured mask [N, S], wire bytes) of the trajectories' routed experts, each
    decoded and checked once here; MalformedGroup names the first bad one."""
    width = max(len(t.prompt_token_ids) + len(t.response_token_ids) for t in trajs)
    dtype = torch.uint8 if shape.num_experts <= 256 else torch.int32
    ids = torch.zeros(len(trajs), width, shape.num_layers, shape.top_k, dtype=dtype)
    mask = torch.zeros(len(trajs), width, dtype=torch.bool)
    nbytes = 0
    for row, t in enumerate(trajs):
        if not t.HasField("routed_experts"):
            continue
        try:
            routed = _routed_ids(t, shape)
        except ValueError as err:
            raise MalformedGroup(t.group_id, f"trajectory {t.trajectory_id!r}: {err}") from None
        ids[row, : len(routed)] = torch.from_numpy(routed.astype(np.int32)).to(dtype)
        mask[row, : len(routed)] = True
        nbytes += len(t.routed_experts.expert_ids)
    return ids, mask, nbytes


def assemble(entries: list[BufferEntry], routing_shape: RoutingShape | None = None) -> TrainBatch:
    """Stack every trajectory of every entry; raises MalformedGroup for the first bad group. With
    `routing_shape` (a MoE learner) the rollouts' routed experts come along when any trajectory has them."""
    for e in entries:
        check_group(e.group)  # the routing is checked as it is stacked, below
    trajs = [(gi, t) for gi, e in enumerate(entries) for t in e.group.trajectories]
    width = max(len(t.response_token_ids) for _, t in trajs)
    n = len(trajs)
    # Filled row by row in numpy (a row is one C-level copy) and handed to torch once: per-row torch ops
    # cost more than the copies themselves at a few hundred rows.
    logp_behav = np.zeros((n, width), dtype=np.float32)
    versions = np.full((n, width), -1, dtype=np.int64)
    mask = np.zeros((n, width), dtype=np.float32)
    for row, (_, t) in enumerate(trajs):
        k = len(t.response_token_ids)
        logp_behav[row, :k] = t.logp_behav
        versions[row, :k] = t.weight_version
        mask[row, :k] = 1.0
        for start, end in zip(t.observation_starts, t.observation_ends):
            mask[row, start:end] = 0.0  # the environment's tokens: context, never trained on
    turns = observation_tokens = None
    if any(len(t.turn_ends) for _, t in trajs):
        turns = torch.tensor([max(1, len(t.turn_ends)) for _, t in trajs], dtype=torch.long)
        observation_tokens = torch.tensor(
            [sum(e - s for s, e in zip(t.observation_starts, t.observation_ends)) for _, t in trajs], dtype=torch.long)
    teacher = None
    if all(len(t.logp_teacher) for _, t in trajs):
        teacher = np.zeros((n, width), dtype=np.float32)
        for row, (_, t) in enumerate(trajs):
            teacher[row, : len(t.logp_teacher)] = t.logp_teacher
    process = process_mask = None
    if any(len(t.process_positions) for _, t in trajs):
        process = np.zeros((n, width), dtype=np.float32)
        process_mask = np.zeros((n, width), dtype=bool)
        for row, (_, t) in enumerate(trajs):
            process[row, list(t.process_positions)] = t.process_rewards
            process_mask[row, list(t.process_positions)] = True
    routing = routing_mask = None
    routing_bytes = 0
    if routing_shape is not None and any(t.HasField("routed_experts") for _, t in trajs):
        routing, routing_mask, routing_bytes = _stack_routing([t for _, t in trajs], routing_shape)
    return TrainBatch(
        entry_ids=[e.entry_id for e in entries],
        group_ids=[t.group_id for _, t in trajs],
        trajectory_ids=[t.trajectory_id for _, t in trajs],
        sequences=[list(t.prompt_token_ids) + list(t.response_token_ids) for _, t in trajs],
        response_starts=[len(t.prompt_token_ids) for _, t in trajs],
        logp_behav=torch.from_numpy(logp_behav),
        token_versions=torch.from_numpy(versions),
        response_mask=torch.from_numpy(mask),
        rewards=torch.tensor([t.reward for _, t in trajs], dtype=torch.float32),
        group_index=torch.tensor([gi for gi, _ in trajs], dtype=torch.long),
        logp_teacher=None if teacher is None else torch.from_numpy(teacher),
        routing=routing,
        routing_mask=routing_mask,
        routing_bytes=routing_bytes,
        finished=torch.tensor([t.finished for _, t in trajs], dtype=torch.bool),
        process_rewards=None if process is None else torch.from_numpy(process),
        process_mask=None if process_mask is None else torch.from_numpy(process_mask),
        turns=turns,
        observation_tokens=observation_tokens,
        episode_figures={} if turns is None else episode_figures([t for _, t in trajs]),
    )


def episode_figures(trajectories: list) -> dict[str, float]:
    """The episodes' share of time spent in environment calls, their mean wall seconds, their length
    distribution (response tokens, the observations' included: median, 90th percentile, longest), tool calls per
    episode and the share of those that failed (absent when none was made)."""
    lengths = np.array([len(t.response_token_ids) for t in trajectories], dtype=np.float64)
    environment = sum(t.environment_seconds for t in trajectories)
    wall = sum(t.episode_seconds for t in trajectories)
    calls = sum(t.tool_calls for t in trajectories)
    figures = {"episode/environment_share": environment / wall if wall > 0 else 0.0,
               "episode/seconds_mean": wall / len(trajectories),
               "episode/tool_calls_mean": calls / len(trajectories),
               "episode/tokens_p50": float(np.percentile(lengths, 50)),
               "episode/tokens_p90": float(np.percentile(lengths, 90)), "episode/tokens_max": float(lengths.max())}
    if calls:
        figures["episode/tool_failure_frac"] = sum(t.tool_failures for t in trajectories) / calls
    return figures


def trained_width(mask: torch.Tensor) -> int:
    """Columns up to the last trained token of any row of `mask` [N, T] (observations inside a response are 0,
    so this is not the longest row's count of ones)."""
    columns = (mask > 0).any(dim=0).nonzero()
    return int(columns.max().item()) + 1 if len(columns) else 0


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
