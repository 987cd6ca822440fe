"""The tensor manifest of a weight push: the one codec (proto <-> `TensorMeta`, `PushPlan`) and the one
validator, used wherever a manifest enters a process (the controller's BeginWeightPush, a replica's
UpdateWeights) and wherever one is held against a model (the torch engine's parameters, vLLM's checkpoint).

Two kinds of check, each written once:
- structural (`decode_tensors`, `decode_plan`): names present and unique, dims >= 0, dtypes that torch
  knows, a transport that exists; failures are `InvalidArgument` naming the request field;
- against a model (`match_model`): every tensor of the model exactly once, with its shape, floating dtypes;
  failures are `ValueError` naming the tensor.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping

from google.protobuf.message import DecodeError

from asyncrl.core.validation import (
    MAX_TIMEOUT_S,
    InvalidArgument,
    check_host_port,
    check_name,
    check_range,
    require,
    shown,
)
from asyncrl.core.weights.kinds import CODECS, TRANSPORTS
from asyncrl.core.weights.plan import PushPlan, TensorMeta
from asyncrl.v1 import weights_pb2

MAX_TENSORS = 1 << 20
MAX_TENSOR_NAME = 1024
MAX_PUSH_BYTES = 1 << 46
"""64 TiB: far above any model, far below what would overflow a size computation."""


def encode_tensors(metas: Iterable[TensorMeta]) -> list[weights_pb2.TensorSpec]:
    return [weights_pb2.TensorSpec(name=m.name, shape=list(m.shape), dtype=m.dtype) for m in metas]


def decode_tensors(specs, field: str = "tensors") -> tuple[TensorMeta, ...]:
    """`TensorSpec`s -> `TensorMeta`s, refusing an empty list, empty or repeated names, negative dims and
    dtypes torch does not know."""
    require(1 <= len(specs) <= MAX_TENSORS, field, f"must list 1 to {MAX_TENSORS} tensors, got {len(specs)}")
    seen: set[str] = set()
    metas = []
    total = 0
    for i, spec in enumerate(specs):
        where = f"{field}[{i}]"
        require(0 < len(spec.name) <= MAX_TENSOR_NAME, f"{where}.name",
                f"must be 1 to {MAX_TENSOR_NAME} characters, got {shown(spec.name)}")
        require(spec.name not in seen, f"{where}.name", f"duplicate tensor name {shown(spec.name)}")
        seen.add(spec.name)
        require(len(spec.shape) <= 8 and all(0 <= d <= MAX_PUSH_BYTES for d in spec.shape), f"{where}.shape",
                f"at most 8 dims, each in [0, {MAX_PUSH_BYTES}], got {list(spec.shape)[:9]}")
        meta = TensorMeta(spec.name, tuple(spec.shape), spec.dtype)
        try:
            _ = meta.itemsize  # raises for a name that is not a torch dtype
        except ValueError:
            raise InvalidArgument(f"{where}.dtype", f"unknown torch dtype {shown(spec.dtype)}") from None
        total += math.prod(spec.shape)
        require(total <= MAX_PUSH_BYTES, field, f"more than {MAX_PUSH_BYTES} elements in all")
        metas.append(meta)
    return tuple(metas)


def check_address(value: str, field: str) -> None:
    check_host_port(value, field)


def check_transport(value: str, field: str) -> None:
    require(value in TRANSPORTS, field, f"must be one of {TRANSPORTS}, got {shown(value)}")


def check_optional_seconds(value: float, field: str) -> None:
    """A time-out where 0 means "the default"."""
    require(math.isfinite(value) and 0 <= value <= MAX_TIMEOUT_S, field,
            f"must be in [0, {MAX_TIMEOUT_S}] (0 = the default), got {value}")


def encode_plan(plan: PushPlan) -> weights_pb2.WeightPushPlan:
    return weights_pb2.WeightPushPlan(
        push_id=plan.push_id,
        version=plan.version,
        store_address=plan.store_address,
        world_size=plan.world_size,
        transport=plan.transport,
        tensors=encode_tensors(plan.tensors),
        bucket_bytes=plan.bucket_bytes,
        timeout_s=plan.timeout_s,
        join_timeout_s=plan.join_timeout_s,
        group_id=plan.group_id,
        new_group=plan.new_group,
        manifest_digest=plan.manifest_digest,
        delta_codec=plan.delta_codec,
        delta_base_push_id=plan.delta_base_push_id,
    )


def decode_plan(msg, field: str = "plan") -> PushPlan:
    """A `WeightPushPlan` message -> `PushPlan`, every field checked."""
    check_name(msg.push_id, f"{field}.push_id")
    require(msg.version >= 0, f"{field}.version", f"must be >= 0, got {msg.version}")
    check_address(msg.store_address, f"{field}.store_address")
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
    check_delta(msg.delta_codec, msg.delta_base_push_id, field)
    if msg.delta_base_push_id:
        require(msg.group_id and not msg.new_group, f"{field}.delta_base_push_id",
                "needs a kept group (group_id set, new_group false): a new group has no base")
    return PushPlan(
        push_id=msg.push_id,
        version=msg.version,
        store_address=msg.store_address,
        world_size=msg.world_size,
        transport=msg.transport,
        tensors=() if msg.manifest_digest else decode_tensors(msg.tensors, f"{field}.tensors"),
        bucket_bytes=msg.bucket_bytes,
        timeout_s=msg.timeout_s,
        join_timeout_s=msg.join_timeout_s,
        group_id=msg.group_id,
        new_group=msg.new_group,
        manifest_digest=msg.manifest_digest,
        delta_codec=msg.delta_codec,
        delta_base_push_id=msg.delta_base_push_id,
    )


def check_delta(codec: str, base_push_id: str, field: str = "") -> None:
    """A delta codec ("" or one of `weights.delta.CODECS`) and the push a delta is taken against ("" or a
    push id, which needs a codec)."""
    prefix = f"{field}." if field else ""
    require(not codec or codec in CODECS, f"{prefix}delta_codec",
            f"must be empty or one of {CODECS}, got {shown(codec)}")
    check_name(base_push_id, f"{prefix}delta_base_push_id", optional=True)
    require(not base_push_id or codec, f"{prefix}delta_base_push_id", "needs delta_codec")


def check_digest(value: str, field: str, *, optional: bool = False) -> None:
    if optional and not value:
        return
    require(len(value) == 64 and all(c in "0123456789abcdef" for c in value), field,
            f"must be a SHA-256 digest in lower-case hex (64 characters), got {shown(value)}")


def manifest_bytes(metas: Iterable[TensorMeta]) -> tuple[bytes, str]:
    """The serialized `TensorManifest` of `metas` and its SHA-256 digest (hex)."""
    data = weights_pb2.TensorManifest(tensors=encode_tensors(metas)).SerializeToString()
    return data, hashlib.sha256(data).hexdigest()


def parse_manifest(data: bytes, digest: str) -> tuple[TensorMeta, ...]:
    """A manifest read from a sender's store, checked against the digest its plan names, then structurally."""
    require(hashlib.sha256(data).hexdigest() == digest, "plan.manifest_digest",
            f"the sender's manifest does not have digest {digest}")
    try:
        msg = weights_pb2.TensorManifest.FromString(data)
    except DecodeError:
        raise InvalidArgument("plan.manifest_digest", "the sender's manifest is not a TensorManifest") from None
    return decode_tensors(msg.tensors, "manifest.tensors")


