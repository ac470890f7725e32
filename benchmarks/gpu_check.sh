#!/usr/bin/env bash
# The checks and measurements of one CUDA machine, in one command, each stage's output in a folder.
#
#   bash benchmarks/gpu_check.sh OUT_DIR [STAGE ...]      (default: every stage, in this order)
#
# Stages (each bounded by `timeout`; a stage that fails or runs out of time is noted and the next runs):
#   env     the GPU, the driver, Python, PyTorch, and whether FedML imports      -> env.txt
#   tests   the CUDA test cases (`pytest -m cuda` over the files that hold them) -> tests.log
#   cnn     benchmarks/gpu_round.py, the MOON paper's CIFAR-10 simple-CNN round, every mode the device
#           runs, 2 epochs                                                        -> cnn.log
#   kernels the same for 1 epoch under the profiler (--profile): CUDA kernel time against wall time, in
#           the stacked, streams and one-party-graph modes                        -> kernels.log
#   resnet  the same for CIFAR-100 ResNet-50 in the modes that do not stack it     -> resnet.log
#   job     the README's main job (Fashion-MNIST MOON) with no other setting, 5 rounds -> job.log
#   tf32    the same job in train_args.precision tf32, then bf16 (accuracy and speed) -> tf32.log, bf16.log
#   grpc    a gRPC cross-silo run on 127.0.0.1, server and silo 2 on the CPU, silo 1 on the GPU -> grpc.log
#   networks benchmarks/networks.py --gpu: samples/s of each network, torchvision's ResNet-18 at 224 too
#           -> networks.log
#   memory  benchmarks/party_memory.py --gpu (state in memory vs on disk)           -> memory.log
# The lines that carry figures (key=value, the runs' device, pace, accuracy per round, the tests' count)
# of every stage go to figures.txt too.
#
# PYTHON (default .venv/bin/python, else python3) runs everything, from this repository's root, with
# the repository on PYTHONPATH, so a machine with PyTorch and no installed fedml_moon runs the stages
# that need only PyTorch: env, tests, cnn, kernels, resnet. The others go through FedML's parts
# (`fedml-moon`), which import on Python 3.11 to 3.13 given their packages: on a machine whose own
# Python lacks some, the wheels `bash benchmarks/gpu_wheels.sh` fetched elsewhere (WHEELS=DIR, default
# .whl, when it holds any) are installed into OUT_DIR/site and put on PYTHONPATH. Where FedML's parts
# still do not import, those stages are skipped saying why (the import's last line). The data: Fashion-MNIST from FASHION_MNIST_DIR (default: Debian's folder); CIFAR from
# CIFAR_DIR when set, else random images of CIFAR's shape (gpu_round says which).
# QUICK=1 shrinks every measurement to a few batches: the plumbing, on any machine (a CPU too).
# LIMIT_S=N bounds every stage to N seconds (default: 420 each, 300 for grpc).
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: bash benchmarks/gpu_check.sh OUT_DIR [STAGE ...]" >&2; exit 2; }
OUT_DIR=$1
shift
ALL="env tests cnn kernels resnet job tf32 grpc networks memory"
STAGES=${*:-$ALL}
for s in $STAGES; do  # every name checked before anything runs
  [[ " $ALL " == *" $s "* ]] || { echo "gpu_check: unknown stage '$s' (stages: $ALL)" >&2; exit 2; }
done
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
QUICK=${QUICK:-0}
quick() { [ "$QUICK" = 1 ] && echo "$1" || echo "$2"; }
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 WANDB_MODE=offline
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
WHEELS=${WHEELS:-.whl}
if compgen -G "$WHEELS/*.whl" >/dev/null; then  # what this Python lacks, carried as wheels
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$OUT_DIR/site" \
    "$WHEELS"/*.whl >"$OUT_DIR/wheels.log" 2>&1 || { echo "gpu_check: the wheels of $WHEELS did not install: $OUT_DIR/wheels.log" >&2; exit 1; }
  export PYTHONPATH="$PYTHONPATH:$OUT_DIR/site"
fi
CIFAR=${CIFAR_DIR:+--data $CIFAR_DIR}
FASHION=${FASHION_MNIST_DIR:+--set data_args.data_cache_dir=$FASHION_MNIST_DIR}
ROUNDS=$(quick 1 5)
# QUICK: a few batches per party
SMALL=$(quick "--set data_args.max_train_samples=640 --set data_args.max_test_samples=500 --set train_args.epochs=1" "")

# The test files that hold CUDA cases (only these: the others import FedML, which may be missing).
cuda_test_files() { grep -l -E 'cuda_only|CUDA_ONLY|^@CUDA$' tests/test_*.py; }

note() { echo "gpu_check: $*" | tee -a "$OUT_DIR/figures.txt" >&2; }

# stage NAME LIMIT_S COMMAND...: run it, its output to NAME.log, its key=value lines to figures.txt
stage() {
  local name=$1 limit=${LIMIT_S:-$2} started rc
  shift 2
  started=$(date +%s)
  timeout --signal=TERM --kill-after=20 "$limit" "$@" >"$OUT_DIR/$name.log" 2>&1
  rc=$?
  grep -E '^[^ ]*[a-z_]+=[^ ]+|device: |training on |round [0-9]+: test_acc|done: final_test_acc|passed|failed' \
    "$OUT_DIR/$name.log" | sed "s/^/$name: /" >>"$OUT_DIR/figures.txt"
  note "$name: exit $rc in $(($(date +%s) - started)) s$([ $rc = 124 ] && echo " (out of its $limit s)")"
}

