#!/usr/bin/env bash
# Install everything fedml_moon needs into ./.venv, and do nothing when nothing changed.
#   - Debian packages (as root, when apt-get exists): dataset-fashion-mnist (the default job's data),
#     openmpi-bin + libopenmpi-dev (MPI simulation, cross-silo over MPI), mosquitto (an MQTT broker
#     for the edge mode's tests and local trials); with --tests also slurm-wlm + munge (the one-node
#     Slurm cluster the cluster sweep's tests start).
#   - Python 3.11 virtual environment with fedml_moon, mpi4py, gRPC, the test and documentation tools
#     (moto's S3 endpoint, mkdocs-material among them), and the example plugin.
# What pip installed is stamped in .venv/setup-stamp (a digest of the package definitions, this script
# and the Python version): the next call finds it unchanged and returns at once. pip's own output goes
# to .venv/setup.log and is shown only when pip fails, apt's only when apt fails.
# FEDML_MOON_SETUP=force reinstalls.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
APT_PACKAGES="dataset-fashion-mnist openmpi-bin libopenmpi-dev mosquitto"
# --tests (run/test.sh): also what only the tests need; never on a cluster's own nodes by the main job
[ "${1:-}" = --tests ] && APT_PACKAGES="$APT_PACKAGES slurm-wlm munge"
STAMP=.venv/setup-stamp
LOG=.venv/setup.log

install_apt() {
  command -v apt-get >/dev/null 2>&1 || { echo "setup: no apt-get; install $APT_PACKAGES yourself if needed" >&2; return 0; }
  local missing=""
  for p in $APT_PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
  [ -z "$missing" ] && return 0
  if [ "$(id -u)" != 0 ]; then
    echo "setup: please run: sudo apt-get install$missing" >&2
    return 0
  fi
  local log
  log=$(mktemp)
  echo "setup: apt-get install$missing (its output is shown only if it fails)" >&2
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing; } >"$log" 2>&1; then
    echo "setup: apt-get install$missing failed; its output:" >&2
    tail -n 40 "$log" >&2
    rm -f "$log"
    exit 1
  fi
  rm -f "$log"
}

# What the virtual environment is built from; any change to it reinstalls.
wanted() {
  { "$PYTHON" --version 2>&1; cat setup.py examples/headprox/pyproject.toml run/setup.sh; } | sha256sum | cut -d' ' -f1
}

pip_install() {
  if ! .venv/bin/python -m pip install "$@" >>"$LOG" 2>&1; then
    echo "setup: pip install $* failed; its output:" >&2
    tail -n 40 "$LOG" >&2
    exit 1
  fi
}

install_python() {
  command -v "$PYTHON" >/dev/null 2>&1 || { echo "setup: $PYTHON not found; FedML 0.9.6 needs Python 3.10 or 3.11" >&2; exit 1; }
  local digest
  digest=$(wanted)
  if [ "${FEDML_MOON_SETUP:-}" != force ] && [ -x .venv/bin/fedml-moon ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$digest" ]; then
    return 0
  fi
  [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
  rm -f "$STAMP"
  : >"$LOG"
  echo "setup: installing into .venv (pip's output: $LOG)" >&2
  pip_install -q --upgrade pip "setuptools>=77,<81" wheel
  pip_install -q -e ".[test]"
  pip_install -q -e examples/headprox  # the example algorithm plugin
  echo "$digest" >"$STAMP"
}

install_apt
install_python
echo "setup: done (.venv)" >&2
