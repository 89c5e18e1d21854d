#!/usr/bin/env bash
# Make sure a `prometheus` binary is on PATH (the real-Prometheus tests need one).
# Idempotent: does nothing when prometheus is already installed; otherwise installs the
# Debian/Ubuntu package (needs root or passwordless sudo). Called from the Makefile.
set -euo pipefail

if command -v prometheus >/dev/null 2>&1; then
  echo "ensure-prometheus: $(command -v prometheus) ($(prometheus --version 2>&1 | head -n1))"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO="sudo -n"
  else
    echo "ensure-prometheus: prometheus is missing and this user cannot install packages;" >&2
    echo "  install it yourself (apt-get install prometheus, or a release tarball on PATH)" >&2
    exit 1
  fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure-prometheus: prometheus is missing and apt-get is not available;" >&2
  echo "  put a prometheus binary (https://prometheus.io/download/) on PATH" >&2
  exit 1
fi

echo "ensure-prometheus: installing the Debian package 'prometheus'"
export DEBIAN_FRONTEND=noninteractive
# wait for another apt/dpkg run (unattended upgrades, a parallel install) instead of failing
for i in $(seq 1 60); do
  $SUDO apt-get -o DPkg::Lock::Timeout=300 update -qq && break
  echo "ensure-prometheus: apt-get update failed (lock held?), retrying in 5 s" >&2
  sleep 5
done
# --no-install-recommends: the server binary only (no node exporter, no web assets)
$SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends prometheus
# the package's service may have been started by the post-install script (not under
# systemd in containers); the tests run their own instance on a private port
command -v prometheus >/dev/null 2>&1 || { echo "ensure-prometheus: install failed" >&2; exit 1; }
echo "ensure-prometheus: $(command -v prometheus) ($(prometheus --version 2>&1 | head -n1))"
