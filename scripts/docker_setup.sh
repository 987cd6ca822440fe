#!/usr/bin/env bash
# Docker for the deploy tier (scripts/test_deploy.sh), idempotent:
#   - the engine: Debian's docker.io when none answers, and dockerd started by hand where no init system runs it
#     (its log: $ASYNCRL_DEPLOY_CACHE/dockerd.log);
#   - `docker compose` (v2): Debian bookworm packages only compose v1 (`docker-compose` 1.29, another CLI), so
#     the compose plugin comes from Debian trixie's docker-compose package (a Go binary that needs only libc),
#     fetched with apt through its own index lists (the system's sources are not changed) and unpacked into
#     ~/.docker/cli-plugins;
#   - debootstrap, which builds the stand-in base images where no image registry answers.
set -euo pipefail
CACHE=${ASYNCRL_DEPLOY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/asyncrl/deploy}
mkdir -p "$CACHE"
log() { echo "[docker-setup] $*" >&2; }
if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
apt_install() {
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

missing=()
command -v docker >/dev/null 2>&1 && command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]} (Debian packages)"
  apt_install "${missing[@]}"
fi

if ! docker info >/dev/null 2>&1; then
  log "starting dockerd (log: $CACHE/dockerd.log)"
  $SUDO nohup dockerd >"$CACHE/dockerd.log" 2>&1 &
  for _ in $(seq 60); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
  docker info >/dev/null 2>&1 || { log "dockerd did not answer within 60 s; see $CACHE/dockerd.log"; exit 1; }
fi

if ! docker compose version >/dev/null 2>&1; then
  log "installing the compose v2 plugin from Debian trixie's docker-compose package"
  apt_dir="$CACHE/apt-trixie"
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/debs"
  echo "deb http://deb.debian.org/debian trixie main" >"$apt_dir/sources.list"
  apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
            -o "Dir::State::Lists=$apt_dir/lists" -o APT::Sandbox::User=root)
  $SUDO apt-get "${apt_opts[@]}" update -qq
  (cd "$apt_dir/debs" && $SUDO apt-get "${apt_opts[@]}" download -qq docker-compose)
  rm -rf "$apt_dir/unpacked"
  dpkg-deb -x "$(ls "$apt_dir"/debs/docker-compose_*.deb | tail -1)" "$apt_dir/unpacked"
  mkdir -p "$HOME/.docker/cli-plugins"
  install -m 0755 "$apt_dir/unpacked/usr/libexec/docker/cli-plugins/docker-compose" "$HOME/.docker/cli-plugins/"
fi
log "ready: $(docker version --format 'engine {{.Server.Version}}'), $(docker compose version --short | sed 's/^/compose /')"
