"""The controller under a fleet of simulated replicas: heartbeat latency while most requests are held, and
lease throughput without a bound, one run.

Scenarios (the controller in a process of its own, `asyncrl.tools.lease_load`):
- baseline: 1000 replicas that only heartbeat (no lease traffic);
- held: the same 1000 replicas asking for leases under η = 2 with B = 64 (one batch per version, most held),
  a simulated learner committing a version every second (a push to all 1000);
- unbounded: 64 replicas under η = unbounded, generating for ~2 ms per lease (grants/s, grant latency);
- unbounded, batched: the same with 4 leases per AcquireLeases / CompleteLeases call, the way the real
  replicas ask (up to `rollout.leases_per_batch` per call, 8 by default), generating for ~2 ms per batch:
  leases granted per second against one lease per call.
Reports heartbeat p50/p99 of each, the held/baseline p99 ratio, grants/s, and whether the controller's
admitted count equals the trajectories the replicas were granted (the admission count is exact).

    .venv/bin/python bench/controller_leases.py [--replicas 1000] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile

from common import emit

from asyncrl.core.wire.auth import Auth, new_token
from asyncrl.tools.lease_load import controller_process, run_load


def scenario(replicas: int, eta, seconds: float, run_dir: str, **load) -> dict:
    raw = {"run_dir": run_dir, "learner": {"batch_size": 64}, "sampling": {"group_size": 8},
           "controller": {"port": 0, "status_port": 0, "eta": eta, "state_store": "none", "max_replicas": 4096,
                          "max_replicas_per_host": 0}}  # every simulated replica calls from this host
    with controller_process(raw) as port:
        result = asyncio.run(run_load(f"127.0.0.1:{port}", Auth(os.environ["ASYNCRL_TOKEN"]), replicas=replicas,
                                      seconds=seconds, group_size=8,
                                      learner_secret=os.environ["ASYNCRL_LEARNER_SECRET"].encode(), **load))
    summary = result.summary()
    summary["admission_exact"] = result.final_admitted == result.granted_trajectories
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    os.environ.setdefault("ASYNCRL_TOKEN", new_token())
    os.environ.setdefault("ASYNCRL_LEARNER_SECRET", new_token())
    with tempfile.TemporaryDirectory() as tmp:
        baseline = scenario(args.replicas, 2, args.seconds, f"{tmp}/a", acquire=False, push_every_s=None)
        held = scenario(args.replicas, 2, args.seconds, f"{tmp}/b", push_every_s=1.0)
        unbounded = scenario(64, None, args.seconds / 2, f"{tmp}/c", push_every_s=1.0, work_s=0.002)
        batched = scenario(64, None, args.seconds / 2, f"{tmp}/d", push_every_s=1.0, work_s=0.002, leases_per_call=4)
    result = {
        "machine": f"{os.cpu_count()} CPU cores, controller and load in separate processes",
        "baseline_heartbeat_only": baseline, "held": held, "unbounded_64": unbounded,
        "unbounded_64_batched_4": batched,
        "held_over_baseline_p99": round(held["heartbeat_p99_ms"] / max(baseline["heartbeat_p99_ms"], 1e-9), 2),
        "batched_over_single_grants_per_s": round(batched["grants_per_s"] / max(unbounded["grants_per_s"], 1e-9), 2),
    }
    emit("controller_leases", result,
         {"p99 baseline": baseline["heartbeat_p99_ms"], f"p99 {args.replicas} held": held["heartbeat_p99_ms"],
          "p99 64 unbounded": unbounded["heartbeat_p99_ms"]},
         "heartbeat latency p99 (ms)", f"controller: {args.replicas} simulated replicas, η = 2 (held) vs heartbeats only")


if __name__ == "__main__":
    main()
