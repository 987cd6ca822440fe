"""A weight push plan in plain Python (the proto `WeightPushPlan` at the service edges)."""

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

    @property
    def store_host(self) -> str:
        return self.store_address.rsplit(":", 1)[0]

    @property
    def store_port(self) -> int:
        return int(self.store_address.rsplit(":", 1)[1])

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def to_proto(self):
        from asyncrl.v1 import weights_pb2

        return weights_pb2.WeightPushPlan(
            push_id=self.push_id,
            version=self.version,
            store_address=self.store_address,
            world_size=self.world_size,
            transport=self.transport,
            tensors=[weights_pb2.TensorSpec(name=t.name, shape=list(t.shape), dtype=t.dtype) for t in self.tensors],
            bucket_bytes=self.bucket_bytes,
            timeout_s=self.timeout_s,
        )

    @classmethod
    def from_proto(cls, msg) -> PushPlan:
        return cls(
            push_id=msg.push_id,
            version=msg.version,
            store_address=msg.store_address,
            world_size=msg.world_size,
            transport=msg.transport,
            tensors=tuple(TensorMeta(t.name, tuple(t.shape), t.dtype) for t in msg.tensors),
            bucket_bytes=msg.bucket_bytes,
            timeout_s=msg.timeout_s,
        )


def tensor_metas(named_tensors) -> tuple[TensorMeta, ...]:
    return tuple(TensorMeta.of(name, t) for name, t in named_tensors)
