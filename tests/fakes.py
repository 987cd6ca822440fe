"""Test doubles for the controller's seams: a settable clock and an in-process weight notifier, so unit and
integration tests build a `ControllerState` without a network."""

from __future__ import annotations

import asyncio
import threading

from asyncrl.controller.held_request import hold
from asyncrl.controller.results import LeaseDecision
from asyncrl.controller.state import ControllerState
from asyncrl.core.config.schema import ControllerConfig
from asyncrl.core.runtime.events import MemoryEvents
from asyncrl.core.wire.grpc_aio import Wakeup
from asyncrl.core.wire.push_contract import TensorMeta
from asyncrl.push.plan import PushOffer, PushPlan
from asyncrl.push.session import ReceiverAnswer, ReceiverUnreachable
from tests.conftest import TEST_STORE_KEY


class FakeClock:
    """A monotonic clock that only moves when told to."""

    def __init__(self, start: float = 1000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeNotifier:
    """Acks every push immediately with the plan's version, except for addresses told to fail (raise at
    once) or to hang (block until `release` is set, then raise: a receiver that never answers in time).

    Addresses in `gone` raise like a replica whose process is gone (`ReceiverUnreachable`).
    Records every call as (address, push_id, version, rank, world_size).
    """

    def __init__(self):
        self.calls: list[tuple[str, str, int, int, int]] = []
        self.orders: dict[tuple[str, str], bytes] = {}
        """(address, push_id) -> the order signature the controller sent."""
        self.failing: set[str] = set()
        self.hanging: set[str] = set()
        self.gone: set[str] = set()
        self.adapter_checksums: dict[str, str] = {}
        """Addresses that answer with the checksum of the adapter they serve (LoRA pushes)."""
        self.release = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, address: str, plan: PushPlan, rank: int, timeout_s: float, order_mac: bytes = b"") -> ReceiverAnswer:
        with self._lock:
            self.calls.append((address, plan.push_id, plan.version, rank, plan.world_size))
            self.orders[(address, plan.push_id)] = order_mac
        if address in self.hanging:
            self.release.wait(timeout_s)
            raise TimeoutError(f"{address} did not answer")
        if address in self.failing:
            raise RuntimeError(f"{address} failed to load the weights")
        if address in self.gone:
            raise ReceiverUnreachable(f"{address}: UNAVAILABLE: connection refused")
        return ReceiverAnswer(plan.version, self.adapter_checksums.get(address, ""))


def make_state(
    *, batch_size: int = 8, eta: int | None = 0, clock: FakeClock | None = None, store=None, run_id: str = "run",
    **controller_fields,
) -> tuple[ControllerState, FakeClock, FakeNotifier, MemoryEvents]:
    """A ControllerState with a fake clock, a fake notifier and in-memory events (no reaper thread); `store`:
    where its state is saved (none by default)."""
    clock = clock or FakeClock()
    notifier, events = FakeNotifier(), MemoryEvents()
    # Replicas registered at version 0 lease at once unless a test says otherwise: most tests here are about
    # admission, pushes and liveness, not about how a replica earns its leases (test_controller_registry).
    controller_fields.setdefault("trust_initial_weights", True)
    config = ControllerConfig(eta=eta, **controller_fields)
    state = ControllerState(config, batch_size, events=events, notify=notifier, clock=clock, store=store,
                            run_id=run_id)
    return state, clock, notifier, events


TINY_TENSORS = (TensorMeta("w", (2, 2), "float32"),)
"""A one-tensor plan for pushes whose data plane a test does not exercise."""


def begin(state: ControllerState, version: int, timeout_s: float = 5.0):
    """A push of `version` opened on `state` as a learner's BeginWeightPush opens it (gloo, `TINY_TENSORS`)."""
    return state.begin_push(version, PushOffer(store_address="127.0.0.1:29500", store_key=TEST_STORE_KEY,
                                               transport="gloo", tensors=TINY_TENSORS, bucket_bytes=1 << 20,
                                               timeout_s=timeout_s))


def acquire(state: ControllerState, replica_id: str, num_trajectories: int, wait_s: float) -> LeaseDecision:
    """One lease request held the way the gRPC edge holds it (`controller.held_request.hold`, woken through
    `Admission.add_waker`), on an event loop of this thread's own."""
    admission = state.admission

    async def held() -> LeaseDecision:
        wakeup = Wakeup(asyncio.get_running_loop())
        admission.add_waker(wakeup.notify)
        try:
            return await hold(admission, wakeup, wait_s, lambda started, final, first: admission.try_acquire(
                replica_id, num_trajectories, started, final, first))
        finally:
            admission.remove_waker(wakeup.notify)

    return asyncio.run(held())
