#!/usr/bin/env bash
# Install everything fedml_moon needs into ./.venv, and do nothing when nothing changed.
#   - Debian packages (as root, when apt-get exists): dataset-fashion-mnist (the default job's data),
#     openmpi-bin + libopenmpi-dev (MPI simulation, cross-silo over MPI), mosquitto (an MQTT broker
#     for the edge mode's tests and local trials); with --tests also slurm-wlm + munge (the one-node
#     Slurm cluster the cluster sweep's tests start) and chromium + prometheus (the status port's
#     page in a headless browser, its metrics scraped by a real Prometheus).
#   - a virtual environment of CPython 3.11, 3.12 or 3.13 with the versions its lock names
#     (requirements/py3.X.txt, installed --no-deps: FedML 0.9.6 without its 2022 pins, NumPy 2, a
#     current wandb, ...): fedml_moon, mpi4py, gRPC, the test and documentation tools (moto's S3
#     endpoint, mkdocs-material among them), and the example plugin.
# The interpreter: PYTHON=python3.12 (a name or a path) chooses; otherwise the one of an existing
# .venv, else the newest of python3.13, python3.12, python3.11 and python3 that runs and is supported.
# An unsupported one is refused, naming the versions. It says which it took.
# What pip installed is stamped in .venv/setup-stamp (a digest of the lock, the package definitions,
# this script and the Python version): the next call finds it unchanged and returns at once. pip's own
# output goes to .venv/setup.log and is shown only when pip fails, apt's only when apt fails.
# FEDML_MOON_SETUP=force reinstalls. A reinstall makes .venv anew, so that it holds the lock and nothing
# else (an earlier .venv's FedML pins, another Python's packages).
set -euo pipefail
cd "$(dirname "$0")/.."

SUPPORTED="3.13 3.12 3.11"  # newest first; each has its lock, requirements/py3.X.txt
APT_PACKAGES="dataset-fashion-mnist openmpi-bin libopenmpi-dev mosquitto"
# --tests (run/test.sh): also what only the tests need; never on a cluster's own nodes by the main job
[ "${1:-}" = --tests ] && APT_PACKAGES="$APT_PACKAGES slurm-wlm munge chromium prometheus"
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

# The X.Y of interpreter $1, or nothing when it does not run.
version_of() {
  "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true
}

supported() {
  case " $SUPPORTED " in *" $1 "*) [ -n "$1" ] ;; *) return 1 ;; esac
}

pick_python() {
  local cand ver
  if [ -n "${PYTHON:-}" ]; then
    ver=$(version_of "$PYTHON")
    [ -n "$ver" ] || { echo "setup: PYTHON=$PYTHON does not run; fedml_moon supports CPython 3.11, 3.12 and 3.13" >&2; exit 1; }
    supported "$ver" || { echo "setup: PYTHON=$PYTHON is Python $ver; fedml_moon supports CPython 3.11, 3.12 and 3.13 (PYTHON=python3.12 chooses one)" >&2; exit 1; }
  elif [ -x .venv/bin/python ] && supported "$(version_of .venv/bin/python)"; then
    PYTHON=$(readlink -f .venv/bin/python); ver=$(version_of .venv/bin/python)
  else
    for cand in python3.13 python3.12 python3.11 python3; do
      ver=$(version_of "$cand")
      if supported "$ver"; then PYTHON=$cand; break; fi
      ver=""
    done
    [ -n "$ver" ] || { echo "setup: no supported Python found (python3.13, python3.12, python3.11, python3); fedml_moon supports CPython 3.11, 3.12 and 3.13: install one, or name it with PYTHON=/path/to/python3.X" >&2; exit 1; }
  fi
  PYVER=$ver
  LOCK=requirements/py$PYVER.txt
}

# What the virtual environment is built from; any change to it reinstalls.
wanted() {
  { "$PYTHON" --version 2>&1; cat "$LOCK" setup.py examples/headprox/pyproject.toml run/setup.sh; } | sha256sum | cut -d' ' -f1
}

pip_install() {
  if ! .venv/bin/python -m pip install "$@" >>"$LOG" 2>&1; then
    echo "setup: pip install $* failed; its output (pip's warnings about index locations left out):" >&2
    grep -v '^WARNING: Location .* is ignored' "$LOG" | tail -n 40 >&2
    if grep -q 'No space left on device' "$LOG"; then
      echo "setup: the disk is full ($(df -h --output=avail . | tail -n 1 | tr -d ' ') free here); a venv of this lock takes about 6.5 GB" >&2
    fi
    exit 1
  fi
}

install_python() {
  pick_python
  local digest
  digest=$(wanted)
  if [ "${FEDML_MOON_SETUP:-}" != force ] && [ -x .venv/bin/fedml-moon ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$digest" ]; then
    return 0
  fi
  if [ -d .venv ]; then  # what it held (another lock, another Python, FedML's old pins) goes with it
    echo "setup: making .venv anew: it does not hold $LOCK with Python $PYVER" >&2
    rm -rf .venv
  fi
  "$PYTHON" -m venv .venv
  rm -f "$STAMP"
  : >"$LOG"
  echo "setup: installing into .venv with Python $PYVER ($PYTHON) from $LOCK (pip's output: $LOG)" >&2
  pip_install -q --upgrade pip wheel
  # the lock names every package and version, FedML 0.9.6 among them: installed as it says, no
  # resolution, so FedML's published pins never bind the environment
  pip_install -q --no-deps -r "$LOCK"
  pip_install -q --no-deps -e ".[test]"
  pip_install -q --no-deps -e examples/headprox  # the example algorithm plugin
  check_lock
  echo "$digest" >"$STAMP"
}

# Every requirement in the environment met, but FedML's own pins (which the lock overrides on purpose).
check_lock() {
  local broken
  broken=$(.venv/bin/python -m pip check 2>&1 | grep -v -e '^fedml 0\.9\.6 ' -e '^No broken requirements' || true)
  [ -z "$broken" ] || { echo "setup: $LOCK does not meet every requirement; regenerate it (bash run/lock.sh):" >&2; echo "$broken" >&2; exit 1; }
}

install_apt
install_python
echo "setup: done (.venv: Python $PYVER, $(.venv/bin/python -c 'from importlib.metadata import version as v
print(", ".join(f"{p} {v(p)}" for p in ("torch", "numpy", "fedml")))'))" >&2
