from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RoutedExperts(_message.Message):
    __slots__ = ("num_tokens", "num_layers", "top_k", "expert_ids", "num_experts")
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    EXPERT_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_EXPERTS_FIELD_NUMBER: _ClassVar[int]
    num_tokens: int
    num_layers: int
    top_k: int
    expert_ids: bytes
    num_experts: int
    def __init__(self, num_tokens: _Optional[int] = ..., num_layers: _Optional[int] = ..., top_k: _Optional[int] = ..., expert_ids: _Optional[bytes] = ..., num_experts: _Optional[int] = ...) -> None: ...

class Trajectory(_message.Message):
    __slots__ = ("trajectory_id", "group_id", "prompt_token_ids", "response_token_ids", "logp_behav", "weight_version", "reward", "finished", "routed_experts", "logp_teacher", "process_positions", "process_rewards", "process_version", "observation_starts", "observation_ends", "turn_ends", "turn_rewards", "end_reason", "environment_seconds", "episode_seconds", "tool_calls", "tool_failures")
    TRAJECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGP_BEHAV_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    ROUTED_EXPERTS_FIELD_NUMBER: _ClassVar[int]
    LOGP_TEACHER_FIELD_NUMBER: _ClassVar[int]
    PROCESS_POSITIONS_FIELD_NUMBER: _ClassVar[int]
    PROCESS_REWARDS_FIELD_NUMBER: _ClassVar[int]
    PROCESS_VERSION_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_STARTS_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_ENDS_FIELD_NUMBER: _ClassVar[int]
    TURN_ENDS_FIELD_NUMBER: _ClassVar[int]
    TURN_REWARDS_FIELD_NUMBER: _ClassVar[int]
    END_REASON_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    EPISODE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_FAILURES_FIELD_NUMBER: _ClassVar[int]
    trajectory_id: str
    group_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    response_token_ids: _containers.RepeatedScalarFieldContainer[int]
    logp_behav: _containers.RepeatedScalarFieldContainer[float]
    weight_version: _containers.RepeatedScalarFieldContainer[int]
    reward: float
    finished: bool
    routed_experts: RoutedExperts
    logp_teacher: _containers.RepeatedScalarFieldContainer[float]
    process_positions: _containers.RepeatedScalarFieldContainer[int]
    process_rewards: _containers.RepeatedScalarFieldContainer[float]
    process_version: int
    observation_starts: _containers.RepeatedScalarFieldContainer[int]
    observation_ends: _containers.RepeatedScalarFieldContainer[int]
    turn_ends: _containers.RepeatedScalarFieldContainer[int]
    turn_rewards: _containers.RepeatedScalarFieldContainer[float]
    end_reason: str
    environment_seconds: float
    episode_seconds: float
    tool_calls: int
    tool_failures: int
    def __init__(self, trajectory_id: _Optional[str] = ..., group_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., response_token_ids: _Optional[_Iterable[int]] = ..., logp_behav: _Optional[_Iterable[float]] = ..., weight_version: _Optional[_Iterable[int]] = ..., reward: _Optional[float] = ..., finished: _Optional[bool] = ..., routed_experts: _Optional[_Union[RoutedExperts, _Mapping]] = ..., logp_teacher: _Optional[_Iterable[float]] = ..., process_positions: _Optional[_Iterable[int]] = ..., process_rewards: _Optional[_Iterable[float]] = ..., process_version: _Optional[int] = ..., observation_starts: _Optional[_Iterable[int]] = ..., observation_ends: _Optional[_Iterable[int]] = ..., turn_ends: _Optional[_Iterable[int]] = ..., turn_rewards: _Optional[_Iterable[float]] = ..., end_reason: _Optional[str] = ..., environment_seconds: _Optional[float] = ..., episode_seconds: _Optional[float] = ..., tool_calls: _Optional[int] = ..., tool_failures: _Optional[int] = ...) -> None: ...

class TrajectoryGroup(_message.Message):
    __slots__ = ("group_id", "prompt_index", "replica_id", "lease_id", "trajectories", "metadata", "created_unix_s", "sample_index")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_INDEX_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    prompt_index: int
    replica_id: str
    lease_id: str
    trajectories: _containers.RepeatedCompositeFieldContainer[Trajectory]
    metadata: _containers.ScalarMap[str, str]
    created_unix_s: float
    sample_index: int
    def __init__(self, group_id: _Optional[str] = ..., prompt_index: _Optional[int] = ..., replica_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., trajectories: _Optional[_Iterable[_Union[Trajectory, _Mapping]]] = ..., metadata: _Optional[_Mapping[str, str]] = ..., created_unix_s: _Optional[float] = ..., sample_index: _Optional[int] = ...) -> None: ...
