#!/usr/bin/env bash
# Run fedml-moon under mpirun (the MPI simulation, cross-silo over MPI).
#   bash run/mpirun.sh [--hostfile FILE] [NP] simulate|run --cf CONFIG [--set SECTION.KEY=VALUE ...]
# NP: the number of ranks (rank 0 is the server). The MPI simulation needs it (W workers: NP = W + 1);
# for `run` (cross-silo over MPI) it defaults to one rank per silo plus the server, from the config
# (train_args.client_num_in_total + 1, --set included). Adds --allow-run-as-root when run as root and
# --oversubscribe when NP exceeds this machine's cores. --hostfile FILE (Open MPI's: a line per host,
# `NAME slots=K`) spreads the ranks over those hosts, which need this repository and its .venv at the
# same path. Paths are relative to where you run it.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
USAGE="usage: bash run/mpirun.sh [--hostfile FILE] [NP] simulate|run --cf CONFIG [--set ...]"
HOSTS=()
if [ "${1:-}" = "--hostfile" ]; then
  [ $# -ge 2 ] && [ -f "$2" ] || { echo "run/mpirun.sh: --hostfile needs an existing file; $USAGE" >&2; exit 2; }
  HOSTS=(--hostfile "$2"); shift 2
fi
[ $# -ge 1 ] || { echo "$USAGE" >&2; exit 2; }
if [[ "$1" =~ ^[0-9]+$ ]]; then
  NP=$1; shift
else
  NP=$("$ROOT/.venv/bin/python" -c '
import sys
from fedml_moon.cli.train import mpi_ranks
from fedml_moon.config.load import ConfigError
try:
    print(mpi_ranks(sys.argv[1:]))
except ConfigError as err:
    sys.exit(f"run/mpirun.sh: {err}")
' "$@")
fi
command -v mpirun >/dev/null 2>&1 || { echo "run/mpirun.sh: mpirun not found (bash run/setup.sh installs openmpi-bin)" >&2; exit 1; }
# Open MPI gives each physical core one slot: count cores (not hardware threads) this process may use
CORES=$(nproc)
if command -v lscpu >/dev/null 2>&1; then
  PHYSICAL=$(lscpu -p=Core,Socket 2>/dev/null | grep -v '^#' | sort -u | wc -l)
  [ "$PHYSICAL" -ge 1 ] && [ "$PHYSICAL" -lt "$CORES" ] && CORES=$PHYSICAL
fi
FLAGS=()
[ "$(id -u)" = 0 ] && FLAGS+=(--allow-run-as-root)
[ "$NP" -gt "$CORES" ] && FLAGS+=(--oversubscribe)
exec mpirun "${FLAGS[@]}" "${HOSTS[@]}" -np "$NP" "$ROOT/.venv/bin/fedml-moon" "$@"
