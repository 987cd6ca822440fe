"""What a push is: the sender's `PushOffer` (what the learner asks for in BeginWeightPush) and the
`PushPlan` the controller makes of it (the offer plus the push id, the version, the receivers' count and the
broadcast group). Each has one converter to and from its proto message, which checks every field and names
the one it refuses; nothing else spells the fields out.

Torch-free on purpose: the controller decodes and checks every plan, and it never needs torch otherwise.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from asyncrl.core.checks.validation import (
    MAX_TIMEOUT_S,
    check_host_port,
    check_name,
    check_range,
    require,
    shown,
)
from asyncrl.core.lora.spec import AdapterSpec
from asyncrl.core.wire.push_contract import TRANSPORTS, TensorMeta
from asyncrl.push.manifest import MAX_PUSH_BYTES, check_digest, decode_tensors, encode_tensors
from asyncrl.v1 import controller_pb2, weights_pb2


def check_transport(value: str, field: str) -> None:
    require(value in TRANSPORTS, field, f"must be one of {TRANSPORTS}, got {shown(value)}")


STORE_KEY_BYTES = 32
"""Length of a store's key (`push.store_gate`)."""


def check_store_key(value: bytes, field: str) -> None:
    require(len(value) == STORE_KEY_BYTES, field,
            f"must be the {STORE_KEY_BYTES}-byte key of the learner's store, got {len(value)} bytes")


def check_optional_seconds(value: float, field: str) -> None:
    """A time-out where 0 means "the default"."""
    require(math.isfinite(value) and 0 <= value <= MAX_TIMEOUT_S, field,
            f"must be in [0, {MAX_TIMEOUT_S}] (0 = the default), got {value}")


