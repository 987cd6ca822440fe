"""What one weight push costs beyond moving its bytes: the production path end to end, in real processes.

A controller process (gRPC, as `asyncrl controller` builds it), `--replicas` replica processes (Rollout gRPC
service around a torch engine on the demo model, registered with the controller, heartbeating) and the
learner side in this process (`WeightPublisher`: BeginWeightPush, broadcast as rank 0, CommitWeightPush).

Measured, each a median over `--pushes` pushes of each kind (in blocks of 5, at least one block):
  push_s         : one push of the demo model (2 MB) with unchanged membership, start to committed, ordered
                   in-band (the default: the replicas follow their group, `push.in_band`) from the plan the
                   previous commit reserved (no Begin);
  controller_ordered_push_s : the same with `weight_transport.in_band: false` (a Begin, and the controller
                   calls UpdateWeights on every replica); the two kinds in alternating blocks of 5;
  raw_s          : a bare gloo broadcast of the same bytes from this process to the same number of receiver
                   processes, plus an all-reduce so it covers receipt (the floor for moving these bytes);
  fixed_cost_s   : push_s - raw_s (target <= 5 ms);
  first_push_s   : the first push, which forms the broadcast group;
  rebuild_push_s : the push right after one more replica joined (membership changed: one rebuild);
  phases_s       : for each kind, the medians of where a push's time went (Begin, join and broadcast, in-band
                   acks, Commit, the rest), as the publisher times them.
The ratio lines are raw_s / push_s and controller_ordered_push_s / push_s.

    .venv/bin/python bench/push_fixed_cost.py [--replicas 2] [--pushes 40]
    (or: asyncrl bench push_fixed_cost)
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from common import emit

REPO = Path(__file__).resolve().parents[1]
BLOCK = 5
"""Pushes of one kind in a row (after one more that is not counted)."""


def demo_config(run_dir: str):
    from asyncrl.core.config.file import load_config
    from asyncrl.tools.models_ready import ensure_models

    cfg = load_config(REPO / "examples" / "tiny-arith.yaml", [f"run_dir={run_dir}", "controller.port=0",
                                                               "rollout.port=0", "controller.host=127.0.0.1"])
    cfg.model.path = str(REPO / cfg.model.path)
    cfg.teacher.model_path = str(REPO / cfg.teacher.model_path)
    ensure_models(cfg)
    return cfg


def controller_process(cfg, ports, stop) -> None:
    from asyncrl.services import controller_service

    server, port = controller_service.create_server(cfg, run_dir=cfg.run_dir)
    server.start()
    ports.put(port)
    stop.wait()
    server.stop(0)


def replica_process(cfg, controller_address: str, ready, stop) -> None:
    from asyncrl.core.engines.factory import make_engine
    from asyncrl.core.wire.auth import resolve_auth
    from asyncrl.core.wire.grpc_util import wait_for_channel
    from asyncrl.push.receiving import BroadcastReceiving
    from asyncrl.rollout.registration_calls import RegisteredReplica
    from asyncrl.rollout.replica import ReplicaSession
    from asyncrl.services import rollout_service
    from asyncrl.v1 import controller_pb2_grpc

    torch.set_num_threads(1)
    engine = make_engine(cfg.rollout.engine, cfg.model.path, cfg.model.dtype, seed=0, weights=BroadcastReceiving())
    stub = RegisteredReplica(controller_pb2_grpc.ControllerStub(
        wait_for_channel(controller_address, 60, resolve_auth(cfg.security))))  # its calls prove its registration
    holder: list[ReplicaSession] = []
    server, port = rollout_service.create_server(cfg, engine, push_key=lambda: holder[0].push_key if holder else b"")
    server.start()
    session = ReplicaSession(stub, f"127.0.0.1:{port}", engine, "torch", in_band_pushes=True)
    holder.append(session)
    session.register()
    stop_event = threading.Event()
    threading.Thread(target=session.heartbeat_forever, args=(stop_event,), daemon=True).start()
    ready.put(session.replica_id)
    stop.wait()
    stop_event.set()
    server.stop(0)


def raw_receiver(store_port: int, store_key: bytes, rank: int, world: int, numel: int, trials: int) -> None:
    from asyncrl.push.broadcast import make_group
    from asyncrl.push.plan import PushPlan

    plan = PushPlan(push_id="raw", version=0, store_address=f"127.0.0.1:{store_port}", store_key=store_key, world_size=world, transport="gloo", tensors=(), bucket_bytes=0, timeout_s=60)
    group = make_group(plan, rank)
    flat, flag = torch.empty(numel), torch.ones(1)
    for _ in range(trials):
        group.broadcast(flat)
        group._pg.allreduce([flag]).wait()


def raw_broadcast_s(numel: int, receivers: int, trials: int) -> float:
    from asyncrl.push.broadcast import host_store, make_group
    from asyncrl.push.plan import PushPlan

    store = host_store("127.0.0.1", 0, 60)
    world = receivers + 1
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=raw_receiver, args=(store.port, store.key, r, world, numel, trials)) for r in range(1, world)]
    for p in procs:
        p.start()
    group = make_group(PushPlan(push_id="raw", version=0, store_address=f"127.0.0.1:{store.port}", store_key=store.key, world_size=world, transport="gloo", tensors=(), bucket_bytes=0, timeout_s=60), 0, store)
    flat, flag, times = torch.randn(numel), torch.ones(1), []
    for _ in range(trials):
        t0 = time.perf_counter()
        group.broadcast(flat)
        group._pg.allreduce([flag]).wait()
        times.append(time.perf_counter() - t0)
    for p in procs:
        p.join(30)
    return statistics.median(times[1:])


@contextlib.contextmanager
def push_system(cfg, replicas: int) -> Iterator[tuple[object, Callable[[], None]]]:
    """The production push path around this process: a local redis, a controller process and `replicas`
    replica processes (torch engines, registered, heartbeating). Yields the controller stub, seated as the
    run's learner (this process plays it), and a function that starts one more replica; stops everything on
    exit."""
    from asyncrl.core.wire.auth import new_token, resolve_auth
    from asyncrl.core.wire.grpc_util import wait_for_channel
    from asyncrl.learner.seat import SeatedController
    from asyncrl.tools.processes import ProcessGroup
    from asyncrl.tools.redis_local import start_local_redis
    from asyncrl.v1 import controller_pb2, controller_pb2_grpc

    # Every service requires a token; the processes spawned below inherit this one.
    os.environ.setdefault("ASYNCRL_TOKEN", new_token())
    os.environ.setdefault("ASYNCRL_LEARNER_SECRET", new_token())
    ctx = mp.get_context("spawn")
    redis_procs = ProcessGroup(Path(cfg.run_dir) / "logs")
    stop, procs, ports, ready = ctx.Event(), [], ctx.Queue(), ctx.Queue()
    try:
        cfg.buffer.redis_url = start_local_redis(redis_procs, Path(cfg.run_dir) / "redis")
        procs.append(ctx.Process(target=controller_process, args=(cfg, ports, stop)))
        procs[0].start()
        address = f"127.0.0.1:{ports.get(timeout=60)}"
        raw_stub = controller_pb2_grpc.ControllerStub(wait_for_channel(address, 60, resolve_auth(cfg.security)))

        def add_replica() -> None:
            """One more replica, returning once the controller will push to it: registered, and proven
            reachable by the controller's challenge (until then a replica joins no push)."""
            proc = ctx.Process(target=replica_process, args=(cfg, address, ready, stop))
            proc.start()
            procs.append(proc)
            replica_id = ready.get(timeout=120)
            deadline = time.monotonic() + 60
            while not any(r.replica_id == replica_id and r.reachable
                          for r in raw_stub.GetStatus(controller_pb2.GetStatusRequest(), timeout=10).replicas):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{replica_id} was not proven reachable within 60 s")
                time.sleep(0.05)

        for _ in range(replicas):
            add_replica()
        stub = SeatedController(raw_stub, os.environ["ASYNCRL_LEARNER_SECRET"].encode())
        # No status service to challenge here, and nothing else claims the seat: no patience needed.
        stub.take_seat("127.0.0.1:1", patience_s=0.0)
        yield stub, add_replica
    finally:
        stop.set()
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
        redis_procs.stop_all()


