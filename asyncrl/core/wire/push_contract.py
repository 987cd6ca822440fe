"""The push contract: what the weight push (`asyncrl.push`) and the engines that receive it share, and nothing
else. The engines implement the receiver's side against these types; the push's transports implement
`WeightSource` (`asyncrl.push.receiving`) and are handed to an engine when it is built, so no engine imports
a transport.

- `TensorMeta`: one tensor of a push (name, shape, dtype); `match_model` holds a push's tensors against a
  model and raises ValueError naming the tensor.
- `Transport`: the data planes (gloo or gloo-relay on CPUs, nccl on GPUs), as the config names them.
- `PushOrder`: the fields of a push plan a receiver reads (`asyncrl.push.plan.PushPlan` has them).
- `WeightSource` / `WeightStream`: how an engine receives one push's bytes.
- `WeightUpdateStats`: what a receiver reports of one push it loaded.

Torch-free at import: the controller checks plans and never needs torch otherwise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, get_args

if TYPE_CHECKING:
    import torch

    from asyncrl.core.lora.spec import AdapterSpec

Transport = Literal["gloo", "gloo-relay", "nccl"]
"""Data planes of the weight push: gloo (CPU tensors) broadcast from the learner, gloo-relay (CPU tensors passed
from receiver to receiver, bucket by bucket: every link carries the weights once), or nccl (GPU tensors)."""
TRANSPORTS: tuple[str, ...] = get_args(Transport)

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


class PushOrder(Protocol):
    """The fields of one push a receiver reads (`asyncrl.push.plan.PushPlan`)."""

    push_id: str
    version: int
    transport: str
    tensors: tuple[TensorMeta, ...]
    bucket_bytes: int
    adapter: AdapterSpec | None
    checksum_in_store: bool
    sparse_deltas: bool

    @property
    def total_bytes(self) -> int: ...


class WeightStream(Protocol):
    """One push's bytes arriving at one receiver, read once in one of three ways."""

    device: torch.device
    """Where the received tensors live (the transport's device: CPU for gloo, the GPU for nccl)."""

    def buckets(self) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Bucket by bucket, as (name, tensor) views into staging buffers that the next bucket overwrites."""

    def whole(self) -> dict[str, torch.Tensor]:
        """The whole push received into storage of the push's own layout that nothing else reads, by name: an
        engine may point its parameters at these views (no copy), then calls `adopted`."""

    def adopted(self) -> None:
        """The views of `whole` are live now: the storage they replaced becomes the next push's spare."""

    def drain(self) -> None:
        """Take part and drop what arrives (a push this receiver refused: the others are not kept waiting)."""

    def sent_checksum(self) -> str:
        """After the push arrived, of a plan with `checksum_in_store`: the checksum of what the sender sent."""


class WeightSource(Protocol):
    """How an engine receives pushes, kept for the engine's life (broadcast groups and buffers between pushes)."""

    vllm_worker_extension: str
    """Qualified name of the class vLLM mixes into its workers, which receive in their own processes."""

    def open(self, plan: PushOrder, rank: int) -> contextlib.AbstractContextManager[WeightStream]:
        """Join `plan`'s push as `rank` for one stream (left when the context ends)."""

    def worker_args(self, plan: PushOrder) -> dict:
        """`plan` as the vLLM worker extension takes it (plain values: vLLM sends them with msgpack)."""

    def close(self) -> None:
        """Leave every group kept."""


@dataclass
class WeightUpdateStats:
    """What a receiver reports of one push it loaded."""

    version: int
    load_s: float
    """From the start of the receive to the weights being live."""
    pause_s: float
    """Time generation was blocked by the update."""
    bytes_received: int = 0
    extra: dict = field(default_factory=dict)
    adapter_checksum: str = ""
    """The checksum of what the push brought and the engine serves now, the adapter's or the full weights'
    (`asyncrl.core.checks.weights_checksum`)."""
