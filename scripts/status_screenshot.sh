#!/usr/bin/env bash
# A screenshot of the controller's status page during a demo run, written to docs/status-page.png:
# `asyncrl up` on the demo config, headless Chromium (Debian's package, installed here if missing) once the
# learner is past STEPS steps, then the run is stopped with SIGTERM (and audited as usual).
#   scripts/status_screenshot.sh [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-60}
OUT=docs/status-page.png
bash scripts/setup.sh
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
PY=.venv/bin/python
port=$($PY -c 'from asyncrl.tools.processes import free_port; print(free_port("127.0.0.1"))')
work=$(mktemp -d)
.venv/bin/asyncrl --log-level WARNING up --config examples/tiny-arith.yaml --set "run_dir=$work/run" \
  --set learner.total_steps=1000 --set "controller.status_port=$port" > "$work/up.log" 2>&1 &
up_pid=$!
trap 'kill -TERM $up_pid 2>/dev/null || true; wait $up_pid 2>/dev/null || true' EXIT
step() {
  curl -fsS "http://127.0.0.1:$port/status" 2>/dev/null \
    | $PY -c 'import json,sys; l=json.load(sys.stdin)["learner"]; print(l["step"] if l else 0)' 2>/dev/null || echo 0
}
for _ in $(seq 600); do
  kill -0 $up_pid 2>/dev/null || { cat "$work/up.log"; exit 1; }
  [ "$(step)" -ge "$STEPS" ] && break
  sleep 1
done
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --hide-scrollbars --user-data-dir="$work/chromium" \
  --window-size=1280,720 --screenshot="$OUT" "http://127.0.0.1:$port/" 2>/dev/null
echo "wrote $OUT at learner step $(step) (run $work/run)"