@dataclass(frozen=True, kw_only=True)
class PushOffer:
    """The sender's half of a plan, as the learner asks for it in BeginWeightPush; the controller adds the
    push id, the version, the receivers and the group."""

    store_address: str
    """host:port of the learner's rendezvous store (rank 0 of every broadcast): its gate (`push.store_gate`)."""
    store_key: bytes
    """What a member proves at the store's gate."""
    transport: str
    tensors: tuple[TensorMeta, ...] = ()
    bucket_bytes: int
    timeout_s: float = 0.0
    """Data time-out; 0 = the controller's push_timeout_s."""
    join_timeout_s: float = 0.0
    """Group formation time-out after the join handshake; 0 = the data time-out."""
    manifest_digest: str = ""
    """Instead of `tensors`: the digest of the manifest the learner published in its store."""
    in_band: bool = False
    """The learner can order the next push through its store and relay the acks (`push.in_band`), when the
    controller reserves it at a commit."""
    adapter: AdapterSpec | None = None
    """The tensors are a LoRA adapter of this shape (with `tensors`; a manifest says so itself)."""
    checksum_in_store: bool = False
    """The learner writes the checksum of what it sent into the push's store after its broadcast
    (`broadcast.publish_checksum`), for receivers to compare before they serve."""
    sparse_deltas: bool = False
    """Buckets may travel as the elements changed since the version the receivers hold (`push.deltas`)."""

    @property
    def store(self) -> tuple[str, bytes]:
        """Which learner's store: its address and key (a learner restarted at the address has a new key)."""
        return self.store_address, self.store_key

    def to_proto(self, **request) -> controller_pb2.BeginWeightPushRequest:
        """The BeginWeightPush request carrying this offer; `request`: its other fields (version, ...)."""
        return controller_pb2.BeginWeightPushRequest(
            store_address=self.store_address, store_key=self.store_key, transport=self.transport,
            tensors=encode_tensors(self.tensors), bucket_bytes=self.bucket_bytes, timeout_s=self.timeout_s,
            join_timeout_s=self.join_timeout_s, manifest_digest=self.manifest_digest, in_band=self.in_band,
            adapter=None if self.adapter is None else self.adapter.to_proto(),
            checksum_in_store=self.checksum_in_store, sparse_deltas=self.sparse_deltas, **request,
        )  # fmt: skip

    @classmethod
    def from_proto(cls, msg: controller_pb2.BeginWeightPushRequest) -> PushOffer:
        """The offer in a BeginWeightPush request, every field checked (InvalidArgument naming it)."""
        check_host_port(msg.store_address, "store_address")
        check_store_key(msg.store_key, "store_key")
        check_transport(msg.transport, "transport")
        check_digest(msg.manifest_digest, "manifest_digest", optional=True)
        if msg.manifest_digest:
            require(not msg.tensors, "tensors", "must be empty when manifest_digest is set")
        check_range(msg.bucket_bytes, 1, MAX_PUSH_BYTES, "bucket_bytes")
        check_optional_seconds(msg.timeout_s, "timeout_s")
        check_optional_seconds(msg.join_timeout_s, "join_timeout_s")
        adapter = AdapterSpec.from_proto(msg.adapter, "adapter")
        require(adapter is None or not msg.manifest_digest, "adapter",
                "must be unset when manifest_digest is set (the manifest names its adapter)")
        return cls(
            store_address=msg.store_address, store_key=msg.store_key, transport=msg.transport,
            tensors=() if msg.manifest_digest else decode_tensors(msg.tensors, "tensors"),
            bucket_bytes=msg.bucket_bytes, timeout_s=msg.timeout_s, join_timeout_s=msg.join_timeout_s,
            manifest_digest=msg.manifest_digest, in_band=msg.in_band, adapter=adapter,
            checksum_in_store=msg.checksum_in_store, sparse_deltas=msg.sparse_deltas,
        )  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class PushPlan:
    """Everything a receiver needs to join one push (`WeightPushPlan` in weights.proto)."""

    push_id: str
    version: int
    store_address: str
    store_key: bytes
    """What a member proves at the store's gate (`push.store_gate`)."""
    world_size: int
    """1 (the sender) + the receivers."""
    transport: str
    tensors: tuple[TensorMeta, ...] = ()
    bucket_bytes: int
    timeout_s: float
    join_timeout_s: float = 0.0
    """Group formation time-out once the join handshake said go (0 = timeout_s)."""
    group_id: str = ""
    """The broadcast group this push uses, kept by every member across pushes while the membership holds
    (`push.groups`); "" = a group of this push alone, formed and closed with it."""
    new_group: bool = True
    """The group is formed by this push (False: every member already holds it from an earlier push)."""
    manifest_digest: str = ""
    """SHA-256 (hex) of the tensor manifest when `tensors` is not in the plan: the receivers read it once from
    the sender's store (`push.groups.ManifestCache`) instead of with every push."""
    adapter: AdapterSpec | None = None
    """The tensors are a LoRA adapter of this shape, applied to the base model the receiver loaded (from the
    plan, or from the manifest once resolved); None: the model's own weights."""
    checksum_in_store: bool = False
    """The sender writes the checksum of what it sent into the push's store after its broadcast: a receiver
    compares it with what it received before it serves (`broadcast.sent_checksum`)."""
    sparse_deltas: bool = False
    """The push opens with a header and its buckets may travel as changed elements (`push.deltas`)."""

    @classmethod
    def from_offer(cls, offer: PushOffer, *, default_timeout_s: float, **assigned) -> PushPlan:
        """The plan the controller makes of `offer`: its fields, a data time-out (the offer's, else
        `default_timeout_s`) and what the controller `assigned` (push id, version, world size, group)."""
        shared = {f.name: getattr(offer, f.name) for f in dataclasses.fields(cls) if hasattr(offer, f.name)}
        shared["timeout_s"] = offer.timeout_s or default_timeout_s
        return cls(**shared, **assigned)

    @property
    def formation_timeout_s(self) -> float:
        return self.join_timeout_s or self.timeout_s

    @property
    def group_key(self) -> str:
        """The store prefix the group forms under: the group's, or the push's own."""
        return f"group/{self.group_id}/" if self.group_id else f"push/{self.push_id}/group/"

    @property
    def store(self) -> tuple[str, bytes]:
        """Which learner's store: its address and key (`PushOffer.store`)."""
        return self.store_address, self.store_key

    @property
    def store_host(self) -> str:
        return self.store_address.rsplit(":", 1)[0]

    @property
    def store_port(self) -> int:
        return int(self.store_address.rsplit(":", 1)[1])

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def to_proto(self) -> weights_pb2.WeightPushPlan:
        return weights_pb2.WeightPushPlan(
            push_id=self.push_id, version=self.version, store_address=self.store_address,
            store_key=self.store_key, world_size=self.world_size, transport=self.transport,
            tensors=encode_tensors(self.tensors), bucket_bytes=self.bucket_bytes, timeout_s=self.timeout_s, join_timeout_s=self.join_timeout_s,
            group_id=self.group_id, new_group=self.new_group, manifest_digest=self.manifest_digest,
            adapter=None if self.adapter is None or self.manifest_digest else self.adapter.to_proto(),
            checksum_in_store=self.checksum_in_store, sparse_deltas=self.sparse_deltas,
        )  # fmt: skip

    @classmethod
    def from_proto(cls, msg: weights_pb2.WeightPushPlan, field: str = "plan") -> PushPlan:
        """A `WeightPushPlan` message, every field checked (InvalidArgument naming `field`.<name>)."""
        check_name(msg.push_id, f"{field}.push_id")
        require(msg.version >= 0, f"{field}.version", f"must be >= 0, got {msg.version}")
        check_host_port(msg.store_address, f"{field}.store_address")
        check_store_key(msg.store_key, f"{field}.store_key")
        check_range(msg.world_size, 2, 1 << 20, f"{field}.world_size")
        check_transport(msg.transport, f"{field}.transport")
        check_range(msg.bucket_bytes, 1, MAX_PUSH_BYTES, f"{field}.bucket_bytes")
        require(math.isfinite(msg.timeout_s) and 0 < msg.timeout_s <= MAX_TIMEOUT_S, f"{field}.timeout_s",
                f"must be in (0, {MAX_TIMEOUT_S}], got {msg.timeout_s}")
        check_optional_seconds(msg.join_timeout_s, f"{field}.join_timeout_s")
        check_name(msg.group_id, f"{field}.group_id", optional=True)
        require(msg.new_group or msg.group_id, f"{field}.new_group", "must be true for a plan without group_id")
        check_digest(msg.manifest_digest, f"{field}.manifest_digest", optional=True)
        if msg.manifest_digest:
            require(not msg.tensors, f"{field}.tensors", "must be empty when manifest_digest is set")
            require(msg.group_id, f"{field}.group_id", "is required with manifest_digest")
        adapter = AdapterSpec.from_proto(msg.adapter, f"{field}.adapter")
        require(adapter is None or not msg.manifest_digest, f"{field}.adapter",
                "must be unset when manifest_digest is set (the manifest names its adapter)")
        return cls(
            push_id=msg.push_id, version=msg.version, store_address=msg.store_address,
            store_key=msg.store_key, world_size=msg.world_size, transport=msg.transport,
            tensors=() if msg.manifest_digest else decode_tensors(msg.tensors, f"{field}.tensors"),
            bucket_bytes=msg.bucket_bytes, timeout_s=msg.timeout_s, join_timeout_s=msg.join_timeout_s,
            group_id=msg.group_id, new_group=msg.new_group, manifest_digest=msg.manifest_digest, adapter=adapter,
            checksum_in_store=msg.checksum_in_store, sparse_deltas=msg.sparse_deltas,
        )  # fmt: skip
