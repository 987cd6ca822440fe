"""The push's side of an engine's receive (`asyncrl.core.wire.push_contract.WeightSource`): what a replica hands
its engine when it builds it. The engine asks for one push's bytes; this joins the broadcast group it keeps
between pushes and delivers them bucket by bucket, or whole into bucket-shaped storage the engine adopts as
its parameters (live and spare storage alternate, so a push allocates nothing after the first).

vLLM receives in its own worker processes: `vllm_worker_extension` names the class it mixes into them
(`asyncrl.push.vllm_worker`), and `worker_args` is the plan as that class takes it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from asyncrl.push.broadcast import BroadcastGroup
from asyncrl.push.deltas import NO_BASE, Base, BaseMissing
from asyncrl.push.flat import FlatWeights
from asyncrl.push.groups import BroadcastGroups
from asyncrl.push.plan import PushPlan
from asyncrl.push.transfer import KeptWeights, receive_weights
from asyncrl.push.vllm_worker import WORKER_EXTENSION, plan_to_dict


class BroadcastStream:
    """One push as it arrives at this rank (`push_contract.WeightStream`)."""

    def __init__(self, group: BroadcastGroup, plan: PushPlan, storage: _Storage, groups: BroadcastGroups,
                 rank: int):  # fmt: skip
        self._group, self._plan, self._storage = group, plan, storage
        self._groups, self._rank = groups, rank
        self.device: torch.device = group.device

    def buckets(self) -> Iterator[list[tuple[str, torch.Tensor]]]:
        # Deltas apply to what the last push left: it is kept there, changed in place by this one.
        return self._storage.kept.receive(self._group, self._plan)

    def whole(self) -> dict[str, torch.Tensor]:
        spare = self._storage.spare(self._plan, self.device)
        for _ in receive_weights(self._group, self._plan, into=spare, base=self._storage.live_base()):
            pass
        return spare.views

    def adopted(self) -> None:
        self._storage.swap(self._plan.version)

    def sent_checksum(self) -> str:
        return self._groups.sent_checksum(self._plan, self._rank)

    def drain(self) -> None:
        with contextlib.suppress(BaseMissing):  # a delta dropped unapplied is what a drain does
            for _ in receive_weights(self._group, self._plan):
                pass


class _Storage:
    """The double buffer of the zero-copy path: the engine's parameters are views into `live` after its first
    whole push; the next one lands in `spare`, then the two swap roles. A delta push read bucket by bucket
    applies to `kept`, what the last one left."""

    def __init__(self) -> None:
        self.live: FlatWeights | None = None
        self._live_version = NO_BASE
        self._spare: FlatWeights | None = None
        self.kept = KeptWeights()

    def spare(self, plan: PushPlan, device: torch.device) -> FlatWeights:
        """Storage with the plan's layout that nothing reads (allocated on first use and when the layout
        changes)."""
        if self._spare is None or not self._spare.matches(plan.tensors, plan.bucket_bytes):
            self._spare = FlatWeights(plan.tensors, plan.bucket_bytes, device)
        return self._spare

    def live_base(self) -> Base | None:
        return None if self.live is None else Base(self.live, self._live_version)

    def swap(self, version: int) -> None:
        self.live, self._spare = self._spare, self.live
        self._live_version = version


class BroadcastReceiving:
    """Receives pushes over the broadcast group kept while the membership holds (`push_contract.WeightSource`)."""

    vllm_worker_extension = WORKER_EXTENSION

    def __init__(self) -> None:
        self.groups = BroadcastGroups()
        """The group kept between pushes (`formed` counts the groups this receiver formed)."""
        self._storage = _Storage()

    @contextlib.contextmanager
    def open(self, plan: PushPlan, rank: int) -> Iterator[BroadcastStream]:
        with self.groups.member(plan, rank) as group:
            yield BroadcastStream(group, plan, self._storage, self.groups, rank)

    def worker_args(self, plan: PushPlan) -> dict:
        return plan_to_dict(plan)

    def close(self) -> None:
        self.groups.close()
