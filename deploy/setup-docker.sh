#!/usr/bin/env bash
# Make sure this machine can run the compose deployment and its test: a Docker engine
# (started if it is not running), both compose CLIs the deployment is tested with --
# Debian's docker-compose (v1.29) and Compose v2 (`docker compose`, installed by
# deploy/install-compose-v2.sh when missing) -- and debootstrap (offline base image,
# deploy/build-image.sh --offline).
# Idempotent: installs only what is missing (Debian/Ubuntu, root or passwordless sudo),
# starts dockerd in the background only when no engine answers, then waits for it.
#   DOCKERD_LOG   where a dockerd started here logs (default /tmp/geoserve-dockerd.log)
set -euo pipefail

log() { echo "setup-docker: $*" >&2; }
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"; fi
fi

need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v docker >/dev/null 2>&1 || need+=(docker.io)
command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
if [ "${#need[@]}" -gt 0 ]; then
  mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
  if [ "$(id -u)" -ne 0 ] && [ -z "$SUDO" ]; then
    log "missing ${need[*]} and this user cannot install packages (need root or sudo)"
    exit 1
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    log "missing ${need[*]} and apt-get is not available; install Docker yourself"
    exit 1
  fi
  log "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  for _ in 1 2 3 4 5 6; do
    $SUDO apt-get -o DPkg::Lock::Timeout=300 update -qq && break
    log "apt-get update failed (lock held?), retrying in 5 s"; sleep 5
  done
  $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${need[@]}" >/dev/null
fi

if ! docker compose version >/dev/null 2>&1; then
  bash "$(dirname "$0")/install-compose-v2.sh"
fi

if docker info >/dev/null 2>&1; then
  log "Docker engine $(docker version --format '{{.Server.Version}}' 2>/dev/null) is running"
  exit 0
fi
if [ "$(id -u)" -ne 0 ] && [ -z "$SUDO" ]; then
  log "no Docker engine answers and this user cannot start one (need root, sudo or the docker group)"
  exit 1
fi
DOCKERD_LOG=${DOCKERD_LOG:-/tmp/geoserve-dockerd.log}
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  log "starting docker.service"
  $SUDO systemctl start docker || true
fi
if ! docker info >/dev/null 2>&1 && ! pgrep -x dockerd >/dev/null 2>&1; then
  log "starting dockerd in the background (log: $DOCKERD_LOG)"
  $SUDO setsid nohup dockerd >"$DOCKERD_LOG" 2>&1 < /dev/null &
fi
for _ in $(seq 1 120); do
  if docker info >/dev/null 2>&1; then
    log "Docker engine $(docker version --format '{{.Server.Version}}' 2>/dev/null) is running"
    exit 0
  fi
  sleep 0.5
done
log "the Docker engine did not answer within 60 s; last lines of $DOCKERD_LOG:"
tail -n 20 "$DOCKERD_LOG" >&2 || true
exit 1
