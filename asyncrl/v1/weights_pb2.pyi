from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TensorSpec(_message.Message):
    __slots__ = ("name", "shape", "dtype")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    def __init__(self, name: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ...) -> None: ...

class WeightPushPlan(_message.Message):
    __slots__ = ("push_id", "version", "store_address", "world_size", "transport", "tensors", "bucket_bytes", "timeout_s", "join_timeout_s", "group_id", "new_group", "manifest_digest", "adapter", "store_key", "checksum_in_store", "sparse_deltas")
    PUSH_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STORE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    BUCKET_BYTES_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    JOIN_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    NEW_GROUP_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_DIGEST_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    STORE_KEY_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_IN_STORE_FIELD_NUMBER: _ClassVar[int]
    SPARSE_DELTAS_FIELD_NUMBER: _ClassVar[int]
    push_id: str
    version: int
    store_address: str
    world_size: int
    transport: str
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    bucket_bytes: int
    timeout_s: float
    join_timeout_s: float
    group_id: str
    new_group: bool
    manifest_digest: str
    adapter: AdapterSpec
    store_key: bytes
    checksum_in_store: bool
    sparse_deltas: bool
    def __init__(self, push_id: _Optional[str] = ..., version: _Optional[int] = ..., store_address: _Optional[str] = ..., world_size: _Optional[int] = ..., transport: _Optional[str] = ..., tensors: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., bucket_bytes: _Optional[int] = ..., timeout_s: _Optional[float] = ..., join_timeout_s: _Optional[float] = ..., group_id: _Optional[str] = ..., new_group: _Optional[bool] = ..., manifest_digest: _Optional[str] = ..., adapter: _Optional[_Union[AdapterSpec, _Mapping]] = ..., store_key: _Optional[bytes] = ..., checksum_in_store: _Optional[bool] = ..., sparse_deltas: _Optional[bool] = ...) -> None: ...

class AdapterSpec(_message.Message):
    __slots__ = ("rank", "alpha", "target_modules")
    RANK_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    TARGET_MODULES_FIELD_NUMBER: _ClassVar[int]
    rank: int
    alpha: float
    target_modules: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, rank: _Optional[int] = ..., alpha: _Optional[float] = ..., target_modules: _Optional[_Iterable[str]] = ...) -> None: ...

class TensorManifest(_message.Message):
    __slots__ = ("tensors", "adapter")
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    adapter: AdapterSpec
    def __init__(self, tensors: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., adapter: _Optional[_Union[AdapterSpec, _Mapping]] = ...) -> None: ...

class PushOrder(_message.Message):
    __slots__ = ("plan", "order_macs")
    PLAN_FIELD_NUMBER: _ClassVar[int]
    ORDER_MACS_FIELD_NUMBER: _ClassVar[int]
    plan: WeightPushPlan
    order_macs: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, plan: _Optional[_Union[WeightPushPlan, _Mapping]] = ..., order_macs: _Optional[_Iterable[bytes]] = ...) -> None: ...

class PushAck(_message.Message):
    __slots__ = ("rank", "weight_version", "ack_mac", "error", "adapter_checksum")
    RANK_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    ACK_MAC_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    rank: int
    weight_version: int
    ack_mac: bytes
    error: str
    adapter_checksum: str
    def __init__(self, rank: _Optional[int] = ..., weight_version: _Optional[int] = ..., ack_mac: _Optional[bytes] = ..., error: _Optional[str] = ..., adapter_checksum: _Optional[str] = ...) -> None: ...
