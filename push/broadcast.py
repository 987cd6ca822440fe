"""The weight-transport seam: broadcast groups with rank 0 = the learner (a push's bytes go over them bucket by
bucket in `push.transfer`).

Groups are not the global `torch.distributed` process group: each forms under its own key prefix in the
learner's rendezvous TCPStore (the group id the controller assigns, or a push's own id). That lets replicas
join and leave between pushes (the controller picks the receivers of each push) and lets one process hold
several groups, which a single default process group would not. `form_group` picks gloo (CPU tensors) or
nccl (GPU tensors) by the plan's `transport` field; `make_group` forms one for a single push, and
`push.groups.BroadcastGroups` keeps one across pushes while the membership holds.
"""

from __future__ import annotations

import datetime
from abc import ABC, abstractmethod
from collections.abc import Callable

import torch
from torch.distributed import PrefixStore, TCPStore

from asyncrl.core.wire.push_contract import TRANSPORTS
from asyncrl.core.wire.routes import route_address
from asyncrl.push.plan import PushPlan
from asyncrl.push.rendezvous import announce, mark_unreachable, receiver_join, sender_join
from asyncrl.push.store_client import gated_client
from asyncrl.push.store_gate import GatedStore
from asyncrl.push.store_rights import Member


class BroadcastGroup(ABC):
    """A process group of `world_size` ranks that can broadcast from rank 0."""

    device: torch.device

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size

    @abstractmethod
    def broadcast_async(self, tensor: torch.Tensor):
        """Start a broadcast from rank 0 (in place on the others); returns a handle with `.wait()`."""

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Rank 0 sends `tensor`; every other rank receives into it in place."""
        self.broadcast_async(tensor).wait()

    def finish(self) -> None:
        """Wait for whatever this rank still sends of the push it received (a relay's last bucket)."""

    def close(self) -> None:
        """Drop the group's connections."""


def store_client(address: str, key: bytes, timeout_s: float, member: Member | None = None) -> TCPStore:
    """A client connection to the rendezvous store whose gate is at `address` (host:port, [v6]:port), proving
    `key` there (the store's own, or `member`'s: `push.store_gate`); `SenderGone` at once when nothing listens
    there."""
    return gated_client(address, key, timeout_s, member)


def connect_store(plan: PushPlan, rank: int = 0, timeout_s: float | None = None) -> TCPStore:
    """A client connection to the sender's rendezvous store, within the plan's time-out: as receiver `rank`
    (with the member key its order carries), or with the store's own key (rank 0: the controller)."""
    member = Member(plan.group_key, rank) if rank else None
    return store_client(plan.store_address, plan.store_key, plan.timeout_s if timeout_s is None else timeout_s,
                        member)  # fmt: skip


def push_store(root: TCPStore, plan: PushPlan) -> PrefixStore:
    """The keys of one push (its join handshake)."""
    return PrefixStore(f"push/{plan.push_id}/", root)


def report_unreachable(plan: PushPlan, rank: int, timeout_s: float) -> None:
    """The controller, for a receiver of `plan` whose process is gone: tell the sender through its store, so
    its join wait ends now (`rendezvous.mark_unreachable`). A store that refuses the connection (the sender is
    gone too) raises `SenderGone` at once."""
    mark_unreachable(push_store(connect_store(plan, timeout_s=timeout_s), plan), rank)


class GlooGroup(BroadcastGroup):
    def __init__(self, plan: PushPlan, rank: int, store: PrefixStore):
        super().__init__(rank, plan.world_size)
        from torch.distributed.distributed_c10d import ProcessGroupGloo

        opts = ProcessGroupGloo._Options()
        # The group's own time-out bounds its formation (all ranks are present after the join handshake, so
        # a member that died in between costs this); each broadcast carries the push's data time-out.
        opts._timeout = datetime.timedelta(seconds=plan.formation_timeout_s)
        self._broadcast_timeout = datetime.timedelta(seconds=plan.timeout_s)
        # Each member announces the address its device binds, and the others connect to it. The default
        # device resolves the host's name: 127.0.1.1 on Debian, or an interface peers cannot reach in
        # containers and on hosts with several networks. So: the address that routes to the sender's store
        # (loopback on one machine; every member reaches the sender's host, so the sender reaches it).
        address = route_address(plan.store_host)
        opts._devices = [ProcessGroupGloo.create_device(hostname=address) if address
                         else ProcessGroupGloo.create_default_device()]
        self._pg = ProcessGroupGloo(store, rank, plan.world_size, opts)
        self.device = torch.device("cpu")

    def broadcast_async(self, tensor: torch.Tensor):
        from torch.distributed import BroadcastOptions

        opts = BroadcastOptions()
        opts.rootRank = 0
        opts.timeout = self._broadcast_timeout
        return self._pg.broadcast([tensor], opts)

    def close(self) -> None:
        self._pg = None


class RelayGroup(GlooGroup):
    """gloo, relayed along the ranks: rank r receives each bucket from r - 1 and passes it on to r + 1 while the
    next one arrives. Every link, the learner's included, carries the weights once, where a broadcast's root
    sends them once per receiver (or once per level of a tree): over links as thin as the learner's own, a
    push to N replicas takes about one replica's time plus a bucket per hop. A rank that fails stops the
    relay for the ranks after it, which time out, as a broadcast's would."""

    def __init__(self, plan: PushPlan, rank: int, store: PrefixStore):
        super().__init__(plan, rank, store)
        self._passing_on = None
        """The send of the last bucket this rank received to the next rank, until waited for."""

    def broadcast_async(self, tensor: torch.Tensor):
        if self.rank == 0:
            return _TimedWork(self._pg.send([tensor], 1, 0), self._broadcast_timeout)
        return _Relayed(self, tensor, self._pg.recv([tensor], self.rank - 1, 0))

    def arrived(self, tensor: torch.Tensor, receipt) -> None:
        """Wait for a bucket's `receipt`, then start sending it to the next rank, once the previous one has left
        (its buffer may be reused from now on)."""
        receipt.wait(self._broadcast_timeout)
        self.finish()
        if self.rank + 1 < self.world_size:
            self._passing_on = self._pg.send([tensor], self.rank + 1, 0)

    def finish(self) -> None:
        if self._passing_on is not None:
            work, self._passing_on = self._passing_on, None
            work.wait(self._broadcast_timeout)


class _TimedWork:
    def __init__(self, work, timeout: datetime.timedelta):
        self._work, self._timeout = work, timeout

    def wait(self):
        self._work.wait(self._timeout)


class _Relayed:
    """A relayed bucket: waiting for it waits for its receipt and starts passing it on."""

    def __init__(self, group: RelayGroup, tensor: torch.Tensor, receipt):
        self._group, self._tensor, self._receipt = group, tensor, receipt

    def wait(self):
        self._group.arrived(self._tensor, self._receipt)


class NcclGroup(BroadcastGroup):
    """GPU data plane. Needs CUDA on every rank; tensors live on `device`."""

    def __init__(self, plan: PushPlan, rank: int, store: PrefixStore, device: str | None = None):
        super().__init__(rank, plan.world_size)
        if not torch.cuda.is_available():
            raise RuntimeError("nccl weight transport needs a CUDA device; use weight_transport.type=gloo on CPU")
        from torch.distributed.distributed_c10d import ProcessGroupNCCL

        self.device = torch.device(device or f"cuda:{torch.cuda.current_device()}")
        opts = ProcessGroupNCCL.Options()
        opts._timeout = datetime.timedelta(seconds=plan.timeout_s)
        self._pg = ProcessGroupNCCL(store, rank, plan.world_size, opts)

    def broadcast_async(self, tensor: torch.Tensor):
        from torch.distributed import BroadcastOptions

        opts = BroadcastOptions()
        opts.rootRank = 0
        return _SyncedWork(self._pg.broadcast([tensor], opts), self.device)

    def close(self) -> None:
        if self._pg is not None:
            try:
                self._pg.shutdown()
            except Exception:  # noqa: BLE001, S110 - best effort on teardown
                pass
        self._pg = None


class _SyncedWork:
    """NCCL work whose wait() also waits for the stream, so the data is usable on return."""

    def __init__(self, work, device):
        self._work, self._device = work, device

    def wait(self):
        self._work.wait()
        torch.cuda.current_stream(self._device).synchronize()


def form_group(plan: PushPlan, rank: int, root: TCPStore) -> BroadcastGroup:
    """Form the plan's group (type by `plan.transport`) under its store prefix; every rank must call it."""
    prefixed = PrefixStore(plan.group_key, root)
    if plan.transport == "gloo":
        return GlooGroup(plan, rank, prefixed)
    if plan.transport == "gloo-relay":
        return RelayGroup(plan, rank, prefixed)
    return NcclGroup(plan, rank, prefixed)


def check_transport_here(plan: PushPlan) -> None:
    """Refuse, before joining, a plan this process cannot take part in (a rank that cannot must not announce
    itself ready)."""
    if plan.transport not in TRANSPORTS:
        raise ValueError(f"unknown weight transport {plan.transport!r} (expected one of {TRANSPORTS})")
    if plan.transport == "nccl" and not torch.cuda.is_available():
        raise RuntimeError("nccl weight transport needs a CUDA device; use weight_transport.type=gloo on CPU")


def make_group(
    plan: PushPlan, rank: int, store: TCPStore | None = None, join_timeout_s: float | None = None
) -> BroadcastGroup:
    """A group for this one push (the caller closes it), formed after the join handshake
    (`push.rendezvous`): rank 0 waits at most `join_timeout_s` (default: the plan's) for the
    receivers and raises `ReceiversMissing` if some never come; receivers then raise `PushAborted`.
    Groups kept across pushes: `push.groups.BroadcastGroups`."""
    check_transport_here(plan)
    if rank == 0 and store is None:
        raise ValueError("rank 0 (the sender) hosts the rendezvous store and must pass it")
    root = store if store is not None else connect_store(plan, rank)
    join_push(plan, rank, root, join_timeout_s)
    return form_group(plan, rank, root)


def join_push(plan: PushPlan, rank: int, root: TCPStore, join_timeout_s: float | None = None,
              has_group: bool = True, gone: Callable[[int], bool] | None = None) -> PrefixStore:
    """The push's join handshake (`push.rendezvous`) as `rank`; returns the push's store (its keys).
    `gone`: the sender's check of a receiver that does not join (`push.rendezvous.sender_join`)."""
    handshake = push_store(root, plan)
    if rank == 0:
        open_push(root, plan)
        announce(root, plan.push_id)
        sender_join(handshake, plan.push_id, plan.world_size, join_timeout_s or plan.formation_timeout_s, gone)
    else:
        receiver_join(handshake, plan.push_id, rank, plan.timeout_s, has_group, root=root)
    return handshake


def open_push(root: TCPStore, plan: PushPlan) -> None:
    """The sender, before anyone hears of `plan`: its members may write their keys of it from now on
    (`push.store_rights`; a store without a gate lets everyone write anyway)."""
    if isinstance(root, GatedStore):
        root.gate.open_push(plan.push_id, plan.group_key, plan.world_size)


def host_store(host: str, port: int, timeout_s: float, key: bytes | None = None) -> GatedStore:
    """The learner's long-lived rendezvous store, reached through its gate on `host` only (port 0 = any free
    port; read `.port`, and `.key`, which plans carry as `store_key`; a fresh key unless given): `push.store_gate`."""
    return GatedStore(host, port, timeout_s, key)
