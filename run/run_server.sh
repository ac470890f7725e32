#!/usr/bin/env bash
# Start the server (rank 0) of a cross-silo run, in FedML's style.
#   bash run/run_server.sh [CONFIG] [--set SECTION.KEY=VALUE ...] [--output-dir DIR]
# CONFIG defaults to config/modes/moon_cross_silo_grpc.yaml. Silos: bash run/run_client.sh RANK [CONFIG].
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=config/modes/moon_cross_silo_grpc.yaml
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then CONFIG=$1; shift; fi
exec .venv/bin/fedml-moon run --cf "$CONFIG" --rank 0 --role server "$@"