have_fedml() {
  local parts="import fedml_moon.distributed.managers, fedml_moon.adapters.trainer"  # FedML's parts, as a run
  "$PY" -c "$parts" >/dev/null 2>&1 && return 0
  note "$1: skipped: FedML's parts do not import with $("$PY" --version 2>&1) ($("$PY" -c "$parts" 2>&1 | tail -n 1))"
  return 1
}

# shellcheck disable=SC2206 (the settings split into words)
SIMULATE=("$PY" -m fedml_moon simulate --cf config/fashion_mnist/moon.yaml $FASHION $SMALL)

env_stage() {
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 || true
    "$PY" - <<'PYTHON'
import sys

import torch

cuda = torch.cuda.is_available()
print(f"python={sys.version.split()[0]} torch={torch.__version__} cuda={torch.version.cuda} gpu={cuda}")
if cuda:
    p = torch.cuda.get_device_properties(0)
    print(f"device={p.name.replace(' ', '_')} sms={p.multi_processor_count} memory_gib={p.total_memory / 2**30:.1f}")
try:
    import fedml_moon.distributed.managers  # noqa: F401 (FedML's parts, as a run imports them)
    from importlib.metadata import version

    print(f"fedml={version('fedml')} numpy={version('numpy')}")
except Exception as exc:  # any failure to import is the answer
    print(f"fedml=none ({type(exc).__name__}: {exc})")
PYTHON
  } >"$OUT_DIR/env.txt" 2>&1
  sed 's/^/env: /' "$OUT_DIR/env.txt" >>"$OUT_DIR/figures.txt"
}

# Ask each process to stop (they write their records), then kill what is left after 15 s.
stop_all() {
  kill "$@" 2>/dev/null
  for _ in $(seq 15); do
    any_alive "$@" || return 0
    sleep 1
  done
  kill -9 "$@" 2>/dev/null
}
any_alive() {
  local pid
  for pid in "$@"; do kill -0 "$pid" 2>/dev/null && return 0; done
  return 1
}

# The server and silo 2 on the CPU, silo 1 on the GPU (device_args.gpu_id 0), over gRPC on a free port of
# 127.0.0.1.
grpc_stage() {
  local port ipconfig="$OUT_DIR/runs/grpc_ipconfig.csv"
  port=$("$PY" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  mkdir -p "$OUT_DIR/runs"
  printf 'eid,rank,grpc_server_ip,grpc_server_port,ingress_ip\n0,0,127.0.0.1,%s,127.0.0.1\n' "$port" >"$ipconfig"
  local run=(-m fedml_moon run --cf config/modes/moon_cross_silo_grpc.yaml $FASHION $SMALL
    --set comm_args.grpc_ipconfig_path="$ipconfig"
    --set train_args.client_num_in_total=2 --set train_args.client_num_per_round=2
    --set train_args.comm_round="$ROUNDS" --set tracking_args.enable_wandb=false --overwrite)
  local pids=() rc=0 pid
  trap 'stop_all "${pids[@]}"' EXIT
  trap 'exit 143' TERM
  "$PY" "${run[@]}" --rank 0 --role server --output-dir "$OUT_DIR/runs/grpc" &
  pids+=($!)
  "$PY" "${run[@]}" --rank 1 --role client --set device_args.using_gpu=true --output-dir "$OUT_DIR/runs/grpc-silo1" &
  pids+=($!)
  "$PY" "${run[@]}" --rank 2 --role client --output-dir "$OUT_DIR/runs/grpc-silo2" &
  pids+=($!)
  for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
  # the server's final accuracy as a figure (key=value) for figures.txt
  "$PY" -c "import json, sys; print(f\"final_test_acc={json.load(open(sys.argv[1]))['final_test_acc']}\")" \
    "$OUT_DIR/runs/grpc/summary.json" 2>/dev/null
  return "$rc"
}
export -f grpc_stage stop_all any_alive
export PY FASHION SMALL ROUNDS OUT_DIR

for s in $STAGES; do
  case $s in
    env) env_stage ;;
    tests) stage tests 420 "$PY" -m pytest -q -rs -m cuda -p no:cacheprovider $(cuda_test_files) ;;
    cnn) stage cnn 420 "$PY" benchmarks/gpu_round.py --setting cifar10-cnn $CIFAR \
      --epochs "$(quick 1 2)" $(quick "--samples 256" "") ;;
    kernels) stage kernels 420 "$PY" benchmarks/gpu_round.py --setting cifar10-cnn $CIFAR --epochs 1 --profile \
      $(quick "--samples 256" "") --modes batched $(quick "" "graphs streams sequential-graphs") ;;
    resnet) stage resnet 420 "$PY" benchmarks/gpu_round.py --setting cifar100-resnet50 $CIFAR --epochs 1 \
      --samples "$(quick 320 5000)" --channels-last \
      --modes sequential sequential-bf16 $(quick "" "sequential-graphs-bf16 streams-bf16") ;;
    job) have_fedml job && stage job 420 "${SIMULATE[@]}" --output-dir "$OUT_DIR/runs/job" --overwrite \
      --set train_args.comm_round="$ROUNDS" ;;
    tf32) have_fedml tf32 && for p in tf32 bf16; do
      stage "$p" 420 "${SIMULATE[@]}" --output-dir "$OUT_DIR/runs/$p" --overwrite --set train_args.comm_round="$ROUNDS" \
        --set train_args.precision=$p
    done ;;
    grpc) have_fedml grpc && stage grpc 300 bash -c grpc_stage ;;
    networks) have_fedml networks && stage networks 420 "$PY" benchmarks/networks.py --gpu \
      --samples "$(quick 64 2048)" --repeats "$(quick 1 2)" ;;
    memory) have_fedml memory && stage memory 420 "$PY" benchmarks/party_memory.py --gpu \
      --parties "$(quick 4 100)" $CIFAR ;;
  esac
done
note "done: $OUT_DIR"
