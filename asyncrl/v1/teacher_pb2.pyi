from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ScoreSequence(_message.Message):
    __slots__ = ("token_ids", "response_start")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_START_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    response_start: int
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., response_start: _Optional[int] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("sequences",)
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    sequences: _containers.RepeatedCompositeFieldContainer[ScoreSequence]
    def __init__(self, sequences: _Optional[_Iterable[_Union[ScoreSequence, _Mapping]]] = ...) -> None: ...

class ScoredSequence(_message.Message):
    __slots__ = ("logp_teacher",)
    LOGP_TEACHER_FIELD_NUMBER: _ClassVar[int]
    logp_teacher: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, logp_teacher: _Optional[_Iterable[float]] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("sequences",)
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    sequences: _containers.RepeatedCompositeFieldContainer[ScoredSequence]
    def __init__(self, sequences: _Optional[_Iterable[_Union[ScoredSequence, _Mapping]]] = ...) -> None: ...
