"""The weight-transport seam: one broadcast group per push, rank 0 = the learner.

Groups are stateless (no global `torch.distributed` process group): every push forms its own group under
a key prefix (the push id) in the learner's rendezvous TCPStore. That lets replicas join and leave between
pushes (the controller picks the receivers of each push) and lets one process hold several groups, which a
single default process group would not. `make_group` picks gloo (CPU tensors) or nccl (GPU tensors) by
the plan's `transport` field.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator

import torch
from torch.distributed import PrefixStore, TCPStore

from asyncrl.weights.buckets import pack, plan_buckets, unpack
from asyncrl.weights.plan import PushPlan, TensorMeta


class BroadcastGroup(ABC):
    """A process group of `world_size` ranks that can broadcast from rank 0."""

    device: torch.device

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size

    @abstractmethod
    def broadcast(self, tensor: torch.Tensor) -> None:
        """Rank 0 sends `tensor`; every other rank receives into it in place."""

    def close(self) -> None:
        """Drop the group's connections."""


def _store(plan: PushPlan, rank: int, store: TCPStore | None) -> PrefixStore:
    timeout = datetime.timedelta(seconds=plan.timeout_s)
    if store is None:
        if rank == 0:
            raise ValueError("rank 0 (the sender) hosts the rendezvous store and must pass it")
        store = TCPStore(plan.store_host, plan.store_port, is_master=False, timeout=timeout)
    return PrefixStore(f"push/{plan.push_id}/", store)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


class GlooGroup(BroadcastGroup):
    def __init__(self, plan: PushPlan, rank: int, store: TCPStore | None = None):
        super().__init__(rank, plan.world_size)
        from torch.distributed.distributed_c10d import ProcessGroupGloo

        opts = ProcessGroupGloo._Options()
        opts._timeout = datetime.timedelta(seconds=plan.timeout_s)
        # On one machine, bind loopback explicitly: the default device resolves the hostname, which in
        # containers and sandboxes may point at an interface peers cannot reach.
        device = (
            ProcessGroupGloo.create_device(hostname="127.0.0.1")
            if is_loopback(plan.store_host)
            else ProcessGroupGloo.create_default_device()
        )
        opts._devices = [device]
        self._pg = ProcessGroupGloo(_store(plan, rank, store), rank, plan.world_size, opts)
        self.device = torch.device("cpu")

    def broadcast(self, tensor: torch.Tensor) -> None:
        from torch.distributed import BroadcastOptions

        opts = BroadcastOptions()
        opts.rootRank = 0
        self._pg.broadcast([tensor], opts).wait()

    def close(self) -> None:
        self._pg = None


class NcclGroup(BroadcastGroup):
    """GPU data plane. Needs CUDA on every rank; tensors live on `device`."""

    def __init__(self, plan: PushPlan, rank: int, store: TCPStore | None = None, device: str | None = None):
        super().__init__(rank, plan.world_size)
        if not torch.cuda.is_available():
            raise RuntimeError("nccl weight transport needs a CUDA device; use weight_transport.type=gloo on CPU")
        from torch.distributed.distributed_c10d import ProcessGroupNCCL

        self.device = torch.device(device or f"cuda:{torch.cuda.current_device()}")
        opts = ProcessGroupNCCL.Options()
        opts._timeout = datetime.timedelta(seconds=plan.timeout_s)
        self._pg = ProcessGroupNCCL(_store(plan, rank, store), rank, plan.world_size, opts)

    def broadcast(self, tensor: torch.Tensor) -> None:
        from torch.distributed import BroadcastOptions

        opts = BroadcastOptions()
        opts.rootRank = 0
        self._pg.broadcast([tensor], opts).wait()
        torch.cuda.current_stream(self.device).synchronize()

    def close(self) -> None:
        if self._pg is not None:
            try:
                self._pg.shutdown()
            except Exception:  # noqa: BLE001 - best effort on teardown
                pass
        self._pg = None


def make_group(plan: PushPlan, rank: int, store: TCPStore | None = None) -> BroadcastGroup:
    """Factory: the group type named by `plan.transport`."""
    if plan.transport == "gloo":
        return GlooGroup(plan, rank, store)
    if plan.transport == "nccl":
        return NcclGroup(plan, rank, store)
    raise ValueError(f"unknown weight transport {plan.transport!r} (expected 'gloo' or 'nccl')")


def host_store(host: str, port: int, timeout_s: float) -> TCPStore:
    """The learner's long-lived rendezvous store (port 0 = any free port; read `.port`)."""
    return TCPStore(
        host, port, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=timeout_s)
    )


def send_weights(group: BroadcastGroup, named_tensors: Iterable[tuple[str, torch.Tensor]], plan: PushPlan) -> int:
    """Rank 0: broadcast all tensors bucket by bucket, in plan order. Returns bytes sent."""
    tensors = [t for _, t in named_tensors]
    if len(tensors) != len(plan.tensors):
        raise ValueError(f"plan lists {len(plan.tensors)} tensors, got {len(tensors)}")
    sent = 0
    for bucket in plan_buckets(plan.tensors, plan.bucket_bytes):
        flat = pack(bucket, [t.to(group.device) for t in tensors] if group.device.type != "cpu" else tensors)
        group.broadcast(flat)
        sent += flat.numel() * flat.element_size()
    return sent


def receive_weights(group: BroadcastGroup, plan: PushPlan) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Other ranks: yield the named tensors of each bucket as it arrives (views into a fresh buffer)."""
    metas: tuple[TensorMeta, ...] = plan.tensors
    for bucket in plan_buckets(metas, plan.bucket_bytes):
        flat = torch.empty(bucket.numel, dtype=metas[bucket.members[0]].torch_dtype, device=group.device)
        group.broadcast(flat)
        yield unpack(bucket, flat, metas)


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start
