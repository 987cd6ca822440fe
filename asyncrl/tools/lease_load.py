"""Simulated rollout replicas against a live controller: many held `AcquireLease` calls, heartbeats timed.

Each simulated replica registers, heartbeats every `heartbeat_interval_s` (reporting its leases), and loops:
AcquireLease (held server-side while the staleness bound says no), "generates" for `work_s`, CompleteLease;
with `leases_per_call` > 1, AcquireLeases and CompleteLeases for up to that many leases at a time, as the
real replicas do.
A simulated learner commits a new version every `push_every_s` (the controller's fan-out must be a fake
that acks at once: the replicas have no weights to receive), which admits one more batch. Used by
`bench/controller_leases.py` and the load test; everything runs on one asyncio loop in the caller's process.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import random
import time
from dataclasses import dataclass, field

import grpc

from asyncrl.core.wire.auth import METADATA_KEY, SCHEME, Auth
from asyncrl.core.wire.grpc_util import MESSAGE_OPTIONS
from asyncrl.core.wire.learner_secret import new_nonce, seat_proof
from asyncrl.rollout.registration_calls import RegisteredReplica
from asyncrl.v1 import controller_pb2 as pb
from asyncrl.v1 import controller_pb2_grpc, weights_pb2


@dataclass
class LoadResult:
    replicas: int
    seconds: float
    heartbeat_latencies_s: list[float] = field(default_factory=list)
    grant_latencies_s: list[float] = field(default_factory=list)
    """Time of AcquireLease(s) calls that were granted (including any hold)."""
    heartbeat_errors: int = 0
    heartbeats_by_replica: dict[str, int] = field(default_factory=dict)
    """Answered heartbeats of each replica (a replica starved behind held calls shows here, not in a total)."""
    grants: int = 0
    """Leases granted (several per call with `leases_per_call` > 1)."""
    granted_trajectories: int = 0
    refusals: int = 0
    acquire_errors: int = 0
    versions_committed: int = 0
    max_held: int = 0
    final_admitted: int = -1
    final_version: int = -1

    def percentile_ms(self, q: float, values: list[float] | None = None) -> float | None:
        values = sorted(self.heartbeat_latencies_s if values is None else values)
        return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 2) if values else None

    def summary(self) -> dict:
        return {
            "replicas": self.replicas, "seconds": round(self.seconds, 2),
            "heartbeats": len(self.heartbeat_latencies_s), "heartbeat_errors": self.heartbeat_errors,
            "fewest_heartbeats_of_a_replica": min(self.heartbeats_by_replica.values(), default=0),
            "heartbeat_p50_ms": self.percentile_ms(0.50), "heartbeat_p99_ms": self.percentile_ms(0.99),
            "grant_p50_ms": self.percentile_ms(0.50, self.grant_latencies_s),
            "grant_p99_ms": self.percentile_ms(0.99, self.grant_latencies_s),
            "grants": self.grants, "grants_per_s": round(self.grants / self.seconds, 1),
            "granted_trajectories": self.granted_trajectories, "refusals": self.refusals,
            "acquire_errors": self.acquire_errors, "versions_committed": self.versions_committed,
            "max_held": self.max_held, "final_admitted": self.final_admitted, "final_version": self.final_version,
        }  # fmt: skip


async def run_load(address: str, auth: Auth, *, replicas: int, seconds: float, group_size: int,
                   heartbeat_interval_s: float = 1.0, push_every_s: float | None = 1.0, work_s: float = 0.05,
                   wait_s: float = 5.0, acquire: bool = True, leases_per_call: int = 1,
                   learner_secret: bytes | None = None) -> LoadResult:  # fmt: skip
    """Drive `replicas` simulated replicas for `seconds`; returns what was measured. `acquire` False: the
    replicas only heartbeat (a baseline)."""
    metadata = () if auth.token is None else ((METADATA_KEY, SCHEME + auth.token),)
    result = LoadResult(replicas, seconds)
    async with grpc.aio.insecure_channel(address, options=MESSAGE_OPTIONS) as ch:
        stub = RegisteredReplica(_Stub(controller_pb2_grpc.ControllerStub(ch), metadata))
        ids = [(await stub.RegisterReplica(pb.RegisterReplicaRequest(
            address=f"127.0.0.1:{20000 + i}", replica_id=f"sim-{i}", weight_version=0, engine="sim"))).replica_id
            for i in range(replicas)]  # fmt: skip
        stop = asyncio.Event()
        started = time.monotonic()
        tasks = [asyncio.create_task(_replica(stub, rid, result, stop, group_size, heartbeat_interval_s, work_s,
                                              wait_s, acquire, leases_per_call)) for rid in ids]  # fmt: skip
        tasks.append(asyncio.create_task(_watch_held(stub, result, stop)))
        if push_every_s:
            tasks.append(asyncio.create_task(_learner(stub, result, stop, push_every_s, ids, learner_secret)))
        await asyncio.sleep(seconds)
        result.seconds = time.monotonic() - started
        stop.set()
        await asyncio.gather(*tasks)  # held calls still end their hold (up to wait_s)
        status = await stub.GetStatus(pb.GetStatusRequest())
        result.final_admitted, result.final_version = status.admitted, status.current_version
    return result


async def _replica(stub, rid: str, result: LoadResult, stop: asyncio.Event, group_size: int,
                   heartbeat_interval_s: float, work_s: float, wait_s: float, acquire: bool,
                   leases_per_call: int) -> None:  # fmt: skip
    held: set[str] = set()
    beat = asyncio.create_task(_heartbeats(stub, rid, result, stop, heartbeat_interval_s, held))
    await asyncio.sleep(random.random() * wait_s)  # replicas come up at different times, not all at once
    while acquire and not stop.is_set():
        t0 = time.perf_counter()
        try:
            lease_ids = await _acquire(stub, rid, group_size, wait_s, leases_per_call)
        except grpc.aio.AioRpcError:
            result.acquire_errors += 1
            await asyncio.sleep(0.1)
            continue
        if not lease_ids:
            result.refusals += 1
            continue
        result.grants += len(lease_ids)
        result.grant_latencies_s.append(time.perf_counter() - t0)
        result.granted_trajectories += group_size * len(lease_ids)
        held.update(lease_ids)
        await asyncio.sleep(work_s * (0.5 + random.random()))
        await _complete(stub, rid, lease_ids, group_size, leases_per_call)
        held.difference_update(lease_ids)
    await beat


async def _acquire(stub, rid: str, group_size: int, wait_s: float, leases_per_call: int) -> list[str]:
    """The ids of the leases granted (none: refused after the hold)."""
    if leases_per_call == 1:
        lease = await stub.AcquireLease(pb.AcquireLeaseRequest(
            replica_id=rid, num_trajectories=group_size, wait_s=wait_s), timeout=wait_s + 30)  # fmt: skip
        return [lease.lease_id] if lease.granted else []
    answer = await stub.AcquireLeases(pb.AcquireLeasesRequest(
        replica_id=rid, num_trajectories=group_size, wait_s=wait_s, max_leases=leases_per_call),
        timeout=wait_s + 30)  # fmt: skip
    return [lease.lease_id for lease in answer.leases]


async def _complete(stub, rid: str, lease_ids: list[str], group_size: int, leases_per_call: int) -> None:
    if leases_per_call == 1:
        await stub.CompleteLease(pb.CompleteLeaseRequest(replica_id=rid, lease_id=lease_ids[0],
                                                         num_written=group_size))  # fmt: skip
        return
    await stub.CompleteLeases(pb.CompleteLeasesRequest(replica_id=rid, completions=[
        pb.LeaseCompletion(lease_id=lease_id, num_written=group_size) for lease_id in lease_ids]))  # fmt: skip


async def _heartbeats(stub, rid: str, result: LoadResult, stop: asyncio.Event, interval_s: float,
                      held: set[str]) -> None:  # fmt: skip
    result.heartbeats_by_replica[rid] = 0
    await asyncio.sleep(random.random() * interval_s)  # spread the fleet's heartbeats over the interval
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            await stub.Heartbeat(pb.HeartbeatRequest(replica_id=rid, weight_version=0,
                                                     held_leases=pb.HeldLeases(lease_ids=sorted(held))),
                                 timeout=10)  # fmt: skip
            result.heartbeat_latencies_s.append(time.perf_counter() - t0)
            result.heartbeats_by_replica[rid] += 1
        except grpc.aio.AioRpcError:
            result.heartbeat_errors += 1
        try:
            await asyncio.wait_for(stop.wait(), interval_s)
        except TimeoutError:
            pass


async def _learner(stub, result: LoadResult, stop: asyncio.Event, every_s: float, ids: list[str],
                   learner_secret: bytes | None) -> None:  # fmt: skip
    spec = weights_pb2.TensorSpec(name="w", shape=[2, 2], dtype="float32")
    # Nothing answers liveness challenges at this address: a real learner can always take the seat back.
    address, issued, nonce = "127.0.0.1:1", int(time.time()), new_nonce()
    proof = seat_proof(learner_secret, address, issued, nonce) if learner_secret else b""
    key = (await stub.RegisterLearner(pb.RegisterLearnerRequest(address=address, proof_unix_s=issued,
                                                                proof_nonce=nonce, seat_proof=proof))).learner_key
    while True:
        try:
            await asyncio.wait_for(stop.wait(), every_s)
            return
        except TimeoutError:
            pass
        status = await stub.GetStatus(pb.GetStatusRequest())
        begun = await stub.BeginWeightPush(pb.BeginWeightPushRequest(
            version=status.current_version + 1, store_address="127.0.0.1:1", store_key=bytes(32), transport="gloo",
            bucket_bytes=1024, timeout_s=30, tensors=[spec], learner_key=key))  # fmt: skip
        commit = await stub.CommitWeightPush(pb.CommitWeightPushRequest(push_id=begun.plan.push_id, sender_ok=True,
                                                                        learner_key=key))
        result.versions_committed += bool(commit.committed)


async def _watch_held(stub, result: LoadResult, stop: asyncio.Event) -> None:
    while not stop.is_set():
        status = await stub.GetStatus(pb.GetStatusRequest())
        result.max_held = max(result.max_held, status.held_requests)
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
        except TimeoutError:
            pass


class _Stub:
    """The controller stub with the token's metadata on every call."""

    def __init__(self, stub, metadata: tuple):
        self._stub, self._metadata = stub, metadata

    def __getattr__(self, name: str):
        method = getattr(self._stub, name)
        return lambda request, **kw: method(request, metadata=self._metadata, **kw)


