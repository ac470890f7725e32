#!/usr/bin/env bash
# Install, then run the default job: MOON on Fashion-MNIST, 10 parties, Dir(0.5).
# Extra arguments go to `fedml-moon simulate`, e.g. --set train_args.comm_round=5
set -euo pipefail
cd "$(dirname "$0")/.."
bash run/setup.sh
exec .venv/bin/fedml-moon simulate --cf config/fashion_mnist/moon.yaml "$@"
