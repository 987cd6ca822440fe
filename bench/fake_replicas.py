"""Training while a token holder runs fake replicas: the demo run calm, then again while K fakes (no engine behind
them) register claiming the current version, answer the controller's challenges under their keys, never join a
push, heartbeat claiming the current version with the leases they hold, and ask for 16 leases every 0.3 s.
Reported: the learner's steps per second from the attack's start against calm (same sitting), the leases the
fakes were granted, and the pushes that named a fake as a receiver.

A replica earns its leases by acknowledging a push (`controller/registry.py`), so the fakes get none; what
is left is the pushes they are put in (each waits out the join time-out, and then holds them back, doubling:
a cost that grows with the log of the run's length) and the attacker's CPU, taken from this machine's cores.

    .venv/bin/python bench/fake_replicas.py [--steps 6000] [--fakes 8]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
from common import WITHOUT_TEACHER, emit
from demo_runs import DemoInBackground

from asyncrl.core.runtime.events import read_events
from asyncrl.core.wire.auth import Auth, liveness_mac
from asyncrl.core.wire.grpc_util import build_server, channel
from asyncrl.rollout.registration_calls import RegisteredReplica
from asyncrl.tools.processes import free_port
from asyncrl.v1 import controller_pb2 as pb
from asyncrl.v1 import controller_pb2_grpc, rollout_pb2, rollout_pb2_grpc

ATTACK_AFTER_STEPS = 5


class FakeRollout(rollout_pb2_grpc.RolloutServicer):
    """Answers challenges under its registration's key; an UpdateWeights call hangs until the attack ends."""

    def __init__(self, stop: threading.Event):
        self.key, self.stop = b"", stop

    def GetStatus(self, request, context):
        return rollout_pb2.RolloutStatus(replica_id="fake", challenge_mac=liveness_mac(self.key, request.challenge))

    def UpdateWeights(self, request, context):
        self.stop.wait(120)
        context.abort(grpc.StatusCode.UNAVAILABLE, "never answered")


def fake(stub, auth: Auth, stop: threading.Event, tally: dict, ids: list) -> None:
    servicer = FakeRollout(stop)
    add = functools.partial(rollout_pb2_grpc.add_RolloutServicer_to_server, servicer)
    server, port, _ = build_server("127.0.0.1", 0, [add], ["asyncrl.v1.Rollout"], auth)
    server.start()
    held: list[str] = []
    try:
        version = stub.GetStatus(pb.GetStatusRequest(), timeout=10).current_version
        reply = stub.RegisterReplica(pb.RegisterReplicaRequest(
            address=f"127.0.0.1:{port}", weight_version=version, engine="torch"), timeout=10)
        servicer.key = reply.push_key
        ids.append(reply.replica_id)
        while not stop.wait(0.3):
            version = stub.GetStatus(pb.GetStatusRequest(), timeout=10).current_version
            stub.Heartbeat(pb.HeartbeatRequest(replica_id=reply.replica_id, weight_version=version,
                                               held_leases=pb.HeldLeases(lease_ids=held)), timeout=10)
            got = stub.AcquireLeases(pb.AcquireLeasesRequest(replica_id=reply.replica_id, num_trajectories=8,
                                                             max_leases=16, wait_s=0), timeout=10)
            held += [lease.lease_id for lease in got.leases]
            tally["granted"] += len(got.leases)
            tally["asked"] += 1
    except grpc.RpcError as err:  # the run ended under it
        if err.code() != grpc.StatusCode.UNAVAILABLE:
            tally["errors"].append(f"{err.code().name}: {err.details()}"[:200])
    finally:
        server.stop(0)


def run(fakes: int, steps: int) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix=f"fakes-{fakes}-"))
    port = free_port("127.0.0.1")
    overrides = [*WITHOUT_TEACHER, f"learner.total_steps={steps}", "learner.eval_every=0",
                 f"controller.port={port}"]
    demo = DemoInBackground(run_dir, overrides)
    stop, tally, ids = threading.Event(), {"granted": 0, "asked": 0, "errors": []}, []
    attackers: list[threading.Thread] = []
    started = None
    while not demo.done.is_set() and started is None:
        events = run_dir / "events" / "learner.jsonl"
        if events.exists() and events.read_text().count('"kind":"step"') >= ATTACK_AFTER_STEPS:
            started = time.time()
            if fakes:
                auth = Auth((run_dir / "token").read_text().strip())
                ch = channel(f"127.0.0.1:{port}", auth)
                stub = RegisteredReplica(controller_pb2_grpc.ControllerStub(ch))
                attackers = [threading.Thread(target=fake, args=(stub, auth, stop, tally, ids), daemon=True)
                             for _ in range(fakes)]
                for attacker in attackers:
                    attacker.start()
        time.sleep(0.1)
    demo.done.wait()
    stop.set()
    for attacker in attackers:
        attacker.join(30)
    steps_t = [e["t"] for e in demo.events() if e["kind"] == "step"]
    measured = [t for t in steps_t if started is not None and t >= started]
    rate = (len(measured) - 1) / (measured[-1] - measured[0]) if len(measured) > 1 else 0.0
    begun = [e for e in read_events(run_dir, "controller") if e["kind"] == "push_begun" and e["receivers"]]
    with_fake = [e for e in begun if set(ids) & set(e["receivers"])]
    return {"steps_per_s": round(rate, 3), "steps_measured": len(measured), "fakes_registered": len(ids),
            "leases_asked": tally["asked"], "leases_granted_to_fakes": tally["granted"],
            "pushes": len(begun), "pushes_with_a_fake": len(with_fake), "errors": tally["errors"][:3]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument("--fakes", type=int, default=8)
    args = parser.parse_args()
    calm = run(0, args.steps)
    attacked = run(args.fakes, args.steps)
    ratio = round(attacked["steps_per_s"] / calm["steps_per_s"], 3)
    result = {"calm": calm, "fakes": attacked, "fake_count": args.fakes, "rate_with_fakes": ratio,
              "targets": {"rate_with_fakes": ">= 0.8", "leases_granted_to_fakes": "0"}}
    print(json.dumps(result), file=sys.stderr)
    emit("fake_replicas", result, {"calm steps/s": calm["steps_per_s"],
                                   f"{args.fakes} fakes steps/s": attacked["steps_per_s"]},
         "steps/s", f"The demo's learner while a token holder runs {args.fakes} fake replicas that claim the "
         "current version and ask for leases, against calm, same sitting")


if __name__ == "__main__":
    main()
