#!/usr/bin/env bash
# The wheels a GPU machine's own Python lacks for the FedML stages of benchmarks/gpu_check.sh, fetched
# here (the GPU machine reaches no registry), to travel with the tree and be installed there.
#   bash benchmarks/gpu_wheels.sh [DIR]      (default: .whl; PY_VERSION=3.12 names the machine's Python)
# Such a machine's image holds PyTorch, torchvision, NumPy, pandas, pyarrow, scipy, grpcio, protobuf,
# requests, matplotlib, safetensors, scikit-learn and PyYAML; a run also needs FedML 0.9.6 (its wheel,
# installed without its pins), cachetools (FedML's parts), wandb and pydantic (tracking), dp-accounting
# and dm-tree (privacy), and cryptography (TLS): GPU_WHEELS below. Each is fetched at the version of
# requirements/py$PY_VERSION.txt, --no-deps, for CPython on x86_64 Linux. benchmarks/gpu_check.sh
# installs DIR's wheels (WHEELS=DIR, default .whl) into its output folder and puts them on PYTHONPATH.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.whl}
PY_VERSION=${PY_VERSION:-3.12}
LOCK=requirements/py$PY_VERSION.txt
GPU_WHEELS="fedml cachetools wandb pydantic pydantic-core annotated-types typing-inspection platformdirs dp-accounting dm-tree cryptography cffi pycparser"
[ -f "$LOCK" ] || { echo "gpu_wheels: no $LOCK (supported: 3.11, 3.12, 3.13)" >&2; exit 2; }
mkdir -p "$DIR"
PLATFORMS=()
for p in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
  PLATFORMS+=(--platform "${p}_x86_64")
done
for name in $GPU_WHEELS; do
  pin=$(grep -i -E "^${name//-/[-_]}==" "$LOCK") || { echo "gpu_wheels: $name is not in $LOCK" >&2; exit 1; }
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" \
    --implementation cp "${PLATFORMS[@]}" --platform any -d "$DIR" "$pin"
done
echo "gpu_wheels: $(ls "$DIR"/*.whl | wc -l) wheels, $(du -sh "$DIR" | cut -f1) in $DIR" >&2
