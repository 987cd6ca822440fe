"""Training under a flood from outside: the demo run calm, then again while a caller without the token sends
the controller and the replica 8 concurrent 200 MiB requests each, over and over, and calls 5,000 made-up
method names. Reported: the learner's steps per second from the flood's start (flood against calm, same sitting),
and the controller's and the replica's resident memory growth during the flood.

The flood comes from this machine's own cores (2 here), so the attacker's CPU is taken from the run too. A
third run floods a decoy server outside the run, with the same guard, in the same sitting: the flood at the run
against the decoy flood is what the services themselves pay for refusing it.

    .venv/bin/python bench/floods.py [--steps 300]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import psutil
from common import WITHOUT_TEACHER, emit
from demo_runs import DemoInBackground

from asyncrl.tools.processes import free_port

FLOOD_CALLS, FLOOD_BYTES, MADE_UP_METHODS = 8, 200 << 20, 5000
TARGETS = {"controller": "/asyncrl.v1.Controller/Heartbeat", "rollout": "/asyncrl.v1.Rollout/Generate"}


def services(run_dir: Path) -> dict[str, psutil.Process]:
    """The run's controller and replica processes, found by their command lines."""
    found = {}
    for proc in psutil.process_iter(["cmdline"]):
        line = " ".join(proc.info["cmdline"] or [])
        if str(run_dir) in line:
            for role in TARGETS:
                if f" {role} " in f" {line} " and role not in found:
                    found[role] = proc
    return found


def flood(ports: dict[str, int], stop: threading.Event, counts: dict[str, int]) -> None:
    """Until `stop`: 8 concurrent 200 MiB calls to each service, again and again; made-up names in between."""
    payload = b"x" * FLOOD_BYTES
    options = [("grpc.max_send_message_length", 2 * FLOOD_BYTES)]

    def hammer(role: str):
        with grpc.insecure_channel(f"127.0.0.1:{ports[role]}", options=options) as channel:
            call = channel.unary_unary(TARGETS[role])
            while not stop.is_set():
                try:
                    call(payload, timeout=30)
                except grpc.RpcError:
                    counts[role] += 1

    def made_up():
        with grpc.insecure_channel(f"127.0.0.1:{ports['controller']}") as channel:
            for i in range(MADE_UP_METHODS):
                if stop.is_set():
                    return
                try:
                    channel.unary_unary(f"/asyncrl.v1.Controller/NoSuch{i}")(b"", timeout=10)
                except grpc.RpcError:
                    counts["made_up"] += 1

    threads = [threading.Thread(target=hammer, args=(role,), daemon=True) for role in TARGETS
               for _ in range(FLOOD_CALLS)] + [threading.Thread(target=made_up, daemon=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


DECOY = """
import sys, time
from asyncrl.core.wire.auth import Auth
from asyncrl.core.wire.grpc_util import build_server
server, port, _ = build_server("127.0.0.1", 0, [], ["asyncrl.v1.Controller", "asyncrl.v1.Rollout"], Auth("decoy"))
server.start()
print(port, flush=True)
time.sleep(3600)
"""
"""A server outside the run with the same guard: the flood aimed at it costs the run only the attacker's and
the refusals' CPU, the baseline that separates what the services themselves pay."""


def run(mode: str, steps: int) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix=f"floods-{mode}-"))
    ports = {"controller": free_port("127.0.0.1"), "rollout": free_port("127.0.0.1")}
    decoy = None
    targets = ports
    if mode == "decoy":
        decoy = subprocess.Popen([sys.executable, "-c", DECOY], stdout=subprocess.PIPE, text=True)
        decoy_port = int(decoy.stdout.readline())
        targets = {"controller": decoy_port, "rollout": decoy_port}
    overrides = [*WITHOUT_TEACHER, f"learner.total_steps={steps}", "learner.eval_every=0",
                 f"controller.port={ports['controller']}", f"rollout.port={ports['rollout']}", "rollout.replicas=1"]
    demo = DemoInBackground(run_dir, overrides)
    found: dict[str, psutil.Process] = {}
    while len(found) < len(TARGETS) and not demo.done.is_set():
        found = services(run_dir)
        time.sleep(0.2)
    memory = {role: [] for role in found}
    baseline = {}
    stop, counts = threading.Event(), {"controller": 0, "rollout": 0, "made_up": 0}
    flooder = None
    flood_started = None
    while not demo.done.is_set():
        events = run_dir / "events" / "learner.jsonl"
        step_lines = events.read_text().count('"kind":"step"') if events.exists() else 0
        for role, proc in found.items():
            try:
                memory[role].append(proc.memory_info().rss >> 20)
            except psutil.Error:
                pass
        if flood_started is None and step_lines >= 5:
            baseline = {role: statistics.median(values[-5:]) for role, values in memory.items() if values}
            flood_started = time.time()
            if mode != "calm":
                flooder = threading.Thread(target=flood, args=(targets, stop, counts), daemon=True)
                flooder.start()
        time.sleep(0.25)
    stop.set()
    if flooder is not None:
        flooder.join(60)
    if decoy is not None:
        decoy.kill()
        decoy.wait()
    steps_t = [e["t"] for e in demo.events() if e["kind"] == "step"]
    measured = [t for t in steps_t if flood_started is not None and t >= flood_started]
    rate = (len(measured) - 1) / (measured[-1] - measured[0]) if len(measured) > 1 else 0.0
    return {"steps_per_s": round(rate, 3), "steps_measured": len(measured),
            "rss_growth_mb": {role: max(values) - baseline.get(role, values[0]) for role, values in memory.items()
                              if values},
            "refused_calls": counts if mode != "calm" else {}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    calm = run("calm", args.steps)
    decoy = run("decoy", args.steps)
    flooded = run("flood", args.steps)
    result = {"calm": calm, "decoy": decoy, "flood": flooded,
              "rate_under_flood": round(flooded["steps_per_s"] / calm["steps_per_s"], 3),
              "rate_under_flood_vs_decoy": round(flooded["steps_per_s"] / decoy["steps_per_s"], 3),
              "targets": {"rate_under_flood": ">= 0.8", "rss_growth_mb": "<= 64"}}
    print(json.dumps(result), file=sys.stderr)
    emit("floods", result, {"calm steps/s": calm["steps_per_s"], "decoy flood steps/s": decoy["steps_per_s"],
                            "flood steps/s": flooded["steps_per_s"],
                            **{f"{role} +MB": mb for role, mb in flooded["rss_growth_mb"].items()}},
         "steps/s, MB", "The demo's learner under a flood without the token (8 x 200 MiB calls at a time to the "
         "controller and the replica, 5,000 made-up methods), against calm, same sitting")


if __name__ == "__main__":
    main()
