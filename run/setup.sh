#!/usr/bin/env bash
# Install everything fedml_moon needs into ./.venv (idempotent).
#   - Debian packages (as root, when apt-get exists): dataset-fashion-mnist (the default job's data),
#     openmpi-bin + libopenmpi-dev (MPI simulation, cross-silo over MPI), mosquitto (an MQTT broker
#     for the edge mode's tests and local trials).
#   - Python 3.11 virtual environment with fedml_moon, mpi4py, gRPC, and the test tools (moto's S3
#     endpoint among them).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
APT_PACKAGES="dataset-fashion-mnist openmpi-bin libopenmpi-dev mosquitto"

install_apt() {
  command -v apt-get >/dev/null 2>&1 || { echo "setup: no apt-get; install $APT_PACKAGES yourself if needed" >&2; return 0; }
  local missing=""
  for p in $APT_PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
  [ -z "$missing" ] && return 0
  if [ "$(id -u)" != 0 ]; then
    echo "setup: please run: sudo apt-get install$missing" >&2
    return 0
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing
}

install_python() {
  command -v "$PYTHON" >/dev/null 2>&1 || { echo "setup: $PYTHON not found; FedML 0.9.6 needs Python 3.10 or 3.11" >&2; exit 1; }
  [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip "setuptools>=77,<81" wheel
  .venv/bin/python -m pip install -q -e ".[test]"
  .venv/bin/python -m pip install -q -e examples/headprox  # the example algorithm plugin (README)
}

install_apt
install_python
echo "setup: done (.venv)" >&2
