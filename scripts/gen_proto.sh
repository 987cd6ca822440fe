#!/usr/bin/env bash
# Regenerates the Python stubs in asyncrl/v1/ from proto/asyncrl/v1/*.proto (committed; a test checks
# they are current). Uses the project venv's grpcio-tools (protoc); PYTHON=... picks another interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-.}
PYTHON=${PYTHON:-.venv/bin/python}
"$PYTHON" -m grpc_tools.protoc -I proto --python_out="$OUT" --pyi_out="$OUT" --grpc_python_out="$OUT" proto/asyncrl/v1/*.proto
touch "$OUT/asyncrl/v1/__init__.py"