def match_model(
    metas: Iterable[TensorMeta],
    expected: Mapping[str, tuple[int, ...]],
    required: Iterable[str] | None = None,
    *,
    non_float: Iterable[str] = (),
    where: str = "weight push",
) -> None:
    """Hold a manifest against a model's tensors (`expected`: name -> shape): every name known, listed once,
    with the model's shape, and every name of `required` (default: all of `expected`) present. Dtypes: a
    floating dtype, or an integer one for the tensors named in `non_float` (a different dtype of the same
    kind is allowed: the load casts). Raises ValueError naming the tensor."""
    non_float = set(non_float)
    metas = list(metas)
    seen: set[str] = set()
    for meta in metas:
        if meta.name not in expected:
            raise ValueError(f"{where}: tensor {meta.name!r} is not a tensor of the model")
        if meta.name in seen:
            raise ValueError(f"{where}: tensor {meta.name!r} is listed twice")
        seen.add(meta.name)
        if tuple(meta.shape) != tuple(expected[meta.name]):
            raise ValueError(
                f"{where}: tensor {meta.name!r} has shape {tuple(meta.shape)}, the model's is "
                f"{tuple(expected[meta.name])}"
            )
        if meta.torch_dtype.is_floating_point == (meta.name in non_float):
            kind = "an integer" if meta.name in non_float else "a floating"
            raise ValueError(f"{where}: tensor {meta.name!r} has dtype {meta.dtype}, the model's is {kind} dtype")
    missing = sorted(set(expected if required is None else required) - seen)
    if missing:
        raise ValueError(f"{where}: lacks {len(missing)} of the model's tensors, e.g. {missing[0]!r}")