def measure(cfg, args, stub, add_replica):
    """Time the pushes: steady ones, the first, the one after a replica joined."""
    from asyncrl.core.model.modeling import load_causal_lm
    from asyncrl.push.sender import WeightPublisher

    model = load_causal_lm(cfg.model.path)
    transport = cfg.learner.weight_transport
    publisher = WeightPublisher(stub, model, transport, cfg.controller.push_timeout_s)
    version = 0

    def push(receivers: int, new_group: bool, in_band: bool = True):
        """One push (its `PushResult`); checks it went to every replica, forming a group or not as the
        membership says, in-band when offered on a kept group."""
        nonlocal version
        version += 1
        transport.in_band = in_band  # the publisher reads it at every push
        result = publisher.push(version)
        assert result.committed and len(result.acked) == result.receivers == receivers, result
        assert result.new_group == new_group, result
        return result

    def block(**kind):
        """BLOCK pushes of one kind after one more that is left out (the one after a switch: the first in-band
        push after a controller-ordered one has no reservation yet, the first ordered one still has one)."""
        pushes = [push(args.replicas, new_group=False, **kind) for _ in range(BLOCK + 1)][1:]
        assert all(p.in_band == kind.get("in_band", True) for p in pushes), pushes
        return pushes

    first = push(args.replicas, new_group=True).total_s
    steady, ordered = [], []
    # Alternating blocks, so that every kind sees the same machine.
    for _ in range(max(1, args.pushes // BLOCK)):
        steady += block()
        ordered += block(in_band=False)
    add_replica()
    rebuild = push(args.replicas + 1, new_group=True).total_s
    after = [push(args.replicas + 1, new_group=False).total_s for _ in range(5)]
    publisher.close()
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return first, steady, ordered, rebuild, after, nbytes


def phases(pushes) -> dict[str, float]:
    """Medians of where a push's time went, as the publisher measures it (`PushResult`): Begin's round trip,
    the join handshake and broadcast, waiting for in-band acks, Commit's round trip, and what is left."""
    parts = {"begin": [p.begin_s for p in pushes], "join_and_broadcast": [p.broadcast_s for p in pushes],
             "acks": [p.acks_s for p in pushes], "commit": [p.commit_s for p in pushes],
             "other": [p.total_s - p.begin_s - p.broadcast_s - p.acks_s - p.commit_s for p in pushes]}
    return {name: round(statistics.median(values), 5) for name, values in parts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--pushes", type=int, default=40)
    args = parser.parse_args()

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as run_dir:
        cfg = demo_config(run_dir)
        with push_system(cfg, args.replicas) as (stub, add_replica):
            first, steady_pushes, ordered_pushes, rebuild, after, nbytes = measure(
                cfg, args, stub, add_replica)
    raw = raw_broadcast_s(nbytes // 4, args.replicas, args.pushes)
    steady, ordered = [p.total_s for p in steady_pushes], [p.total_s for p in ordered_pushes]
    push_s, ordered_s = statistics.median(steady), statistics.median(ordered)
    result = {
        "model_bytes": nbytes, "replicas": args.replicas, "pushes": args.pushes,
        "push_s": round(push_s, 5), "push_p90_s": round(statistics.quantiles(steady, n=10)[-1], 5),
        "raw_s": round(raw, 5), "fixed_cost_s": round(push_s - raw, 5),
        "controller_ordered_push_s": round(ordered_s, 5), "controller_ordered_fixed_cost_s": round(ordered_s - raw, 5),
        "controller_ordered_over_in_band": round(ordered_s / push_s, 3),
        "first_push_s": round(first, 5), "rebuild_push_s": round(rebuild, 5),
        "push_after_rebuild_s": round(statistics.median(after), 5),
        "raw_over_push": round(raw / push_s, 3), "target_fixed_cost_s": 0.005,
        "phases_s": {"in_band": phases(steady_pushes), "controller_ordered": phases(ordered_pushes)},
    }
    emit("push_fixed_cost", result, {"raw broadcast": raw, "push (same members, in-band)": push_s,
                                     "push (same members, controller-ordered)": ordered_s, "first push": first,
                                     "push after a join": rebuild},
         "seconds", f"Weight push of the demo model ({nbytes / 2**20:.1f} MiB) to {args.replicas} replicas")


if __name__ == "__main__":
    main()
