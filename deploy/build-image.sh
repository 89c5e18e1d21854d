#!/usr/bin/env bash
# Build the GeoServe image (deploy/Dockerfile), online or offline.
#
#   deploy/build-image.sh                 pinned python base from the registry, PyPI
#   deploy/build-image.sh --offline       no registry needed: a Debian bookworm base made
#                                         with debootstrap (geoserve/base:bookworm, reused
#                                         when present) and wheels built on this host into
#                                         build/wheelhouse (pip install --no-index)
#   deploy/build-image.sh --prometheus    also (or, with --no-geoserve, only) build a local
#                                         Prometheus image from this host's Debian
#                                         prometheus binary (geoserve/prometheus:local),
#                                         for machines that cannot pull prom/prometheus
#
# Image names come from the environment, else from .env: GEOSERVE_IMAGE,
# GEOSERVE_BASE_IMAGE; PROMETHEUS_LOCAL_IMAGE (default geoserve/prometheus:local).
# Offline needs root (debootstrap) and a host Python 3.11 with pip (PYTHON, default
# .venv/bin/python) that reaches a package index or has the wheels cached.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "build-image: $*" >&2; }
offline=0; prometheus=0; geoserve=1
for arg in "$@"; do
  case "$arg" in
    --offline) offline=1 ;;
    --online) offline=0 ;;
    --prometheus) prometheus=1 ;;
    --no-geoserve) geoserve=0 ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) log "unknown argument $arg (see --help)"; exit 2 ;;
  esac
done

env_value() {  # env_value NAME DEFAULT: the environment, else .env, else DEFAULT
  local name=$1 default=$2 v
  v=$(printenv "$name" || true)
  if [ -z "$v" ] && [ -f .env ]; then
    v=$(sed -n "s/^${name}=//p" .env | tail -n 1)
  fi
  printf '%s\n' "${v:-$default}"
}

IMAGE=$(env_value GEOSERVE_IMAGE geoserve/geoserve:0.1.0)
BASE_IMAGE=$(env_value GEOSERVE_BASE_IMAGE python:3.11.14-slim-bookworm)
LOCAL_BASE=geoserve/base:bookworm
PROM_IMAGE=$(env_value PROMETHEUS_LOCAL_IMAGE geoserve/prometheus:local)
PYTHON=${PYTHON:-.venv/bin/python}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

# BuildKit needs the buildx plugin; without it use the classic builder, quietly
if ! docker buildx version >/dev/null 2>&1; then export DOCKER_BUILDKIT=0; fi

ensure_local_base() {
  if docker image inspect "$LOCAL_BASE" >/dev/null 2>&1; then
    log "reusing $LOCAL_BASE"
    return
  fi
  command -v debootstrap >/dev/null 2>&1 || { log "debootstrap missing (deploy/setup-docker.sh)"; exit 1; }
  local root
  root=$(mktemp -d /tmp/geoserve-rootfs.XXXXXX)
  log "debootstrap bookworm (python3, python3-venv) into $root"
  local t0=$SECONDS
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$root" "$MIRROR" >"$root.log" 2>&1 || {
      tail -n 20 "$root.log" >&2; rm -rf "$root" "$root.log"; exit 1; }
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]' - "$LOCAL_BASE" >/dev/null
  rm -rf "$root" "$root.log"
  log "built $LOCAL_BASE in $((SECONDS - t0)) s ($(docker run --rm "$LOCAL_BASE" python3 -V))"
}

build_wheelhouse() {
  local dir=build/wheelhouse
  local ver
  ver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  if [ "$ver" != "3.11" ]; then
    log "$PYTHON is Python $ver; the bookworm base runs 3.11 (set PYTHON=python3.11)"
    exit 1
  fi
  # the versions the host environment was tested with, where it has them
  local constraints=build/wheelhouse.constraints
  mkdir -p build
  "$PYTHON" -m pip freeze --exclude-editable 2>/dev/null | grep -v ' @ ' | grep '==' \
    > "$constraints.new" || true
  local stamp
  stamp=$(cat pyproject.toml "$constraints.new" | sha256sum | cut -c1-16)
  if [ -f "$dir/.stamp" ] && [ "$(cat "$dir/.stamp")" = "$stamp" ]; then
    log "reusing $dir"
    rm -f "$constraints.new"
    return
  fi
  mv "$constraints.new" "$constraints"
  rm -rf "$dir"; mkdir -p "$dir"
  log "building wheels of the dependencies into $dir"
  "$PYTHON" -m pip wheel --quiet -w "$dir" -c "$constraints" . 'setuptools>=77' wheel
  rm -f "$dir"/geoserve-*.whl   # the image installs the project itself from its source
  echo "$stamp" > "$dir/.stamp"
}

if [ "$geoserve" = 1 ]; then
  t0=$SECONDS
  if [ "$offline" = 1 ]; then
    ensure_local_base
    build_wheelhouse
    log "building $IMAGE from $LOCAL_BASE with build/wheelhouse"
    docker build -q -f deploy/Dockerfile --build-arg BASE_IMAGE="$LOCAL_BASE" \
      --build-arg WHEELHOUSE=build/wheelhouse -t "$IMAGE" . >/dev/null
  else
    log "building $IMAGE from $BASE_IMAGE"
    docker build -f deploy/Dockerfile --build-arg BASE_IMAGE="$BASE_IMAGE" -t "$IMAGE" .
  fi
  log "built $IMAGE in $((SECONDS - t0)) s"
fi

if [ "$prometheus" = 1 ]; then
  if docker image inspect "$PROM_IMAGE" >/dev/null 2>&1; then
    log "reusing $PROM_IMAGE"
  else
    ensure_local_base
    if ! command -v prometheus >/dev/null 2>&1; then
      if [ -x deploy/ensure-prometheus.sh ]; then deploy/ensure-prometheus.sh
      else apt-get install -y -qq --no-install-recommends prometheus >/dev/null; fi
    fi
    ctx=$(mktemp -d /tmp/geoserve-prom.XXXXXX)
    cp "$(command -v prometheus)" "$(command -v promtool)" "$ctx/"
    # compose's health check runs `wget -q -O /dev/null URL` (busybox in prom/prometheus)
    cat > "$ctx/wget" <<'PY'
#!/usr/bin/python3
"""Just enough of wget for a health check: wget [-q] [-O FILE] URL."""
import sys
import urllib.request

args, out, url = sys.argv[1:], None, None
while args:
    a = args.pop(0)
    if a == "-O":
        out = args.pop(0)
    elif not a.startswith("-"):
        url = a
try:
    with urllib.request.urlopen(url, timeout=5) as r:
        data = r.read()
except Exception as exc:
    print(f"wget: {url}: {exc}", file=sys.stderr)
    sys.exit(1)
if out and out != "-":
    with open(out, "wb") as f:
        f.write(data)
elif out == "-":
    sys.stdout.buffer.write(data)
PY
    cat > "$ctx/Dockerfile" <<DOCKERFILE
FROM $LOCAL_BASE
COPY prometheus promtool wget /bin/
RUN chmod 0755 /bin/prometheus /bin/promtool /bin/wget \\
 && mkdir -p /prometheus /etc/prometheus && chown 65534:65534 /prometheus
USER 65534:65534
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
DOCKERFILE
    docker build -q -t "$PROM_IMAGE" "$ctx" >/dev/null
    rm -rf "$ctx"
    log "built $PROM_IMAGE ($(docker run --rm "$PROM_IMAGE" --version 2>&1 | head -n 1))"
  fi
fi
