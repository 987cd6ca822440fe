"""The tensor list of a weight push: `TensorMeta`, its wire form (`TensorSpec`, `TensorManifest`) and the one
validator, used wherever a manifest enters a process (the controller's BeginWeightPush, a replica's
UpdateWeights, a manifest read from the sender's store) and wherever one is held against a model (the torch
engine's parameters, vLLM's checkpoint).

Two kinds of check, each written once:
- structural (`decode_tensors`, `parse_manifest`): names present and unique, dims >= 0, dtypes that torch
  knows; failures are `InvalidArgument` naming the request field;
- against a model (`match_model`): every tensor of the model exactly once, with its shape, floating dtypes;
  failures are `ValueError` naming the tensor.

Torch-free on purpose: the controller decodes and checks every plan, and it never needs torch otherwise.
Only `TensorMeta.torch_dtype` (the data plane's question) imports it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from google.protobuf.message import DecodeError

from asyncrl.core.lora.spec import AdapterSpec
from asyncrl.core.validation import InvalidArgument, require, shown
from asyncrl.v1 import weights_pb2

if TYPE_CHECKING:
    import torch

MAX_TENSORS = 1 << 20
MAX_TENSOR_NAME = 1024
MAX_PUSH_BYTES = 1 << 46
"""64 TiB: far above any model, far below what would overflow a size computation."""

DTYPE_BYTES: dict[str, int] = {
    "bool": 1, "uint8": 1, "int8": 1, "int16": 2, "short": 2, "uint16": 2, "int32": 4, "int": 4, "uint32": 4,
    "int64": 8, "long": 8, "uint64": 8,
    "float16": 2, "half": 2, "bfloat16": 2, "float32": 4, "float": 4, "float64": 8, "double": 8,
    "complex32": 4, "chalf": 4, "complex64": 8, "cfloat": 8, "complex128": 16, "cdouble": 16,
    "float8_e4m3fn": 1, "float8_e4m3fnuz": 1, "float8_e5m2": 1, "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1,
    "float4_e2m1fn_x2": 1,
    "qint8": 1, "quint8": 1, "qint32": 4, "quint4x2": 1, "quint2x4": 1,
    "bits8": 1, "bits16": 2, "bits1x8": 1, "bits2x4": 1, "bits4x2": 1, "bit": 1,
    **{f"int{b}": 1 for b in range(1, 8)}, **{f"uint{b}": 1 for b in range(1, 8)},
}
"""Every name of a torch dtype (`torch.<name>` is a `torch.dtype`, aliases included) and its element size in
bytes, as torch reports them (a unit test compares this table with the installed torch)."""


@dataclass(frozen=True)
class TensorMeta:
    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name without "torch.", e.g. "float32"

    @property
    def itemsize(self) -> int:
        size = DTYPE_BYTES.get(self.dtype)
        if size is None:
            raise ValueError(f"tensor {self.name!r}: unknown dtype {self.dtype!r}")
        return size

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        _ = self.itemsize  # the same refusal for a name that is not a torch dtype
        return getattr(torch, self.dtype)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @classmethod
    def of(cls, name: str, tensor: torch.Tensor) -> TensorMeta:
        return cls(name, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."))


def tensor_metas(named_tensors) -> tuple[TensorMeta, ...]:
    return tuple(TensorMeta.of(name, t) for name, t in named_tensors)


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
