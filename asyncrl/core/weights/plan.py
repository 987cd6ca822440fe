"""A weight push plan in plain Python (the proto `WeightPushPlan` at the service edges; the codec is
`asyncrl.core.weights.manifest`).

Torch-free on purpose: the controller decodes and checks every plan, and it never needs torch otherwise.
Only `TensorMeta.torch_dtype` (the data plane's question) imports it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

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


@dataclass(frozen=True)
class PushPlan:
    push_id: str
    version: int
    store_address: str
    world_size: int
    transport: str
    tensors: tuple[TensorMeta, ...]
    bucket_bytes: int
    timeout_s: float
    join_timeout_s: float = 0.0
    """Group formation time-out once the join handshake said go (0 = timeout_s)."""
    group_id: str = ""
    """The broadcast group this push uses, kept by every member across pushes while the membership holds
    (`weights.groups`); "" = a group of this push alone, formed and closed with it."""
    new_group: bool = True
    """The group is formed by this push (False: every member already holds it from an earlier push)."""
    manifest_digest: str = ""
    """SHA-256 (hex) of the tensor manifest when `tensors` is not in the plan: the receivers read it once from
    the sender's store (`weights.groups.ManifestCache`) instead of with every push."""
    delta_codec: str = ""
    """A delta codec (`weights.delta.CODECS`): every member keeps the pushed bytes as its group's base, so a
    later push on the group may send only what changed. "" = no base kept, every push whole."""
    delta_base_push_id: str = ""
    """Set: this push is a delta against the bytes of that earlier push on the same group, which every member
    acknowledged. "" = a whole push."""

    @property
    def formation_timeout_s(self) -> float:
        return self.join_timeout_s or self.timeout_s

    @property
    def group_key(self) -> str:
        """The store prefix the group forms under: the group's, or the push's own."""
        return f"group/{self.group_id}/" if self.group_id else f"push/{self.push_id}/group/"

    @property
    def store_host(self) -> str:
        return self.store_address.rsplit(":", 1)[0]

    @property
    def store_port(self) -> int:
        return int(self.store_address.rsplit(":", 1)[1])

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


def tensor_metas(named_tensors) -> tuple[TensorMeta, ...]:
    return tuple(TensorMeta.of(name, t) for name, t in named_tensors)
