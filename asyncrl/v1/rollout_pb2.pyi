from asyncrl.v1 import weights_pb2 as _weights_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class UpdateWeightsRequest(_message.Message):
    __slots__ = ("plan", "rank", "order_mac")
    PLAN_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ORDER_MAC_FIELD_NUMBER: _ClassVar[int]
    plan: _weights_pb2.WeightPushPlan
    rank: int
    order_mac: bytes
    def __init__(self, plan: _Optional[_Union[_weights_pb2.WeightPushPlan, _Mapping]] = ..., rank: _Optional[int] = ..., order_mac: _Optional[bytes] = ...) -> None: ...

class UpdateWeightsResponse(_message.Message):
    __slots__ = ("weight_version", "load_s", "pause_s", "adapter_checksum")
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    LOAD_S_FIELD_NUMBER: _ClassVar[int]
    PAUSE_S_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    weight_version: int
    load_s: float
    pause_s: float
    adapter_checksum: str
    def __init__(self, weight_version: _Optional[int] = ..., load_s: _Optional[float] = ..., pause_s: _Optional[float] = ..., adapter_checksum: _Optional[str] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompts", "max_new_tokens", "temperature")
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    prompts: _containers.RepeatedCompositeFieldContainer[PromptTokens]
    max_new_tokens: int
    temperature: float
    def __init__(self, prompts: _Optional[_Iterable[_Union[PromptTokens, _Mapping]]] = ..., max_new_tokens: _Optional[int] = ..., temperature: _Optional[float] = ...) -> None: ...

class PromptTokens(_message.Message):
    __slots__ = ("token_ids",)
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class GeneratedSequence(_message.Message):
    __slots__ = ("token_ids", "logp_behav", "weight_version", "finished")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGP_BEHAV_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logp_behav: _containers.RepeatedScalarFieldContainer[float]
    weight_version: _containers.RepeatedScalarFieldContainer[int]
    finished: bool
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., logp_behav: _Optional[_Iterable[float]] = ..., weight_version: _Optional[_Iterable[int]] = ..., finished: _Optional[bool] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("sequences",)
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    sequences: _containers.RepeatedCompositeFieldContainer[GeneratedSequence]
    def __init__(self, sequences: _Optional[_Iterable[_Union[GeneratedSequence, _Mapping]]] = ...) -> None: ...

class RolloutStatusRequest(_message.Message):
    __slots__ = ("challenge",)
    CHALLENGE_FIELD_NUMBER: _ClassVar[int]
    challenge: bytes
    def __init__(self, challenge: _Optional[bytes] = ...) -> None: ...

class RolloutStatus(_message.Message):
    __slots__ = ("replica_id", "weight_version", "engine", "groups_written", "tokens_generated", "challenge_mac", "adapter_checksum")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    GROUPS_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    TOKENS_GENERATED_FIELD_NUMBER: _ClassVar[int]
    CHALLENGE_MAC_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    weight_version: int
    engine: str
    groups_written: int
    tokens_generated: int
    challenge_mac: bytes
    adapter_checksum: str
    def __init__(self, replica_id: _Optional[str] = ..., weight_version: _Optional[int] = ..., engine: _Optional[str] = ..., groups_written: _Optional[int] = ..., tokens_generated: _Optional[int] = ..., challenge_mac: _Optional[bytes] = ..., adapter_checksum: _Optional[str] = ...) -> None: ...
