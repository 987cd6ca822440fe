"""The demo with every service on a host of its own, over shaped links, against the same run on one machine's
loopback (`asyncrl up`), measured in one sitting (root: network namespaces, `asyncrl.tools.lab_run`).

Arms, each `--steps` learner steps of examples/tiny-arith.yaml with three replicas:
  loopback      : `asyncrl up`, every process on 127.0.0.1 (the baseline);
  hosts         : every service on a host of its own, links not capped;
  shaped        : the same with every host's link capped at `--mbit` both ways and one far replica at
                  `--far-mbit`;
  shaped-relay  : shaped, the pushes relayed from replica to replica (`weight_transport.type=gloo-relay`).
Reported for each: learner steps per second over the run's steps, the median push (Begin to Commit), the
audit, and per replica the groups trained and the groups dropped as too stale (beyond η when trained).

    sudo .venv/bin/python bench/network_run.py [--steps 300] [--mbit 200] [--far-mbit 50]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import tempfile
from pathlib import Path

from common import emit
from demo_runs import run_demo

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "examples" / "tiny-arith.yaml"
REPLICAS = 3


def overrides(steps: int) -> list[str]:
    return [f"rollout.replicas={REPLICAS}", f"learner.total_steps={steps}", "learner.eval_every=0"]


def groups_by_replica(learner: list) -> tuple[collections.Counter, collections.Counter]:
    """From the learner's records: per replica, the groups trained and those dropped as too stale."""
    from asyncrl.core.records.learner import Trained
    from asyncrl.core.records.rollout import GroupRejected

    trained, stale = collections.Counter(), collections.Counter()
    for ev in learner:
        if isinstance(ev, Trained):
            trained.update(group_id.split("-lease-")[0] for group_id in ev.group_ids)
        elif isinstance(ev, GroupRejected) and ev.reason.startswith("staleness"):
            stale[ev.group_id.split("-lease-")[0]] += 1
    return trained, stale


def figures(run_dir: Path) -> dict:
    from asyncrl.core.records.controller import PushCommitted
    from asyncrl.core.records.learner import Step
    from asyncrl.core.runtime.events import read_records
    from asyncrl.tools.audit import audit_run

    learner = read_records(run_dir, "learner")
    steps = [ev for ev in learner if isinstance(ev, Step)]
    pushes = [ev.seconds for ev in read_records(run_dir, "controller") if isinstance(ev, PushCommitted)]
    trained, stale = groups_by_replica(learner)
    audit = audit_run(str(run_dir))
    return {
        "steps_per_s": (len(steps) - 1) / (steps[-1].t - steps[0].t),
        "push_s_median": statistics.median(pushes),
        "staleness_mean": statistics.mean(ev.metrics["staleness/mean"] for ev in steps),
        "trained_groups": dict(sorted(trained.items())),
        "stale_groups": dict(sorted(stale.items())),
        "audit_ok": audit.ok,
        "audit": audit.headline(),
    }


def run_in_lab(config: Path, root: Path, overrides: tuple[str, ...], mbit: float | None, far_mbit: float) -> None:
    """`config` run to its end with every service on a host of its own (`asyncrl.tools.lab_run`); with `mbit`,
    every service's link capped at it both ways and the last replica's at `far_mbit`. SystemExit with the
    operator's log when the run fails."""
    from asyncrl.tools.lab_run import OPERATOR, replica_host, start_lab_run
    from asyncrl.tools.netlab import Lab

    with Lab() as lab:
        run = start_lab_run(lab, config, root, overrides)
        if mbit is not None:
            far = replica_host(run.config.rollout.replicas - 1)
            for host in (name for name in lab.hosts if name != OPERATOR):
                lab.shape(host, far_mbit if host == far else mbit)
        summary = run.wait(3600)
        if summary["exit_code"] != 0:
            raise SystemExit(f"the lab run failed:\n{run.operator_log()}")


def lab_arm(steps: int, shaped: bool, relay: bool, args, root: Path) -> dict:
    extra = ("learner.weight_transport.type=gloo-relay",) if relay else ()
    run_in_lab(DEMO, root, (*overrides(steps), *extra), args.mbit if shaped else None, args.far_mbit)
    return figures(root)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--mbit", type=float, default=200.0)
    parser.add_argument("--far-mbit", type=float, default=50.0)
    args = parser.parse_args()
    arms: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        run_demo(root / "loopback", overrides(args.steps))
        arms["loopback"] = figures(root / "loopback")
        for name, shaped, relay in (("hosts", False, False), ("shaped", True, False), ("shaped-relay", True, True)):
            arms[name] = lab_arm(args.steps, shaped, relay, args, root / name)
            print(name, arms[name], flush=True)
    base = arms["loopback"]["steps_per_s"]
    result = {"steps": args.steps, "mbit": args.mbit, "far_mbit": args.far_mbit, "arms": arms,
              "steps_per_s_over_loopback": {name: arm["steps_per_s"] / base for name, arm in arms.items()}}
    emit("network_run", result, {name: arm["steps_per_s"] for name, arm in arms.items()}, "learner steps / s",
         f"demo, 3 replicas: loopback against hosts of their own, links at {args.mbit:.0f} Mb/s with one "
         f"replica at {args.far_mbit:.0f} Mb/s")


if __name__ == "__main__":
    main()
