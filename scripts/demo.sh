#!/usr/bin/env bash
# The main job: set-up (idempotent), then the local demo: Redis + controller + 2 rollout replicas +
# teacher + learner on a tiny model that learns multi-digit addition on CPU.
# Extra arguments go to `asyncrl up` (e.g. `--set learner.total_steps=10`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/asyncrl up --config "${ASYNCRL_CONFIG:-examples/tiny-arith.yaml}" "$@"
