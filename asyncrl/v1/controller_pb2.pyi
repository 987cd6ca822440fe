from asyncrl.v1 import weights_pb2 as _weights_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RegisterReplicaRequest(_message.Message):
    __slots__ = ("address", "replica_id", "weight_version", "engine", "push_key", "in_band_pushes")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    PUSH_KEY_FIELD_NUMBER: _ClassVar[int]
    IN_BAND_PUSHES_FIELD_NUMBER: _ClassVar[int]
    address: str
    replica_id: str
    weight_version: int
    engine: str
    push_key: bytes
    in_band_pushes: bool
    def __init__(self, address: _Optional[str] = ..., replica_id: _Optional[str] = ..., weight_version: _Optional[int] = ..., engine: _Optional[str] = ..., push_key: _Optional[bytes] = ..., in_band_pushes: _Optional[bool] = ...) -> None: ...

class RegisterReplicaResponse(_message.Message):
    __slots__ = ("replica_id", "current_version", "needs_sync", "heartbeat_interval_s", "push_key")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    CURRENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    NEEDS_SYNC_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    PUSH_KEY_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    current_version: int
    needs_sync: bool
    heartbeat_interval_s: float
    push_key: bytes
    def __init__(self, replica_id: _Optional[str] = ..., current_version: _Optional[int] = ..., needs_sync: _Optional[bool] = ..., heartbeat_interval_s: _Optional[float] = ..., push_key: _Optional[bytes] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("replica_id", "weight_version", "held_leases", "adapter_checksum", "replica_proof")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    HELD_LEASES_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    REPLICA_PROOF_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    weight_version: int
    held_leases: HeldLeases
    adapter_checksum: str
    replica_proof: bytes
    def __init__(self, replica_id: _Optional[str] = ..., weight_version: _Optional[int] = ..., held_leases: _Optional[_Union[HeldLeases, _Mapping]] = ..., adapter_checksum: _Optional[str] = ..., replica_proof: _Optional[bytes] = ...) -> None: ...

class HeldLeases(_message.Message):
    __slots__ = ("lease_ids",)
    LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    lease_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, lease_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("current_version", "needs_sync", "held_back_s", "push_problem")
    CURRENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    NEEDS_SYNC_FIELD_NUMBER: _ClassVar[int]
    HELD_BACK_S_FIELD_NUMBER: _ClassVar[int]
    PUSH_PROBLEM_FIELD_NUMBER: _ClassVar[int]
    current_version: int
    needs_sync: bool
    held_back_s: float
    push_problem: str
    def __init__(self, current_version: _Optional[int] = ..., needs_sync: _Optional[bool] = ..., held_back_s: _Optional[float] = ..., push_problem: _Optional[str] = ...) -> None: ...

class AcquireLeaseRequest(_message.Message):
    __slots__ = ("replica_id", "num_trajectories", "wait_s", "replica_proof")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    REPLICA_PROOF_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    num_trajectories: int
    wait_s: float
    replica_proof: bytes
    def __init__(self, replica_id: _Optional[str] = ..., num_trajectories: _Optional[int] = ..., wait_s: _Optional[float] = ..., replica_proof: _Optional[bytes] = ...) -> None: ...

class AcquireLeaseResponse(_message.Message):
    __slots__ = ("granted", "lease_id", "prompt_index", "version", "reason", "expires_unix_s", "sample_index", "num_trajectories")
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_INDEX_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    granted: bool
    lease_id: str
    prompt_index: int
    version: int
    reason: str
    expires_unix_s: float
    sample_index: int
    num_trajectories: int
    def __init__(self, granted: _Optional[bool] = ..., lease_id: _Optional[str] = ..., prompt_index: _Optional[int] = ..., version: _Optional[int] = ..., reason: _Optional[str] = ..., expires_unix_s: _Optional[float] = ..., sample_index: _Optional[int] = ..., num_trajectories: _Optional[int] = ...) -> None: ...

class CompleteLeaseRequest(_message.Message):
    __slots__ = ("replica_id", "lease_id", "num_written", "replica_proof")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    REPLICA_PROOF_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    lease_id: str
    num_written: int
    replica_proof: bytes
    def __init__(self, replica_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., num_written: _Optional[int] = ..., replica_proof: _Optional[bytes] = ...) -> None: ...

class CompleteLeaseResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AcquireLeasesRequest(_message.Message):
    __slots__ = ("replica_id", "num_trajectories", "wait_s", "max_leases", "replica_proof")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    MAX_LEASES_FIELD_NUMBER: _ClassVar[int]
    REPLICA_PROOF_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    num_trajectories: int
    wait_s: float
    max_leases: int
    replica_proof: bytes
    def __init__(self, replica_id: _Optional[str] = ..., num_trajectories: _Optional[int] = ..., wait_s: _Optional[float] = ..., max_leases: _Optional[int] = ..., replica_proof: _Optional[bytes] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("lease_id", "prompt_index", "version", "expires_unix_s", "sample_index", "num_trajectories")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_INDEX_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    prompt_index: int
    version: int
    expires_unix_s: float
    sample_index: int
    num_trajectories: int
    def __init__(self, lease_id: _Optional[str] = ..., prompt_index: _Optional[int] = ..., version: _Optional[int] = ..., expires_unix_s: _Optional[float] = ..., sample_index: _Optional[int] = ..., num_trajectories: _Optional[int] = ...) -> None: ...

class AcquireLeasesResponse(_message.Message):
    __slots__ = ("leases", "reason")
    LEASES_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[Lease]
    reason: str
    def __init__(self, leases: _Optional[_Iterable[_Union[Lease, _Mapping]]] = ..., reason: _Optional[str] = ...) -> None: ...

class LeaseCompletion(_message.Message):
    __slots__ = ("lease_id", "num_written", "reward_mean")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    REWARD_MEAN_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    num_written: int
    reward_mean: float
    def __init__(self, lease_id: _Optional[str] = ..., num_written: _Optional[int] = ..., reward_mean: _Optional[float] = ...) -> None: ...

class CompleteLeasesRequest(_message.Message):
    __slots__ = ("replica_id", "completions", "replica_proof")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    REPLICA_PROOF_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    completions: _containers.RepeatedCompositeFieldContainer[LeaseCompletion]
    replica_proof: bytes
    def __init__(self, replica_id: _Optional[str] = ..., completions: _Optional[_Iterable[_Union[LeaseCompletion, _Mapping]]] = ..., replica_proof: _Optional[bytes] = ...) -> None: ...

class LeaseOutcome(_message.Message):
    __slots__ = ("lease_id", "completed", "error")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    completed: bool
    error: str
    def __init__(self, lease_id: _Optional[str] = ..., completed: _Optional[bool] = ..., error: _Optional[str] = ...) -> None: ...

class CompleteLeasesResponse(_message.Message):
    __slots__ = ("outcomes",)
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    outcomes: _containers.RepeatedCompositeFieldContainer[LeaseOutcome]
    def __init__(self, outcomes: _Optional[_Iterable[_Union[LeaseOutcome, _Mapping]]] = ...) -> None: ...

class RegisterLearnerRequest(_message.Message):
    __slots__ = ("address", "seat_proof", "proof_unix_s", "proof_nonce")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SEAT_PROOF_FIELD_NUMBER: _ClassVar[int]
    PROOF_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    PROOF_NONCE_FIELD_NUMBER: _ClassVar[int]
    address: str
    seat_proof: bytes
    proof_unix_s: int
    proof_nonce: bytes
    def __init__(self, address: _Optional[str] = ..., seat_proof: _Optional[bytes] = ..., proof_unix_s: _Optional[int] = ..., proof_nonce: _Optional[bytes] = ...) -> None: ...

class RegisterLearnerResponse(_message.Message):
    __slots__ = ("learner_key", "current_version")
    LEARNER_KEY_FIELD_NUMBER: _ClassVar[int]
    CURRENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    learner_key: bytes
    current_version: int
    def __init__(self, learner_key: _Optional[bytes] = ..., current_version: _Optional[int] = ...) -> None: ...

class BeginWeightPushRequest(_message.Message):
    __slots__ = ("version", "store_address", "transport", "tensors", "bucket_bytes", "timeout_s", "join_timeout_s", "manifest_digest", "learner_key", "in_band", "unused_push_id", "adapter", "store_key", "checksum_in_store", "sparse_deltas")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STORE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    BUCKET_BYTES_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    JOIN_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_DIGEST_FIELD_NUMBER: _ClassVar[int]
    LEARNER_KEY_FIELD_NUMBER: _ClassVar[int]
    IN_BAND_FIELD_NUMBER: _ClassVar[int]
    UNUSED_PUSH_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    STORE_KEY_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_IN_STORE_FIELD_NUMBER: _ClassVar[int]
    SPARSE_DELTAS_FIELD_NUMBER: _ClassVar[int]
    version: int
    store_address: str
    transport: str
    tensors: _containers.RepeatedCompositeFieldContainer[_weights_pb2.TensorSpec]
    bucket_bytes: int
    timeout_s: float
    join_timeout_s: float
    manifest_digest: str
    learner_key: bytes
    in_band: bool
    unused_push_id: str
    adapter: _weights_pb2.AdapterSpec
    store_key: bytes
    checksum_in_store: bool
    sparse_deltas: bool
    def __init__(self, version: _Optional[int] = ..., store_address: _Optional[str] = ..., transport: _Optional[str] = ..., tensors: _Optional[_Iterable[_Union[_weights_pb2.TensorSpec, _Mapping]]] = ..., bucket_bytes: _Optional[int] = ..., timeout_s: _Optional[float] = ..., join_timeout_s: _Optional[float] = ..., manifest_digest: _Optional[str] = ..., learner_key: _Optional[bytes] = ..., in_band: _Optional[bool] = ..., unused_push_id: _Optional[str] = ..., adapter: _Optional[_Union[_weights_pb2.AdapterSpec, _Mapping]] = ..., store_key: _Optional[bytes] = ..., checksum_in_store: _Optional[bool] = ..., sparse_deltas: _Optional[bool] = ...) -> None: ...

class BeginWeightPushResponse(_message.Message):
    __slots__ = ("plan", "receivers", "in_band", "order_macs", "after_push_id", "receiver_addresses")
    PLAN_FIELD_NUMBER: _ClassVar[int]
    RECEIVERS_FIELD_NUMBER: _ClassVar[int]
    IN_BAND_FIELD_NUMBER: _ClassVar[int]
    ORDER_MACS_FIELD_NUMBER: _ClassVar[int]
    AFTER_PUSH_ID_FIELD_NUMBER: _ClassVar[int]
    RECEIVER_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    plan: _weights_pb2.WeightPushPlan
    receivers: _containers.RepeatedScalarFieldContainer[str]
    in_band: bool
    order_macs: _containers.RepeatedScalarFieldContainer[bytes]
    after_push_id: str
    receiver_addresses: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, plan: _Optional[_Union[_weights_pb2.WeightPushPlan, _Mapping]] = ..., receivers: _Optional[_Iterable[str]] = ..., in_band: _Optional[bool] = ..., order_macs: _Optional[_Iterable[bytes]] = ..., after_push_id: _Optional[str] = ..., receiver_addresses: _Optional[_Iterable[str]] = ...) -> None: ...

class CommitWeightPushRequest(_message.Message):
    __slots__ = ("push_id", "sender_ok", "error", "learner_key", "missing_ranks", "acks", "reserve_next", "push_seconds", "adapter_checksum")
    PUSH_ID_FIELD_NUMBER: _ClassVar[int]
    SENDER_OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LEARNER_KEY_FIELD_NUMBER: _ClassVar[int]
    MISSING_RANKS_FIELD_NUMBER: _ClassVar[int]
    ACKS_FIELD_NUMBER: _ClassVar[int]
    RESERVE_NEXT_FIELD_NUMBER: _ClassVar[int]
    PUSH_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    push_id: str
    sender_ok: bool
    error: str
    learner_key: bytes
    missing_ranks: _containers.RepeatedScalarFieldContainer[int]
    acks: _containers.RepeatedCompositeFieldContainer[_weights_pb2.PushAck]
    reserve_next: bool
    push_seconds: float
    adapter_checksum: str
    def __init__(self, push_id: _Optional[str] = ..., sender_ok: _Optional[bool] = ..., error: _Optional[str] = ..., learner_key: _Optional[bytes] = ..., missing_ranks: _Optional[_Iterable[int]] = ..., acks: _Optional[_Iterable[_Union[_weights_pb2.PushAck, _Mapping]]] = ..., reserve_next: _Optional[bool] = ..., push_seconds: _Optional[float] = ..., adapter_checksum: _Optional[str] = ...) -> None: ...

class CommitWeightPushResponse(_message.Message):
    __slots__ = ("committed", "current_version", "acked", "dropped", "next_push")
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    CURRENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    NEXT_PUSH_FIELD_NUMBER: _ClassVar[int]
    committed: bool
    current_version: int
    acked: _containers.RepeatedScalarFieldContainer[str]
    dropped: _containers.RepeatedScalarFieldContainer[str]
    next_push: BeginWeightPushResponse
    def __init__(self, committed: _Optional[bool] = ..., current_version: _Optional[int] = ..., acked: _Optional[_Iterable[str]] = ..., dropped: _Optional[_Iterable[str]] = ..., next_push: _Optional[_Union[BeginWeightPushResponse, _Mapping]] = ...) -> None: ...

class LearnerHeartbeatRequest(_message.Message):
    __slots__ = ("step", "version", "consumed", "total_steps", "learner_key", "figures")
    class FiguresEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    LEARNER_KEY_FIELD_NUMBER: _ClassVar[int]
    FIGURES_FIELD_NUMBER: _ClassVar[int]
    step: int
    version: int
    consumed: int
    total_steps: int
    learner_key: bytes
    figures: _containers.ScalarMap[str, float]
    def __init__(self, step: _Optional[int] = ..., version: _Optional[int] = ..., consumed: _Optional[int] = ..., total_steps: _Optional[int] = ..., learner_key: _Optional[bytes] = ..., figures: _Optional[_Mapping[str, float]] = ...) -> None: ...

class LearnerHeartbeatResponse(_message.Message):
    __slots__ = ("sync_requested", "current_version")
    SYNC_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    CURRENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    sync_requested: bool
    current_version: int
    def __init__(self, sync_requested: _Optional[bool] = ..., current_version: _Optional[int] = ...) -> None: ...

class ResetTimelineRequest(_message.Message):
    __slots__ = ("version", "admitted", "prompt_index", "learner_key")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    PROMPT_INDEX_FIELD_NUMBER: _ClassVar[int]
    LEARNER_KEY_FIELD_NUMBER: _ClassVar[int]
    version: int
    admitted: int
    prompt_index: int
    learner_key: bytes
    def __init__(self, version: _Optional[int] = ..., admitted: _Optional[int] = ..., prompt_index: _Optional[int] = ..., learner_key: _Optional[bytes] = ...) -> None: ...

class ResetTimelineResponse(_message.Message):
    __slots__ = ("current_version", "leases_expired", "prompt_index")
    CURRENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    LEASES_EXPIRED_FIELD_NUMBER: _ClassVar[int]
    PROMPT_INDEX_FIELD_NUMBER: _ClassVar[int]
    current_version: int
    leases_expired: int
    prompt_index: int
    def __init__(self, current_version: _Optional[int] = ..., leases_expired: _Optional[int] = ..., prompt_index: _Optional[int] = ...) -> None: ...

class ReturnQuotaRequest(_message.Message):
    __slots__ = ("entry_id", "trajectories", "reason", "learner_key", "prompt_index", "lease_id")
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LEARNER_KEY_FIELD_NUMBER: _ClassVar[int]
    PROMPT_INDEX_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    entry_id: str
    trajectories: int
    reason: str
    learner_key: bytes
    prompt_index: int
    lease_id: str
    def __init__(self, entry_id: _Optional[str] = ..., trajectories: _Optional[int] = ..., reason: _Optional[str] = ..., learner_key: _Optional[bytes] = ..., prompt_index: _Optional[int] = ..., lease_id: _Optional[str] = ...) -> None: ...

class ReturnQuotaResponse(_message.Message):
    __slots__ = ("returned", "admitted")
    RETURNED_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    returned: int
    admitted: int
    def __init__(self, returned: _Optional[int] = ..., admitted: _Optional[int] = ...) -> None: ...

class AwaitLeasesRequest(_message.Message):
    __slots__ = ("version", "wait_s", "learner_key")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    LEARNER_KEY_FIELD_NUMBER: _ClassVar[int]
    version: int
    wait_s: float
    learner_key: bytes
    def __init__(self, version: _Optional[int] = ..., wait_s: _Optional[float] = ..., learner_key: _Optional[bytes] = ...) -> None: ...

class AwaitLeasesResponse(_message.Message):
    __slots__ = ("outstanding", "oldest_version")
    OUTSTANDING_FIELD_NUMBER: _ClassVar[int]
    OLDEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    outstanding: int
    oldest_version: int
    def __init__(self, outstanding: _Optional[int] = ..., oldest_version: _Optional[int] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReplicaStatus(_message.Message):
    __slots__ = ("replica_id", "address", "weight_version", "alive", "needs_sync", "active_leases", "last_heartbeat_age_s", "engine", "held_back_s", "push_problem", "reachable", "dead_reason", "adapter_checksum", "adapter_verified")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    NEEDS_SYNC_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_LEASES_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_AGE_S_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    HELD_BACK_S_FIELD_NUMBER: _ClassVar[int]
    PUSH_PROBLEM_FIELD_NUMBER: _ClassVar[int]
    REACHABLE_FIELD_NUMBER: _ClassVar[int]
    DEAD_REASON_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_VERIFIED_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    address: str
    weight_version: int
    alive: bool
    needs_sync: bool
    active_leases: int
    last_heartbeat_age_s: float
    engine: str
    held_back_s: float
    push_problem: str
    reachable: bool
    dead_reason: str
    adapter_checksum: str
    adapter_verified: bool
    def __init__(self, replica_id: _Optional[str] = ..., address: _Optional[str] = ..., weight_version: _Optional[int] = ..., alive: _Optional[bool] = ..., needs_sync: _Optional[bool] = ..., active_leases: _Optional[int] = ..., last_heartbeat_age_s: _Optional[float] = ..., engine: _Optional[str] = ..., held_back_s: _Optional[float] = ..., push_problem: _Optional[str] = ..., reachable: _Optional[bool] = ..., dead_reason: _Optional[str] = ..., adapter_checksum: _Optional[str] = ..., adapter_verified: _Optional[bool] = ...) -> None: ...

class ControllerStatus(_message.Message):
    __slots__ = ("current_version", "admitted", "batch_size", "eta", "held_requests", "replicas", "pushes_committed", "leases_expired", "open_push", "reserved_push")
    CURRENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    ETA_FIELD_NUMBER: _ClassVar[int]
    HELD_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    PUSHES_COMMITTED_FIELD_NUMBER: _ClassVar[int]
    LEASES_EXPIRED_FIELD_NUMBER: _ClassVar[int]
    OPEN_PUSH_FIELD_NUMBER: _ClassVar[int]
    RESERVED_PUSH_FIELD_NUMBER: _ClassVar[int]
    current_version: int
    admitted: int
    batch_size: int
    eta: int
    held_requests: int
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaStatus]
    pushes_committed: int
    leases_expired: int
    open_push: PushStatus
    reserved_push: PushStatus
    def __init__(self, current_version: _Optional[int] = ..., admitted: _Optional[int] = ..., batch_size: _Optional[int] = ..., eta: _Optional[int] = ..., held_requests: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ReplicaStatus, _Mapping]]] = ..., pushes_committed: _Optional[int] = ..., leases_expired: _Optional[int] = ..., open_push: _Optional[_Union[PushStatus, _Mapping]] = ..., reserved_push: _Optional[_Union[PushStatus, _Mapping]] = ...) -> None: ...

class PushStatus(_message.Message):
    __slots__ = ("push_id", "version", "mode", "receivers", "age_s", "in_band")
    PUSH_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    RECEIVERS_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    IN_BAND_FIELD_NUMBER: _ClassVar[int]
    push_id: str
    version: int
    mode: str
    receivers: _containers.RepeatedScalarFieldContainer[str]
    age_s: float
    in_band: bool
    def __init__(self, push_id: _Optional[str] = ..., version: _Optional[int] = ..., mode: _Optional[str] = ..., receivers: _Optional[_Iterable[str]] = ..., age_s: _Optional[float] = ..., in_band: _Optional[bool] = ...) -> None: ...
