"""Training under faults against training undisturbed, one run: the demo at η = 4 trains for `--calm-s`
seconds untouched, then for `--minutes` a random role (controller, teacher, a replica, the learner, Redis),
sometimes two, is killed with SIGKILL or paused for 1-4 s every 2-10 s (`asyncrl.tools.soak`). The headline is
the training rate under faults over the calm rate (learner steps of the surviving timeline per second: steps
a killed learner trains again from its checkpoint count once); also the time from each fault to the learner's
next steps, and the run's audit (nothing lost, nothing trained twice, η held), which must be clean.

    .venv/bin/python bench/chaos_soak.py [--minutes 5] [--calm-s 30] [--seed 1] [--eta 4] [--set K=V ...]
                                         [--name SUFFIX]   (the result goes to chaos_soak-SUFFIX)
    (or: asyncrl bench chaos_soak -- --minutes 5)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from common import emit

from asyncrl.tools.soak import soak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--calm-s", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--eta", default="4")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--name", default="", help="suffix of the result's name")
    args = parser.parse_args()
    repo = Path(__file__).resolve().parents[1]
    overrides = [f"controller.eta={args.eta}", "learner.eval_every=0", "learner.checkpoint.save_every=50",
                 *args.overrides]
    with tempfile.TemporaryDirectory() as tmp:
        result = soak(str(repo / "examples" / "tiny-arith.yaml"), Path(tmp) / "run", overrides, args.calm_s,
                      60 * args.minutes, args.seed, log=lambda line: print(line, file=sys.stderr, flush=True))
    result = {"eta": args.eta, "overrides": overrides, **result}
    emit("chaos_soak" + (f"-{args.name}" if args.name else ""), result,
         {"calm": result["calm_steps_per_s"], "under faults": result["chaos_steps_per_s"]},
         "learner steps / s (surviving timeline)",
         f"{result['faults']} faults: {result['chaos_over_calm']:.2f}x of the calm rate, audit "
         f"{'OK' if result['audit_ok'] else 'FAILED'}")
    if result["wedged"] or not result["audit_ok"]:
        sys.exit(f"chaos soak failed: {result['wedged'] or 'audit: ' + result['audit']}")


if __name__ == "__main__":
    main()
