"""Turning engine generations into the `TrajectoryGroup` written to the buffer (pure)."""

from __future__ import annotations

import json
import time
from typing import Any

from asyncrl.core.agents.episode import EpisodeResult
from asyncrl.core.engines.base import Generation
from asyncrl.core.model.routing import write_proto
from asyncrl.v1 import trajectory_pb2


def build_group(
    *,
    group_id: str,
    prompt_index: int,
    prompt_token_ids: list[int],
    generations: list[Generation],
    rewards: list[float],
    replica_id: str,
    lease_id: str,
    metadata: dict[str, Any],
    sample_index: int | None = None,
) -> trajectory_pb2.TrajectoryGroup:
    if len(generations) != len(rewards):
        raise ValueError(f"{len(generations)} generations but {len(rewards)} rewards")
    trajectories = []
    for j, (gen, reward) in enumerate(zip(generations, rewards)):
        if not (len(gen.token_ids) == len(gen.logp_behav) == len(gen.weight_version)):
            raise ValueError(
                f"sample {j}: {len(gen.token_ids)} tokens, {len(gen.logp_behav)} logp_behav, "
                f"{len(gen.weight_version)} versions"
            )
        episode = isinstance(gen, EpisodeResult)
        traj = trajectory_pb2.Trajectory(
            trajectory_id=f"{group_id}/{j}",
            group_id=group_id,
            # An episode's prompt is its first context as the engine saw it (each may open differently).
            prompt_token_ids=gen.context if episode and gen.context else prompt_token_ids,
            response_token_ids=gen.token_ids,
            logp_behav=gen.logp_behav,
            weight_version=gen.weight_version,
            reward=reward,
            finished=gen.finished,
        )
        if gen.routed_experts is not None:
            write_proto(gen.routed_experts, traj.routed_experts)
        if episode:
            traj.observation_starts.extend(gen.observation_starts)
            traj.observation_ends.extend(gen.observation_ends)
            traj.turn_ends.extend(gen.turn_ends)
            traj.turn_rewards.extend(gen.turn_rewards)
            traj.end_reason = gen.end_reason
            traj.environment_seconds, traj.episode_seconds = gen.environment_s, max(gen.seconds, gen.environment_s)
            traj.tool_calls, traj.tool_failures = len(gen.tools), sum(not tool.ok for tool in gen.tools)
        trajectories.append(traj)
    return trajectory_pb2.TrajectoryGroup(
        group_id=group_id,
        prompt_index=prompt_index,
        replica_id=replica_id,
        lease_id=lease_id,
        trajectories=trajectories,
        metadata=wire_metadata(metadata),
        created_unix_s=time.time(),
        sample_index=sample_index,
    )


def wire_metadata(metadata: dict[str, Any]) -> dict[str, str]:
    """The group's metadata as the proto's string map: strings as they are, anything else as JSON."""
    return {str(k): v if isinstance(v, str) else json.dumps(v, default=str) for k, v in metadata.items()}
