#!/usr/bin/env bash
# Writes deploy/.env (not in git, owner-only) with fresh random secrets (the token, Redis's admin password and
# one per role's Redis user, the learner secret, Grafana's login), unless it exists: docker compose reads
# it from the compose file's folder for every command (`up`, `ps`, `logs`, `down`, `run ... audit`), from any
# shell, so nothing has to be exported first. A variable exported in the shell still wins over the file.
# Rotating: delete the file, run this again, `docker compose -f deploy/compose.yaml up -d` (the services restart
# with the new secrets; Redis's password changes with its container).
set -euo pipefail
env_file="$(dirname "$0")/.env"
umask 077
rand() { python3 -c "import secrets; print(secrets.token_hex($1))"; }
sha256() { printf '%s' "$1" | sha256sum | cut -d' ' -f1; }
if [ -e "$env_file" ]; then
  echo "$env_file exists; keeping it" >&2
  exit 0
fi
{
  echo "# asyncrl compose secrets (deploy/make-compose-env.sh); keep this file private"
  echo "ASYNCRL_TOKEN=$(rand 32)"
  echo "ASYNCRL_REDIS_PASSWORD=$(rand 32)"
  # One Redis user per role: its password (that role's container only) and its SHA-256 (Redis's command line).
  for role in CONTROLLER LEARNER ROLLOUT; do
    password=$(rand 32)
    echo "ASYNCRL_REDIS_${role}_PASSWORD=$password"
    echo "ASYNCRL_REDIS_${role}_SHA256=$(sha256 "$password")"
  done
  echo "ASYNCRL_LEARNER_SECRET=$(rand 32)"
  echo "GRAFANA_ADMIN_PASSWORD=$(rand 16)"
} > "$env_file"
echo "wrote $env_file" >&2
