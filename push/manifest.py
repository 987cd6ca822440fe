"""The wire form of a push's tensor list (`TensorSpec`, `TensorManifest`) and its structural check, used wherever
a manifest enters a process (the controller's BeginWeightPush, a replica's UpdateWeights, a manifest read from
the sender's store): names present and unique, dims >= 0, dtypes that torch knows; failures are
`InvalidArgument` naming the request field. `TensorMeta` itself and the check against a model (`match_model`)
are the push contract's (`asyncrl.core.wire.push_contract`).

Torch-free on purpose: the controller decodes and checks every plan, and it never needs torch otherwise.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable

from google.protobuf.message import DecodeError

from asyncrl.core.checks.validation import InvalidArgument, require, shown
from asyncrl.core.lora.spec import AdapterSpec
from asyncrl.core.wire.push_contract import TensorMeta
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


def check_digest(value: str, field: str, *, optional: bool = False) -> None:
    if optional and not value:
        return
    require(len(value) == 64 and all(c in "0123456789abcdef" for c in value), field,
            f"must be a SHA-256 digest in lower-case hex (64 characters), got {shown(value)}")


def manifest_bytes(metas: Iterable[TensorMeta], adapter: AdapterSpec | None = None) -> tuple[bytes, str]:
    """The serialized `TensorManifest` of `metas` (an adapter's, with `adapter`) and its SHA-256 digest (hex)."""
    msg = weights_pb2.TensorManifest(tensors=encode_tensors(metas))
    if adapter is not None:
        msg.adapter.CopyFrom(adapter.to_proto())
    data = msg.SerializeToString()
    return data, hashlib.sha256(data).hexdigest()


def parse_manifest(data: bytes, digest: str) -> tuple[tuple[TensorMeta, ...], AdapterSpec | None]:
    """A manifest read from a sender's store, checked against the digest its plan names, then structurally:
    its tensors and, for an adapter push, the adapter's shape."""
    require(hashlib.sha256(data).hexdigest() == digest, "plan.manifest_digest",
            f"the sender's manifest does not have digest {digest}")
    try:
        msg = weights_pb2.TensorManifest.FromString(data)
    except DecodeError:
        raise InvalidArgument("plan.manifest_digest", "the sender's manifest is not a TensorManifest") from None
    return decode_tensors(msg.tensors, "manifest.tensors"), AdapterSpec.from_proto(msg.adapter, "manifest.adapter")
