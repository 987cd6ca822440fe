#!/usr/bin/env bash
# Writes deploy/k8s/base/secrets.env and learner-secret.env (not in git) with fresh random secrets, each
# unless it exists; kustomize turns them into the asyncrl-secrets Secret (every pod) and the
# asyncrl-learner-secret Secret (the controller and the learner only). Rotating: delete a file, run this
# again, re-apply.
set -euo pipefail
base="$(dirname "$0")/base"
umask 077
rand() { python3 -c 'import secrets; print(secrets.token_hex(32))'; }
if [ -e "$base/secrets.env" ]; then echo "$base/secrets.env exists; keeping it" >&2
else printf 'ASYNCRL_TOKEN=%s\nASYNCRL_REDIS_PASSWORD=%s\n' "$(rand)" "$(rand)" > "$base/secrets.env"
     echo "wrote $base/secrets.env" >&2; fi
if [ -e "$base/learner-secret.env" ]; then echo "$base/learner-secret.env exists; keeping it" >&2
else printf 'ASYNCRL_LEARNER_SECRET=%s\n' "$(rand)" > "$base/learner-secret.env"
     echo "wrote $base/learner-secret.env" >&2; fi
