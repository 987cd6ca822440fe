"""What a trajectory group must satisfy to enter training (pure; no model, no network).

Checked where data enters the buffer (the replica, before `put`) and where it leaves it (the learner, before a
group joins a batch). A group that fails is dead-lettered with the reason and never trained on: one bad record
must neither crash the learner (a crash loop, since the entry stays pending) nor poison the weights (a NaN
log-prob or a 3e38 reward turns the loss and then every parameter into NaN).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from asyncrl.core.agents.episode import END_REASONS as EPISODE_ENDS
from asyncrl.core.checks.validation import shown
from asyncrl.core.model.modeling import checkpoint_config

# A log-prob is <= 0; float rounding in another engine's log-softmax may leave a hair above.
LOGP_TOLERANCE = 1e-4

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@/-]{0,255}")
"""Group, trajectory, replica and lease ids: what the replicas make, nothing a terminal or a page would render
otherwise (no spaces, controls or unicode)."""
MAX_PROMPT_INDEX = 1 << 53
MAX_METADATA_ENTRIES = 64
MAX_METADATA_KEY = 256
MAX_METADATA_VALUE = 1 << 20
MAX_METADATA_BYTES = 4 << 20
"""The task metadata a group carries (prompt text, expected answer): 1 MiB a value, 4 MiB in all."""
_HOSTILE_TEXT = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
"""C0/C1 controls but tab and newlines, and the bidi embeddings, overrides and isolates that make text display
as something else than it is (right-to-left marks, used by real text, stay allowed)."""
_COMBINING_RUN = re.compile(r"[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]{33,}")
"""More than 32 combining marks in a row: no script needs it, text built to overflow a renderer does."""


class BadGroup(ValueError):
    """A group that must not be trained on; the message names the field and the problem."""


@dataclass(frozen=True)
class TrajectoryLimits:
    vocab_size: int
    """Token ids must be in [0, vocab_size) (the model's embedding rows)."""
    max_sequence_tokens: int
    """Prompt + response tokens at most (the model's context)."""
    max_response_tokens: int
    """Response tokens at most (sampling.max_new_tokens)."""
    group_size: int
    """Trajectories per group, exactly (sampling.group_size; or `hard_group_size`)."""
    max_abs_reward: float
    """|reward| at most (reward.max_abs)."""
    max_version: int | None = None
    """Newest weight version a token may carry (the reader's current version); None: not checked."""
    hard_group_size: int = 0
    """Trajectories a group of a hard prompt sampled again may hold instead (controller.difficulty
    .hard_group_size; such a group carries its sample_index); 0: none."""

    def with_max_version(self, version: int) -> TrajectoryLimits:
        return dataclasses.replace(self, max_version=version)


def checkpoint_limits(model_path: str | Path, sampling, reward, environment=None,
                      difficulty=None) -> TrajectoryLimits:
    """Limits from a checkpoint's config.json (vocabulary, context) and the run's `sampling` and `reward`
    sections (and `environment`: an episode's response holds up to max_episode_tokens; `difficulty`
    (controller.difficulty): the size of a hard prompt's group)."""
    raw = checkpoint_config(model_path)
    episodes = environment is not None and environment.type != "none"
    return TrajectoryLimits(
        vocab_size=int(raw["vocab_size"]),
        max_sequence_tokens=int(raw.get("max_position_embeddings") or 1 << 31),
        max_response_tokens=environment.max_episode_tokens if episodes else sampling.max_new_tokens,
        group_size=sampling.group_size,
        max_abs_reward=reward.max_abs,
        hard_group_size=difficulty.hard_group_size if difficulty is not None else 0,
    )


def _floats(values, field: str, trajectory: str, upper: float | None) -> None:
    array = np.asarray(values, dtype=np.float64)
    if array.size and not np.isfinite(array).all():
        raise BadGroup(f"trajectory {trajectory!r}: {field} holds a non-finite value (NaN or inf)")
    if upper is not None and array.size and array.max() > upper:
        raise BadGroup(f"trajectory {trajectory!r}: {field} holds {array.max():g} > 0 (log-probs are <= 0)")


def check_group_fields(group) -> None:
    """BadGroup naming the first field of `group` outside what a replica writes: ids, the prompt index, the
    trajectories' group, the metadata's size and text."""
    if not _ID.fullmatch(group.group_id):
        raise BadGroup(f"group_id: must be an id of letters, digits and _.:@/- (at most 256), got {shown(group.group_id)}")
    for field in ("replica_id", "lease_id"):
        value = getattr(group, field)
        if value and not _ID.fullmatch(value):
            raise BadGroup(f"{field}: must be empty or an id of letters, digits and _.:@/-, got {shown(value)}")
    if not 0 <= group.prompt_index <= MAX_PROMPT_INDEX:
        raise BadGroup(f"prompt_index: must be in [0, {MAX_PROMPT_INDEX}], got {group.prompt_index}")
    if group.HasField("sample_index") and not 0 <= group.sample_index <= MAX_PROMPT_INDEX:
        raise BadGroup(f"sample_index: must be in [0, {MAX_PROMPT_INDEX}], got {group.sample_index}")
    if not math.isfinite(group.created_unix_s) or group.created_unix_s < 0:
        raise BadGroup(f"created_unix_s: must be a finite time, got {group.created_unix_s}")
    for t in group.trajectories:
        if t.group_id != group.group_id or not _ID.fullmatch(t.trajectory_id):
            raise BadGroup(f"trajectories: {shown(t.trajectory_id)} is not a trajectory of group {group.group_id!r}")
    metadata = group.metadata
    if len(metadata) > MAX_METADATA_ENTRIES:
        raise BadGroup(f"metadata: at most {MAX_METADATA_ENTRIES} entries, got {len(metadata)}")
    total = 0
    for key, value in metadata.items():
        if not 0 < len(key) <= MAX_METADATA_KEY:
            raise BadGroup(f"metadata: a key of 1 to {MAX_METADATA_KEY} characters, got {shown(key)}")
        if len(value) > MAX_METADATA_VALUE:
            raise BadGroup(f"metadata[{shown(key)}]: at most {MAX_METADATA_VALUE} characters, got {len(value)}")
        total += len(key) + len(value)
        if total > MAX_METADATA_BYTES:
            raise BadGroup(f"metadata: more than {MAX_METADATA_BYTES} characters in all")
        for text, where in ((key, "metadata key"), (value, f"metadata[{shown(key)}]")):
            if (found := _HOSTILE_TEXT.search(text)) is not None:
                raise BadGroup(f"{where}: holds a control or bidi-override character (U+{ord(found.group()):04X})")
            if _COMBINING_RUN.search(text) is not None:
                raise BadGroup(f"{where}: holds more than 32 combining marks in a row")


MAX_PROCESS_REWARD = 1e4
"""Largest |U_k| a process reward may carry: a difference of two mean log-probs, far below this unless an
answer token is all but impossible after one prefix and certain after the next."""


def check_trajectory_group(group, limits: TrajectoryLimits) -> int:
    """BadGroup naming the first problem of `group` (a TrajectoryGroup) against `limits`; else the newest
    weight version among its tokens (a reader that checks before it knows its current version compares it
    later)."""
    check_group_fields(group)
    n = len(group.trajectories)
    if n != limits.group_size and not (n == limits.hard_group_size and group.HasField("sample_index")):
        hard = (f", or controller.difficulty.hard_group_size = {limits.hard_group_size} for a hard prompt sampled "
                "again (with its sample_index)") if limits.hard_group_size else ""
        raise BadGroup(f"trajectories: {n} in the group, expected sampling.group_size = {limits.group_size}{hard}")
    # Every group passes through here twice (the replica before `put`, the learner before training) and nearly
    # all pass: one quick look over the whole group's values, and the per-trajectory walk that names the
    # problem only when that look is not sure (measured per 8-trajectory group: 146 -> 45 us with 4-token
    # responses, 120 -> 107 us with 256-token ones).
    newest = _surely_passes(group.trajectories, limits)
    if newest is not None:
        for t in group.trajectories:  # a few positions each, when there are any: checked on the quick path too
            _process_rewards(t, len(t.response_token_ids), t.trajectory_id)
            _episode_fields(t, len(t.response_token_ids), t.trajectory_id)
        return newest
    for t in group.trajectories:
        _check_trajectory(t, limits)
    return max(max(t.weight_version) for t in group.trajectories)


# Below this many values, builtins over one concatenated list beat numpy's per-array overhead; above it,
# numpy's conversion (about half the cost per value) wins.
_FEW_VALUES = 1024


def _summary(trajectories, fields: tuple[str, ...]) -> tuple[float, float, bool]:
    """(min, max, whether the sum is finite) over `fields` of every trajectory. A finite sum means no NaN or
    inf among the values (both propagate); were finite values ever to overflow the sum (float32 log-probs
    summed in float64 cannot), the group would only go to the exact walk."""
    count = sum(len(getattr(t, f)) for t in trajectories for f in fields)
    if count <= _FEW_VALUES:
        values: list = []
        for t in trajectories:
            for f in fields:
                values.extend(getattr(t, f))
        return min(values), max(values), math.isfinite(sum(values))
    array = np.concatenate([np.asarray(getattr(t, f)) for t in trajectories for f in fields])
    return array.min(), array.max(), math.isfinite(array.sum(dtype=np.float64))


def _surely_passes(trajectories, limits: TrajectoryLimits) -> int | None:
    """The newest token version when every trajectory surely passes `_check_trajectory`; None when one may
    not (that walk decides)."""
    for t in trajectories:
        prompt, response = len(t.prompt_token_ids), len(t.response_token_ids)
        if not (prompt and 0 < response <= limits.max_response_tokens
                and prompt + response <= limits.max_sequence_tokens
                and len(t.logp_behav) == response == len(t.weight_version)
                and len(t.logp_teacher) in (0, response)):
            return None
    ids_min, ids_max, _ = _summary(trajectories, ("prompt_token_ids", "response_token_ids"))
    _, logp_max, logp_finite = _summary(trajectories, ("logp_behav", "logp_teacher"))
    version_min, version_max, _ = _summary(trajectories, ("weight_version",))
    rewards = [t.reward for t in trajectories]
    passes = (ids_min >= 0 and ids_max < limits.vocab_size and logp_finite and logp_max <= LOGP_TOLERANCE
              and version_min >= 0 and (limits.max_version is None or version_max <= limits.max_version)
              and math.isfinite(sum(rewards)) and max(map(abs, rewards)) <= limits.max_abs_reward)
    return int(version_max) if passes else None


def _check_trajectory(t, limits: TrajectoryLimits) -> None:
    """BadGroup naming the first problem of one trajectory."""
    name = t.trajectory_id
    prompt, response = np.asarray(t.prompt_token_ids), np.asarray(t.response_token_ids)
    if not prompt.size:
        raise BadGroup(f"trajectory {name!r}: empty prompt_token_ids")
    if not response.size:
        raise BadGroup(f"trajectory {name!r}: empty response_token_ids")
    if response.size > limits.max_response_tokens:
        raise BadGroup(f"trajectory {name!r}: {response.size} response tokens > max_new_tokens "
                       f"({limits.max_response_tokens})")
    if prompt.size + response.size > limits.max_sequence_tokens:
        raise BadGroup(f"trajectory {name!r}: {prompt.size + response.size} tokens > the model's context "
                       f"({limits.max_sequence_tokens})")
    for field, ids in (("prompt_token_ids", prompt), ("response_token_ids", response)):
        if ids.min() < 0 or ids.max() >= limits.vocab_size:
            raise BadGroup(f"trajectory {name!r}: {field} outside the vocabulary [0, {limits.vocab_size})")
    if len(t.logp_behav) != response.size or len(t.weight_version) != response.size:
        raise BadGroup(f"trajectory {name!r}: {response.size} tokens but {len(t.logp_behav)} logp_behav and "
                       f"{len(t.weight_version)} weight_version entries")
    _floats(t.logp_behav, "logp_behav", name, LOGP_TOLERANCE)
    if len(t.logp_teacher):
        if len(t.logp_teacher) != response.size:
            raise BadGroup(f"trajectory {name!r}: {len(t.logp_teacher)} logp_teacher for {response.size} tokens")
        _floats(t.logp_teacher, "logp_teacher", name, LOGP_TOLERANCE)
    _process_rewards(t, response.size, name)
    _episode_fields(t, response.size, name)
    versions = np.asarray(t.weight_version)
    if versions.min() < 0:
        raise BadGroup(f"trajectory {name!r}: weight_version {versions.min()} < 0")
    if limits.max_version is not None and versions.max() > limits.max_version:
        raise BadGroup(f"trajectory {name!r}: weight_version {versions.max()} is from the future (current "
                       f"version {limits.max_version})")
    if not math.isfinite(t.reward) or abs(t.reward) > limits.max_abs_reward:
        raise BadGroup(f"trajectory {name!r}: reward {t.reward:g} is not finite or |reward| > reward.max_abs "
                       f"({limits.max_abs_reward:g})")


def _process_rewards(t, response: int, name: str) -> None:
    """BadGroup unless the process rewards sit on strictly increasing response positions, one finite value of
    at most MAX_PROCESS_REWARD each, scored by a version at least 0."""
    positions, values = list(t.process_positions), list(t.process_rewards)
    if len(positions) != len(values):
        raise BadGroup(f"trajectory {name!r}: {len(positions)} process_positions but {len(values)} process_rewards")
    if not positions:
        return
    if positions[0] < 0 or positions[-1] >= response or any(b <= a for a, b in itertools.pairwise(positions)):
        raise BadGroup(f"trajectory {name!r}: process_positions must increase strictly within [0, {response})")
    if not all(math.isfinite(v) and abs(v) <= MAX_PROCESS_REWARD for v in values):
        raise BadGroup(f"trajectory {name!r}: process_rewards must be finite, |value| <= {MAX_PROCESS_REWARD:g}")
    if t.process_version < 0:
        raise BadGroup(f"trajectory {name!r}: process_version {t.process_version} < 0")


END_REASONS = ("", *EPISODE_ENDS)
"""A trajectory's `end_reason`: empty for a single-turn sample, else why its episode ended."""


MAX_EPISODE_S = 1e6
"""Seconds an episode's time figures may say (no episode outlives a lease by this much)."""


def _episode_fields(t, response: int, name: str) -> None:
    """BadGroup unless a multi-turn episode's fields fit its response: observation spans ordered, disjoint,
    non-empty and after the first token; turn ends increasing and not inside an observation, the last at the
    last model token; one finite turn reward per turn (or none) that sum to the reward; a known end reason."""
    starts, ends, turns = list(t.observation_starts), list(t.observation_ends), list(t.turn_ends)
    if t.end_reason not in END_REASONS:
        raise BadGroup(f"trajectory {name!r}: end_reason {shown(t.end_reason)} is not one of {END_REASONS[1:]}")
    times = (t.environment_seconds, t.episode_seconds)
    if not all(math.isfinite(x) and 0.0 <= x <= MAX_EPISODE_S for x in times):
        raise BadGroup(f"trajectory {name!r}: environment_seconds and episode_seconds must be in [0, {MAX_EPISODE_S:g}], "
                       f"got {times[0]!r}, {times[1]!r}")
    if not 0 <= t.tool_failures <= t.tool_calls:
        raise BadGroup(f"trajectory {name!r}: tool_failures must be in [0, tool_calls = {t.tool_calls}], "
                       f"got {t.tool_failures}")
    if not (starts or ends or turns or len(t.turn_rewards)):
        return
    if len(starts) != len(ends):
        raise BadGroup(f"trajectory {name!r}: {len(starts)} observation_starts but {len(ends)} observation_ends")
    previous = 0
    for start, end in zip(starts, ends):
        if not previous < start < end <= response:
            raise BadGroup(f"trajectory {name!r}: observation spans must be ordered, disjoint, non-empty, after the "
                           f"first token and within the {response} response tokens; got [{start}, {end})")
        previous = end
    if not turns or any(b <= a for a, b in itertools.pairwise(turns)) or turns[0] <= 0 or turns[-1] > response:
        raise BadGroup(f"trajectory {name!r}: turn_ends must increase strictly within (0, {response}]")
    if len(turns) != len(starts) + 1 and len(turns) != len(starts):
        raise BadGroup(f"trajectory {name!r}: {len(turns)} turns for {len(starts)} observations (one observation "
                       "follows each turn but possibly the last)")
    for turn_end, start in zip(turns, starts):
        if turn_end != start:
            raise BadGroup(f"trajectory {name!r}: a turn ends at {turn_end} but its observation starts at {start}")
    rewards = list(t.turn_rewards)
    if rewards:
        if len(rewards) != len(turns) or not all(math.isfinite(r) for r in rewards):
            raise BadGroup(f"trajectory {name!r}: turn_rewards must hold one finite value per turn ({len(turns)})")
        if abs(sum(rewards) - t.reward) > 1e-3 * max(1.0, abs(t.reward)):
            raise BadGroup(f"trajectory {name!r}: turn_rewards sum to {sum(rewards):g}, the reward is {t.reward:g}")
