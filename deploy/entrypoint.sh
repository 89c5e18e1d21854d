#!/bin/sh
# Entry point of the GeoServe image: picks the service and runs it as PID 1 (exec).
#
#   geoserve-entrypoint datacenter|scheduler|provisioner|loadgen|carm [ARGS...]
#       -> python -m services.<name> [ARGS...] [--epoch E] [--dilation K] [$GEOSERVE_EXTRA_ARGS]
#   geoserve-entrypoint healthprobe [HOST:PORT]   -> python -m services.runtime.healthprobe
#   geoserve-entrypoint geoserve ARGS...          -> the geoserve CLI
#   geoserve-entrypoint COMMAND ARGS...           -> COMMAND (a shell, python, ...)
#
# Environment (all optional; a flag given on the command line wins):
#   GEOSERVE_EPOCH       run epoch, unix seconds, shared by every process of a run
#   GEOSERVE_EPOCH_FILE  without GEOSERVE_EPOCH: the first container of a run writes its
#                        start time there (atomically, link(2)), every later one reads it;
#                        compose puts it on a tmpfs volume that lives as long as the run
#   GEOSERVE_DILATION    time dilation factor k >= 1 (default: the topology's)
#   GEOSERVE_EXTRA_ARGS  more arguments, split on blanks (e.g. "--duration 20 --rate 6")
set -eu

usage() {
  sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
}

has_arg() {  # has_arg FLAG ARGS... : FLAG or FLAG=... among ARGS
  flag=$1; shift
  for a in "$@"; do
    case "$a" in "$flag"|"$flag"=*) return 0 ;; esac
  done
  return 1
}

resolve_epoch() {
  if [ -n "${GEOSERVE_EPOCH:-}" ]; then
    printf '%s\n' "$GEOSERVE_EPOCH"
    return 0
  fi
  f=${GEOSERVE_EPOCH_FILE:-}
  [ -n "$f" ] || return 0
  if [ ! -s "$f" ]; then
    mkdir -p "$(dirname "$f")"
    tmp=$(mktemp "$f.XXXXXX")
    date +%s.%N > "$tmp"
    ln "$tmp" "$f" 2>/dev/null || true   # first writer wins; the others read its value
    rm -f "$tmp"
  fi
  cat "$f"
}

svc=${1:-}
case "$svc" in
  datacenter|scheduler|provisioner|loadgen|carm)
    shift ;;
  healthprobe)
    shift; exec python -m services.runtime.healthprobe "$@" ;;
  geoserve)
    shift; exec geoserve "$@" ;;
  ""|-h|--help|help)
    usage; exit 0 ;;
  *)
    exec "$@" ;;
esac

case " $* " in *" -h "*|*" --help "*) exec python -m "services.$svc" "$@" ;; esac

if ! has_arg --epoch "$@"; then
  epoch=$(resolve_epoch)
  if [ -n "$epoch" ]; then set -- "$@" --epoch "$epoch"; fi
fi
if [ -n "${GEOSERVE_DILATION:-}" ] && ! has_arg --dilation "$@"; then
  set -- "$@" --dilation "$GEOSERVE_DILATION"
fi
if [ -n "${GEOSERVE_EXTRA_ARGS:-}" ]; then
  set -f                          # split on blanks, no globbing
  # shellcheck disable=SC2086
  set -- "$@" $GEOSERVE_EXTRA_ARGS
  set +f
fi

if [ "$svc" = loadgen ] && [ -n "${GEOSERVE_OUT:-}" ] && ! has_arg --out "$@"; then
  mkdir -p "$GEOSERVE_OUT" 2>/dev/null || true
  if [ ! -w "$GEOSERVE_OUT" ]; then
    echo "loadgen: error: results folder $GEOSERVE_OUT is not writable by uid $(id -u);" \
         "create it on the host and make it writable (mkdir -p results && chmod a+w results)" \
         "or run as your own uid (GEOSERVE_UID=\$(id -u) GEOSERVE_GID=\$(id -g) in .env)" >&2
    exit 2
  fi
fi

echo "geoserve-entrypoint: python -m services.$svc $*" >&2
exec python -m "services.$svc" "$@"
