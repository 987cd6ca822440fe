#!/usr/bin/env bash
# The deploy tier, its own command (not in scripts/test.sh: it needs root for Docker and builds images):
# set-up (the venv, then Docker: scripts/docker_setup.sh), then deploy/compose.yaml run for real on this machine
# (tests/deploy/test_compose_deploy.py). Images and the debootstrap root are cached, so a re-run takes minutes.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/docker_setup.sh
exec .venv/bin/python -m pytest tests/deploy -m deploy -p no:cacheprovider -v "$@"
