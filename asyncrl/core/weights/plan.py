"""A weight push plan in plain Python (the proto `WeightPushPlan` at the service edges; the codec is
`asyncrl.core.weights.manifest`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TensorMeta:
    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name without "torch.", e.g. "float32"

    @property
    def torch_dtype(self) -> torch.dtype:
        dtype = getattr(torch, self.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"tensor {self.name!r}: unknown dtype {self.dtype!r}")  # noqa: TRY004 - a bad value
        return dtype

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.torch_dtype.itemsize

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
