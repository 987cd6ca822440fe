#!/usr/bin/env bash
# The test command: set-up (idempotent), then every tier in one pytest run:
#   unit (pure, no network) -> integration (real Redis, real gRPC, real processes) -> e2e (whole system,
#   real vLLM on CPU) -> chaos (the whole system under faults). GPU-only tests skip with a reason when no
#   CUDA device is present.
# Extra arguments go to pytest: test paths run those instead of every tier (`scripts/test.sh tests/unit`),
# options are added (`scripts/test.sh -m "not e2e and not chaos"` for the fast tiers only).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Tiers in order, fastest first, so a broken unit fails before the slow runs start.
tiers=(tests/unit tests/integration tests/e2e tests/chaos tests/gpu)
for arg in "$@"; do
  case "$arg" in tests/*) tiers=() ;; esac
done
# Two workers: one runs the whole-system tests (e2e, chaos) in order, the other the example models' builds,
# then the unit and integration tests a file at a time; tests marked `alone` run with nothing beside them
# (tests/conftest.py). `-n 0` runs one test at a time.
exec .venv/bin/python -m pytest "${tiers[@]}" -p no:cacheprovider -n 2 --no-loadscope-reorder \
  --durations=20 "$@"
