from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class LearnerStatusRequest(_message.Message):
    __slots__ = ("challenge",)
    CHALLENGE_FIELD_NUMBER: _ClassVar[int]
    challenge: bytes
    def __init__(self, challenge: _Optional[bytes] = ...) -> None: ...

class LearnerStatus(_message.Message):
    __slots__ = ("step", "version", "consumed", "last_reward_mean", "last_eval_accuracy", "last_step_s", "challenge_mac")
    STEP_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_FIELD_NUMBER: _ClassVar[int]
    LAST_REWARD_MEAN_FIELD_NUMBER: _ClassVar[int]
    LAST_EVAL_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    LAST_STEP_S_FIELD_NUMBER: _ClassVar[int]
    CHALLENGE_MAC_FIELD_NUMBER: _ClassVar[int]
    step: int
    version: int
    consumed: int
    last_reward_mean: float
    last_eval_accuracy: float
    last_step_s: float
    challenge_mac: bytes
    def __init__(self, step: _Optional[int] = ..., version: _Optional[int] = ..., consumed: _Optional[int] = ..., last_reward_mean: _Optional[float] = ..., last_eval_accuracy: _Optional[float] = ..., last_step_s: _Optional[float] = ..., challenge_mac: _Optional[bytes] = ...) -> None: ...
