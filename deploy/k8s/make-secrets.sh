#!/usr/bin/env bash
# Writes deploy/k8s/base/secrets.env (not in git) with fresh random secrets, unless it exists; kustomize
# turns it into the asyncrl-secrets Secret. Rotating: delete the file, run this again, re-apply.
set -euo pipefail
out="$(dirname "$0")/base/secrets.env"
if [ -e "$out" ]; then echo "$out exists; keeping it" >&2; exit 0; fi
umask 077
rand() { python3 -c 'import secrets; print(secrets.token_hex(32))'; }
printf 'ASYNCRL_TOKEN=%s\nASYNCRL_REDIS_PASSWORD=%s\n' "$(rand)" "$(rand)" > "$out"
echo "wrote $out" >&2
