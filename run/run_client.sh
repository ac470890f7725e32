#!/usr/bin/env bash
# Start silo RANK (1..N) of a cross-silo run, in FedML's style.
#   bash run/run_client.sh RANK [CONFIG] [--set SECTION.KEY=VALUE ...] [--output-dir DIR]
# CONFIG defaults to config/modes/moon_cross_silo_grpc.yaml; start silos and server in any order.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: bash run/run_client.sh RANK [CONFIG] [--set ...]" >&2; exit 2; }
RANK=$1; shift
CONFIG=config/modes/moon_cross_silo_grpc.yaml
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then CONFIG=$1; shift; fi
exec .venv/bin/fedml-moon run --cf "$CONFIG" --rank "$RANK" --role client "$@"