def _serve(raw_config: dict, ports, stop) -> None:
    """A controller process whose weight fan-out acks at once (simulated replicas hold no weights)."""
    from asyncrl.core.config.schema import AsyncRLConfig
    from asyncrl.push.session import ReceiverAnswer
    from asyncrl.services.controller_service import create_server

    # The simulated replicas lease at version 0 at once, as real ones do once the learner's first push
    # reached them: the load measures admission, not that push.
    controller = {**raw_config.get("controller", {}), "trust_initial_weights": True}
    server, port = create_server(AsyncRLConfig.model_validate({**raw_config, "controller": controller}),
                                 notify=lambda address, plan, rank, timeout_s, order=b"": ReceiverAnswer(plan.version),
                                 check_replicas=False)  # no server answers challenges for them
    server.start()
    ports.put(port)
    stop.wait()
    server.stop(0).wait()
    server.controller_state.close()


@contextlib.contextmanager
def controller_process(raw_config: dict):
    """A controller for simulated replicas in a process of its own (not sharing the load's interpreter);
    yields its gRPC port. The token comes from the environment, as for any service."""
    ctx = multiprocessing.get_context("spawn")
    ports, stop = ctx.Queue(), ctx.Event()
    process = ctx.Process(target=_serve, args=(raw_config, ports, stop), daemon=True)
    process.start()
    try:
        yield ports.get(timeout=120)
    finally:
        stop.set()
        process.join(30)
        if process.is_alive():
            process.kill()
