#!/usr/bin/env bash
# Writes deploy/k8s/base/secrets.env, redis-secrets.env, redis-users.env and learner-secret.env (not in git)
# with fresh random secrets, each unless it exists; kustomize turns them into the asyncrl-secrets Secret (the
# token: every pod), asyncrl-redis (Redis's admin password and its users' hashes: the Redis pod only),
# asyncrl-redis-users (each role's pods take their own key) and asyncrl-learner-secret (the controller and the
# learner only). Rotating: delete a file, run this again, re-apply.
set -euo pipefail
base="$(dirname "$0")/base"
umask 077
rand() { python3 -c 'import secrets; print(secrets.token_hex(32))'; }
if [ -e "$base/secrets.env" ]; then echo "$base/secrets.env exists; keeping it" >&2
else printf 'ASYNCRL_TOKEN=%s\n' "$(rand)" > "$base/secrets.env"
     echo "wrote $base/secrets.env" >&2; fi
# Redis: its admin password, and one user per role (the password for that role's pods, its SHA-256 for Redis's).
if [ -e "$base/redis-users.env" ]; then echo "$base/redis-users.env exists; keeping it" >&2
else
  printf 'ASYNCRL_REDIS_PASSWORD=%s\n' "$(rand)" > "$base/redis-secrets.env"
  : > "$base/redis-users.env"
  for role in CONTROLLER LEARNER ROLLOUT; do
    password=$(rand)
    printf 'ASYNCRL_REDIS_%s_PASSWORD=%s\n' "$role" "$password" >> "$base/redis-users.env"
    printf 'ASYNCRL_REDIS_%s_SHA256=%s\n' "$role" "$(printf '%s' "$password" | sha256sum | cut -d' ' -f1)" \
      >> "$base/redis-secrets.env"
  done
  echo "wrote $base/redis-secrets.env and $base/redis-users.env" >&2
fi
if [ -e "$base/learner-secret.env" ]; then echo "$base/learner-secret.env exists; keeping it" >&2
else printf 'ASYNCRL_LEARNER_SECRET=%s\n' "$(rand)" > "$base/learner-secret.env"
     echo "wrote $base/learner-secret.env" >&2; fi
