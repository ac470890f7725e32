"""Every command the README and the docs show, run as written from the repository root, at tiny scale.

`readme_commands()` collects them from README.md and every page under docs/ (DOC_FILES): each line of
the ```bash blocks and every inline `...`
span that starts with `.venv/bin/`, `bash run/` or `mpirun`. Each must be a key of COMMANDS, which
says how this file runs it; a command the README gains without an entry here fails
`test_the_readme_shows_only_commands_this_file_runs`, and so does an entry the README lost.

A run appends only tiny-scale `--set` values (TINY; a key the command sets itself keeps its value)
and an output folder under tmp; placeholders are substituted (RANK, R, RUN_DIR, `...`, `edge.yaml`,
`certs/`, the sweeps' `outputs/sweeps/...`). Single-process commands run through
`fedml_moon.cli.main` in this process (the `fedml-moon` entry point, without paying for a Python and
FedML start-up each), everything else as real processes. Not run inside the suite, checked instead:
`bash run/main.sh` and `bash run/test.sh` (they install, then run the main job / the whole suite:
their contents are checked and the command main.sh execs is run), the pip installs (setup.sh runs
them; the packages imported are this tree's), the benchmarks (measurements, minutes each at full
scale, some for a GPU: each script exists, compiles and takes the options shown) and the
conformance check (run as written by tests/test_contributor_kit.py) and the GPU checks (run as
written, at quick scale on the CPU, by tests/test_gpu_check.py). The two sweeps run with all
but three of their runs already complete (copies of a tiny run, so the sweep skips them): the
commands, the skip logic and the report run for real, 3 tiny runs instead of 42.

Every process started here runs on 127.0.0.1, has its wait bounded and is stopped at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import runpy
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from fedml_moon import conformance
from fedml_moon.config.load import config_to_dict, load_config
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from fedml_moon.results.sweep import load_sweep
from tests.support.cli import restored_main
from tests.support.site_data import party_folders

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOC_FILES = [README, *sorted(p for p in (ROOT / "docs").rglob("*.md") if "results" not in p.parts)]
"""Where commands are shown: the README and the documentation's pages (the generated reports aside)."""
PREFIXES = (".venv/bin/", "bash run/", "mpirun")
needs_fmnist = pytest.mark.skipif(
    not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist"
)

TINY = [
    "data_args.max_train_samples=100",
    "data_args.max_test_samples=50",
    "train_args.client_num_in_total=2",
    "train_args.client_num_per_round=2",
    "train_args.comm_round=1",
    "train_args.epochs=1",
    "train_args.batch_size=16",
    "device_args.torch_threads=1",
    "tracking_args.enable_wandb=false",
]
"""Appended to every run (smaller than conformance.TINY: this file only asks whether a command runs)."""

NOISE = ("RequestsDependencyWarning", "pkg_resources is deprecated", "args.rank = ")
"""What FedML's start-up used to print in every process (tests `fedml_moon.adapters.compat`)."""
LOG_LINE = re.compile(r"\d\d:\d\d:\d\d( rank \d+( process \d+)?)? [A-Z]+ \S+: ")

MAIN_JOB = "bash run/main.sh --set train_args.comm_round=5"
STANDALONE = ".venv/bin/fedml-moon simulate --cf config/fashion_mnist/moon.yaml"
SYNOPSIS = (
    ".venv/bin/fedml-moon simulate --cf config/fashion_mnist/moon.yaml --set algorithm_args.mu=5 "
    "--output-dir outputs/moon-mu5"
)
STATUS = ".venv/bin/fedml-moon status outputs/moon-mu5"
PYTHON_M = (
    ".venv/bin/python -m fedml_moon simulate --cf config/fashion_mnist/moon.yaml --set algorithm_args.mu=5 "
    "--output-dir outputs/moon-mu5-again"
)
HEADPROX = ".venv/bin/fedml-moon simulate --cf examples/headprox/headprox.yaml"
CERTS = ".venv/bin/fedml-moon certs certs/ --silos 10 --host server.example.org --host 203.0.113.5"
MPI_SIMULATION = "bash run/mpirun.sh 3 simulate --cf config/modes/moon_mpi_simulation.yaml"
MPI_CROSS_SILO = "bash run/mpirun.sh run --cf config/modes/moon_cross_silo_mpi.yaml"
MPI_HOSTS = (
    "bash run/mpirun.sh --hostfile config/modes/mpi_hostfile run --cf config/modes/moon_cross_silo_mpi.yaml"
)
MPI_HIERARCHICAL = (
    MPI_CROSS_SILO + " --set common_args.scenario=hierarchical --set device_args.n_proc_per_node=2"
)
_TORCHRUN = (
    ".venv/bin/torchrun --nnodes {nodes} --nproc-per-node {procs}"
    " --master-addr 127.0.0.1 --master-port {port}"
)
_SILO_1 = (
    " -m fedml_moon run --cf config/modes/moon_cross_silo_grpc.yaml --rank 1 --role client"
    " --set common_args.scenario=hierarchical"
)
HIERARCHICAL = [
    _TORCHRUN.format(nodes=1, procs=2, port=29500) + _SILO_1 + " --set device_args.n_proc_per_node=2",
    *(
        _TORCHRUN.format(nodes=f"2 --node-rank {k}", procs=1, port=29501)
        + _SILO_1
        + " --set device_args.n_node_in_silo=2"
        for k in (0, 1)
    ),
]
GRPC_SERVER = "bash run/run_server.sh"
GRPC_SILO = "bash run/run_client.sh RANK"
EDGE = ".venv/bin/fedml-moon run --cf config/modes/moon_edge_mqtt_s3.yaml --rank R"
EDGE_COPY = ".venv/bin/fedml-moon run --cf edge.yaml --rank R"
MOTO = ".venv/bin/moto_server -p 5000 &"
SWEEP = ".venv/bin/fedml-moon sweep config/sweeps/fashion_mnist.yaml --jobs 2"
SWEEP_LIST = ".venv/bin/fedml-moon sweep config/sweeps/fashion_mnist.yaml --list"
SWEEP_LIST_SET = (
    ".venv/bin/fedml-moon sweep config/sweeps/fashion_mnist.yaml --set train_args.epochs=2 --list"
)
REPORT = ".venv/bin/fedml-moon report outputs/sweeps/fashion_mnist"
TSNE = ".venv/bin/fedml-moon tsne RUN_DIR --party 0"
SWEEP_LG = ".venv/bin/fedml-moon sweep config/sweeps/fashion_mnist_lg.yaml --jobs 2"
REPORT_LG = ".venv/bin/fedml-moon report outputs/sweeps/fashion_mnist_lg"
SWEEP_DP = ".venv/bin/fedml-moon sweep config/sweeps/fashion_mnist_dp.yaml --jobs 1"
REPORT_DP = ".venv/bin/fedml-moon report outputs/sweeps/fashion_mnist_dp"
SWEEP_PRECISION = ".venv/bin/fedml-moon sweep config/sweeps/fashion_mnist_precision.yaml --jobs 1"
REPORT_PRECISION = ".venv/bin/fedml-moon report outputs/sweeps/fashion_mnist_precision"
SECURE = (
    ".venv/bin/fedml-moon simulate --cf config/fashion_mnist/moon.yaml "
    "--set privacy_args.secure_aggregation=true"
)
CERTS_LOCAL = ".venv/bin/fedml-moon certs certs/ --silos 3 --host 127.0.0.1"
TLS_SERVER = (
    "bash run/run_server.sh --set train_args.client_num_in_total=3 --set train_args.client_num_per_round=3 "
    "--set comm_args.tls=on --set comm_args.tls_ca=certs/ca.pem "
    "--set comm_args.tls_cert=certs/server.pem --set comm_args.tls_key=certs/server.key"
)
TLS_SILO = (
    "bash run/run_client.sh RANK --set comm_args.tls=on --set comm_args.tls_ca=certs/ca.pem "
    "--set comm_args.tls_cert=certs/silo-RANK.pem --set comm_args.tls_key=certs/silo-RANK.key"
)
WATCHED_SERVER = (
    f"{TLS_SERVER} --set tracking_args.status_port=8891 "
    "--set tracking_args.status_tokens=certs/server-tokens.json"
)
SCRAPE_CONFIG = "cp examples/monitoring/prometheus.yml prometheus.yml"
SCRAPE = "prometheus --config.file=prometheus.yml"
WATCH_STATUS = (
    ".venv/bin/fedml-moon status https://127.0.0.1:8891/ --token certs/operator.token --ca certs/ca.pem"
)
OWN_CERTS = (
    ".venv/bin/fedml-moon certs certs/ --silos 3 --host 127.0.0.1 "
    "--max-samples 1=20000 --max-samples 2=20000 --max-samples 3=20000"
)
OWN_SERVER = (
    "bash run/run_server.sh config/site/cross_silo.yaml "
    "--set comm_args.tls=on --set comm_args.tls_ca=certs/ca.pem "
    "--set comm_args.tls_cert=certs/server.pem --set comm_args.tls_key=certs/server.key"
)
OWN_CHECK = ".venv/bin/fedml-moon data data/site/parties/party-a --cf config/site/cross_silo.yaml"
OWN_SILOS = [
    f"bash run/run_client.sh {r} config/site/cross_silo.yaml "
    f"--set data_args.data_cache_dir=data/site/parties/{name} "
    "--set comm_args.tls=on --set comm_args.tls_ca=certs/ca.pem "
    f"--set comm_args.tls_cert=certs/silo-{r}.pem --set comm_args.tls_key=certs/silo-{r}.key"
    for r, name in ((1, "party-a"), (2, "party-b"), (3, "party-c"))
]
CONFIG_ALL = ".venv/bin/fedml-moon config"
ROBUST = (
    ".venv/bin/python benchmarks/robust_aggregation.py --rounds 12 --epochs 2 --samples 12000 "
    "--plot docs/images/robust_aggregation.png"
)
TSNE_RUNS = [
    f".venv/bin/fedml-moon simulate --cf config/fashion_mnist/{algorithm}.yaml "
    "--set data_args.partition_alpha=0.1 --set train_args.comm_round=10 --set train_args.epochs=5 "
    f"--set train_args.save_party_models=true --output-dir outputs/tsne/{algorithm}_dir0.1"
    for algorithm in ("fedavg", "moon")
]
TSNE_PAIR = (
    ".venv/bin/fedml-moon tsne outputs/tsne/fedavg_dir0.1 outputs/tsne/moon_dir0.1 --party 0 --samples 1000 "
    "--out docs/images/tsne_moon_fedavg.png"
)
CONFIG_KEY = ".venv/bin/fedml-moon config algorithm_args.mu"
DP = (
    ".venv/bin/fedml-moon simulate --cf config/fashion_mnist/moon.yaml --set privacy_args.dp_clip_norm=2.0 "
    "--set privacy_args.dp_noise_multiplier=0.1"
)
BUFFERED = (
    ".venv/bin/fedml-moon simulate --cf config/fashion_mnist/moon.yaml "
    "--set server_args.aggregation=buffered --set server_args.buffer_size=5 "
    "--set train_args.party_speed=lognormal --output-dir outputs/moon-buffered"
)
BUFFERED_PRIVATE = (
    ".venv/bin/fedml-moon simulate --cf config/fashion_mnist/moon.yaml "
    "--set server_args.aggregation=buffered --set server_args.buffer_size=3 --set server_args.concurrency=5 "
    "--set train_args.party_speed=lognormal "
    "--set privacy_args.secure_aggregation=true --set privacy_args.dp_clip_norm=1.0 "
    "--set privacy_args.dp_noise_multiplier=0.3 --set validation_args.local_test=false "
    "--set train_args.comm_round=5 --output-dir outputs/moon-buffered-private"
)
REPLAY = ".venv/bin/fedml-moon replay outputs/moon-buffered"
_COMPARE = (
    ".venv/bin/fedml-moon simulate --cf config/fashion_mnist/fedavg.yaml "
    "{}--set train_args.party_speed=lognormal --set train_args.comm_round=20 --set train_args.epochs=1 "
    "--set train_args.learning_rate=0.05 --set data_args.max_train_samples=10000 "
    "--output-dir outputs/stragglers/{}"
)
COMPARE_RUNS = [
    _COMPARE.format("", "sync"),
    _COMPARE.format("--set server_args.aggregation=buffered --set server_args.buffer_size=5 ", "buffered"),
]
COMPARE_REPORT = ".venv/bin/fedml-moon report outputs/stragglers --target 0.3"
SPLIT_RUNS = [
    ".venv/bin/fedml-moon simulate --cf config/fashion_mnist/moon.yaml --output-dir outputs/split-a",
    ".venv/bin/fedml-moon simulate --cf config/fashion_mnist/moon.yaml --set data_args.partition_method=file "
    "--set data_args.partition_path=outputs/split-a/partition.json --output-dir outputs/split-b",
]

SITE_WRITE = ".venv/bin/python examples/site_data/write.py data/site"
SITE_RUNS = [
    f".venv/bin/fedml-moon simulate --cf config/site/{name}.yaml"
    for name in ("folder", "parties", "hf", "plugin")
]
SITE_TABLES = [
    ".venv/bin/fedml-moon simulate --cf config/site/table.yaml",
    ".venv/bin/fedml-moon simulate --cf config/site/table.yaml"
    " --set data_args.data_cache_dir=data/site/parquet",
]
SITE_INSPECT = [
    ".venv/bin/fedml-moon data data/site/folder --cf config/site/folder.yaml",  # decodes for the run after
    ".venv/bin/fedml-moon data data/site/parties --natural",
]
_NET = ".venv/bin/fedml-moon simulate --cf config/networks/resnet18.yaml"
NETWORK_WRITE = ".venv/bin/python examples/site_data/write.py data/site --train 600 --test 200 --rgb"
NETWORK_RUNS = [  # in order: the last starts from the model the one before it wrote
    _NET,
    _NET + " --set model_args.model=timm:vit_tiny_patch16_224",
    _NET + " --set model_args.model=examples/networks/groupnorm_cnn.py:encoder",
    _NET + " --output-dir outputs/resnet18",
    _NET + " --set model_args.pretrained=outputs/resnet18/final_model.pt",
]
NETWORK_CHECK = (
    ".venv/bin/fedml-moon check moon --cf config/fashion_mnist/moon.yaml --model "
    "examples/networks/groupnorm_cnn.py:encoder --modes standalone,cross-silo-grpc"
)

CLUSTER = ".venv/bin/fedml-moon sweep config/sweeps/fashion_mnist_lg.yaml"
CLUSTER_LOCAL = f"{CLUSTER} --on local --jobs 2"
CLUSTER_SLURM = f"{CLUSTER} --on slurm --partition PARTITION --time 30 --cpus 2"
CLUSTER_STATUS = f"{CLUSTER} --status"
CLUSTER_WAIT = f"{CLUSTER} --on slurm --wait"

COMMANDS: dict[str, str] = {
    "bash run/main.sh": "script",
    CLUSTER_LOCAL: "cluster",
    CLUSTER_SLURM: "cluster",
    CLUSTER_STATUS: "cluster",
    CLUSTER_WAIT: "cluster",
    "bash run/test.sh": "script",
    "bash run/test.sh --quick": "script",  # .ci/run runs it after the whole suite, timed
    ".venv/bin/python benchmarks/suite_budget.py --top 20": "benchmark",  # run/test.sh runs it
    "bash run/setup.sh": "setup",  # tests/test_docs.py (nothing the second time), tests/test_interpreters.py
    MAIN_JOB: "single",
    SYNOPSIS: "single",
    STATUS: "single",
    PYTHON_M: "single",
    STANDALONE: "single",
    HEADPROX: "single",
    CERTS: "single",
    SWEEP: "single",
    SWEEP_LIST: "single",
    SWEEP_LIST_SET: "single",
    REPORT: "single",
    TSNE: "single",
    SWEEP_LG: "single",
    REPORT_LG: "single",
    SWEEP_DP: "single",
    REPORT_DP: "single",
    SWEEP_PRECISION: "single",
    REPORT_PRECISION: "single",
    SECURE: "single",
    DP: "single",
    CONFIG_ALL: "single",
    TSNE_RUNS[0]: "single",
    TSNE_RUNS[1]: "single",
    TSNE_PAIR: "single",
    CONFIG_KEY: "single",
    **dict.fromkeys(SPLIT_RUNS, "single"),
    BUFFERED: "single",
    REPLAY: "single",
    **dict.fromkeys([*COMPARE_RUNS, COMPARE_REPORT], "single"),
    BUFFERED_PRIVATE: "single",
    SITE_WRITE: "site-data",
    NETWORK_WRITE: "network",
    **dict.fromkeys(NETWORK_RUNS, "network"),
    NETWORK_CHECK: "network-check",  # run as written by tests/test_network_runs.py
    ".venv/bin/python benchmarks/networks.py": "benchmark",
    **dict.fromkeys([*SITE_RUNS, *SITE_TABLES, *SITE_INSPECT], "site-data"),
    MPI_SIMULATION: "mpi",
    CERTS_LOCAL: "grpc-tls",
    TLS_SERVER: "grpc-tls",
    TLS_SILO: "grpc-tls",
    WATCHED_SERVER: "grpc-tls",
    WATCH_STATUS: "grpc-tls",
    SCRAPE_CONFIG: "grpc-tls",
    SCRAPE: "grpc-tls",
    OWN_CERTS: "own-data",
    OWN_SERVER: "own-data",
    OWN_CHECK: "own-data",
    **dict.fromkeys(OWN_SILOS, "own-data"),
    "bash run/docs.sh": "docs",  # run/test.sh runs it; tests/test_docs.py breaks it on purpose
    ".venv/bin/mkdocs serve": "docs",  # a server for editing: the site it serves is the one built
    MPI_CROSS_SILO: "mpi",
    MPI_HOSTS: "mpi",
    MPI_HIERARCHICAL: "mpi",
    GRPC_SERVER: "grpc",
    GRPC_SILO: "grpc",
    EDGE: "mqtt",
    EDGE_COPY: "mqtt",
    MOTO: "mqtt",
    ".venv/bin/fedml-moon check fedprox_head --cf examples/headprox/headprox.yaml --modes standalone": (
        "contributor-kit"
    ),
    ".venv/bin/python benchmarks/stacked_rounding.py": "benchmark",
    ".venv/bin/python benchmarks/silo_round.py": "benchmark",
    ".venv/bin/python benchmarks/site_data.py": "benchmark",
    ".venv/bin/python benchmarks/site_data.py --images 8000 --side 128 --rgb --image-size 64": "benchmark",
    ".venv/bin/python benchmarks/silo_round.py --batch 256": "benchmark",
    ".venv/bin/python benchmarks/silo_round.py --precision fp64": "benchmark",
    ".venv/bin/fedml-moon new fedproto": "tutorial-new",
    **dict.fromkeys(HIERARCHICAL, "hierarchical"),
    ".venv/bin/fedml-moon check fedproto --cf fedproto/fedproto.yaml": "tutorial-new",
    ".venv/bin/fedml-moon check fedproto --cf examples/fedproto/fedproto.yaml --modes standalone": "tutorial",
    ".venv/bin/fedml-moon simulate --cf examples/fedproto/fedproto.yaml --set train_args.comm_round=2": (
        "tutorial"
    ),
    ".venv/bin/pip install -e .": "install",
    ".venv/bin/pip install -e examples/headprox": "install",
    ".venv/bin/pip install --no-deps fedml==0.9.6": "install",  # every lock names it; setup installs them
    ".venv/bin/python benchmarks/transport_cost.py": "benchmark",
    ".venv/bin/python benchmarks/round_time.py --repeats 3": "benchmark",
    ".venv/bin/python benchmarks/gpu_round.py": "benchmark",
    ".venv/bin/python benchmarks/gpu_round.py --setting cifar100-resnet50": "benchmark",
    ".venv/bin/python benchmarks/gpu_round.py --setting cifar100-resnet50 --epochs 2 --samples 6400 "
    "--channels-last --modes sequential streams streams-bf16 sequential-graphs-bf16": "benchmark",
    ".venv/bin/python benchmarks/gpu_round.py --epochs 1 --profile "
    "--modes graphs streams sequential-graphs": "benchmark",
    ".venv/bin/python benchmarks/party_memory.py": "benchmark",
    ".venv/bin/python benchmarks/server_memory.py": "benchmark",
    ".venv/bin/python benchmarks/many_parties.py": "benchmark",
    ".venv/bin/python benchmarks/many_parties.py --parties 100 1000000 --per-party 1 --rounds 3": "benchmark",
    ".venv/bin/python benchmarks/server_memory.py --connections 4": "benchmark",
    ".venv/bin/python benchmarks/server_memory.py --connections 4 --reconnect": "benchmark",
    ".venv/bin/python benchmarks/server_memory.py --token wrong": "benchmark",
    ".venv/bin/python benchmarks/server_memory.py --window-kb 0": "benchmark",
    ".venv/bin/python benchmarks/modes.py": "benchmark",
    ".venv/bin/python benchmarks/buffered.py": "benchmark",
    ".venv/bin/python benchmarks/buffered.py --lr 0.05 --epochs 2": "benchmark",
    ".venv/bin/python benchmarks/startup.py --repeats 5": "benchmark",
    ".venv/bin/python benchmarks/shared_cpu.py --repeats 3": "benchmark",
    ".venv/bin/python benchmarks/recovery.py": "benchmark",  # its drills run in tests/test_own_data.py
    ROBUST: "benchmark",
    ".venv/bin/python benchmarks/secure_round.py": "benchmark",
    ".venv/bin/python benchmarks/secure_round.py --samples 60000": "benchmark",
    ".venv/bin/python benchmarks/secagg_unmask.py --parties 10 50 100 --length 100000": "benchmark",
    ".venv/bin/python benchmarks/secagg_unmask.py --parties 10 50 100 --length 100000 --neighbours 8": (
        "benchmark"
    ),
    # 21 recorded runs, 4 minutes; their digests are bitwise for one machine and PyTorch build
    ".venv/bin/python tests/support/recorded_runs.py --check tests/support/recorded_runs.json": "benchmark",
    # every GPU check: run at quick scale on the CPU (its folder and stages given) by tests/test_gpu_check.py
    "bash benchmarks/gpu_check.sh outputs/gpu_check": "gpu-check",
    # the general form of the two run/mpirun.sh rows above (its flags: tests/test_cli.py)
    "bash run/mpirun.sh [--hostfile FILE] [NP] ARGS...": "synopsis",
    "mpirun -np NP .venv/bin/fedml-moon ARGS...": "synopsis",
    "bash run/run_client.sh RANK CONFIG ...": "synopsis",  # its usage line; run above with the default
    "mpirun -np W+1": "fragment",  # prose: the MPI simulation's rank count
    "mpirun": "fragment",  # prose: the Tests section names the tool
    ".venv/bin/python -m fedml_moon": "fragment",  # prose: the command-line page names the module
}
"""Every command of the README and the docs -> the test that runs (or checks) it."""


def readme_commands(text: str) -> list[str]:
    """The README's commands, whitespace normalised, in order, each once."""
    found: list[str] = []
    blocks = re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M)
    for block in blocks:
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = re.sub(r"(^|\s)#.*$", "", line).strip()
            if line:
                found.append(" ".join(line.split()))
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    for span in re.findall(r"`([^`\n]+)`", prose):
        if span.startswith(PREFIXES):
            found.append(" ".join(span.split()))
    return list(dict.fromkeys(found))


def shown_commands() -> dict[str, list[str]]:
    """Every command of README.md and the docs -> the files that show it."""
    shown: dict[str, list[str]] = {}
    for path in DOC_FILES:
        for command in readme_commands(path.read_text()):
            shown.setdefault(command, []).append(str(path.relative_to(ROOT)))
    return shown


def test_the_docs_show_only_commands_this_file_runs():
    shown = shown_commands()
    unknown = {c: files for c, files in shown.items() if c not in COMMANDS}
    assert not unknown, f"commands this file cannot run (add them to COMMANDS): {unknown}"
    gone = [c for c in COMMANDS if c not in shown]
    assert not gone, f"COMMANDS that neither the README nor the docs show any more (remove them): {gone}"


def _script(name: str) -> list[str]:
    return [line.strip() for line in (ROOT / "run" / name).read_text().splitlines()]


def _exec_line() -> str:
    """The command run/main.sh execs, "$@" left out."""
    (line,) = [x for x in _script("main.sh") if x.startswith("exec ")]
    assert line.endswith(' "$@"'), line
    return line.removeprefix("exec ").removesuffix(' "$@"')


def test_scripts_installs_and_benchmarks_the_suite_does_not_run():
    # run/main.sh and run/test.sh install first (README: "installs, then ...")
    main_sh, test_sh = _script("main.sh"), _script("test.sh")
    assert main_sh.index("bash run/setup.sh") < main_sh.index(f'exec {_exec_line()} "$@"')
    assert _exec_line() == STANDALONE  # the main job is the standalone row's command, run below
    setup = test_sh.index("bash run/setup.sh --tests || exit 1")
    steps = [
        ".venv/bin/ruff check fedml_moon tests benchmarks examples docs || exit 1",
        ".venv/bin/ruff format --check fedml_moon tests benchmarks examples docs || exit 1",
        "bash run/docs.sh || exit 1",  # the documentation, built --strict
        ".venv/bin/python -m pytest -q -n auto --dist load --maxschedchunk 2"
        ' --junitxml=outputs/suite/junit.xml "$@"',
        ".venv/bin/python benchmarks/suite_budget.py --top 10 >&2",  # where the time went
    ]
    positions = [test_sh.index(step) for step in steps]
    assert setup < positions[0] and positions == sorted(positions)
    quick = test_sh.index('.venv/bin/python -m pytest -q -n auto --dist load -m "not slow" "$@"')
    assert positions[1] < quick < positions[2]  # --quick: lint, then the tests not marked slow
    assert "bash run/test.sh --quick" in (ROOT / ".ci" / "run").read_text()  # and CI times it
    assert (ROOT / ".venv/bin/mkdocs").is_file()  # `mkdocs serve` serves what run/docs.sh builds
    # the pip installs: run/setup.sh runs them, and the packages imported are this tree's
    setup_sh = "\n".join(_script("setup.sh"))
    assert 'pip_install -q --no-deps -r "$LOCK"' in setup_sh  # every version from the Python's lock
    for lock in sorted((ROOT / "requirements").glob("py3.*.txt")):
        assert "\nfedml==0.9.6\n" in lock.read_text(), lock  # FedML, installed without its pins
    assert 'pip_install -q --no-deps -e ".[test]"' in setup_sh
    assert "pip_install -q --no-deps -e examples/headprox" in setup_sh
    import fedml_moon_headprox

    import fedml_moon

    assert Path(fedml_moon.__file__).resolve().parent == ROOT / "fedml_moon"
    assert Path(fedml_moon_headprox.__file__).resolve().is_relative_to(ROOT / "examples" / "headprox")
    # benchmarks: the script exists, compiles and takes every option the README gives it
    for command in (c for c, kind in COMMANDS.items() if kind == "benchmark"):
        words = shlex.split(command)
        source = (ROOT / words[1]).read_text()
        compile(source, words[1], "exec")
        for option in (w for w in words[2:] if w.startswith("--")):
            assert f'"{option}"' in source, f"{command}: {words[1]} has no {option}"
    # the GPU checks run, as written at quick scale, in tests/test_gpu_check.py
    from tests import test_gpu_check

    assert [c for c, kind in COMMANDS.items() if kind == "gpu-check"] == [test_gpu_check.COMMAND]
    # the conformance check runs, as written, in tests/test_contributor_kit.py
    from tests import test_contributor_kit

    (check,) = [c for c, kind in COMMANDS.items() if kind == "contributor-kit"]
    assert test_contributor_kit.CHECK_COMMAND == check


# --- helpers for the runs -------------------------------------------------------------------------


def _sets(command: str) -> list[str]:
    """`--set` arguments of TINY, leaving out keys the command sets itself."""
    words = shlex.split(command)
    own = {words[i + 1].split("=", 1)[0] for i, w in enumerate(words[:-1]) if w == "--set"}
    return [a for item in TINY if item.split("=", 1)[0] not in own for a in ("--set", item)]


def _env(home: Path) -> dict[str, str]:
    """The environment of a shell: no mpirun root permission here (run/mpirun.sh must add it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_ALLOW_RUN_AS_ROOT")}
    env.update(HOME=str(home), PYTHONUNBUFFERED="1", AWS_ACCESS_KEY_ID="testing")
    env.update(AWS_SECRET_ACCESS_KEY="testing")  # moto takes any
    return env


def _quiet(log_path: Path) -> str:
    """The process's output: its first line is the plugin's own log, and FedML's noise is gone (a
    sweep's run.log starts with the `$ command` line the sweep writes)."""
    text = re.sub(r"\A\$ .*\n", "", log_path.read_text(errors="replace"))
    assert text and LOG_LINE.match(text), f"{log_path.name} starts with: {text[:300]!r}"
    noise = [s for s in NOISE if s in text]
    assert not noise, f"{log_path.name} prints {noise}"
    return text


def _run_all(cmds: list[list[str]], folder: Path, home: Path, timeout_s: float) -> list[Path]:
    """Start the commands from the repository root (a second apart, in order), wait for all (bounded),
    stop every one; assert each exited 0. Returns their logs."""
    folder.mkdir(parents=True, exist_ok=True)
    logs = [folder / f"process-{i}.log" for i in range(len(cmds))]
    procs = []
    try:
        for i, (cmd, log_path) in enumerate(zip(cmds, logs, strict=True)):
            if i:
                time.sleep(1.0)
            procs.append(conformance.spawn(cmd, log_path, _env(home), ROOT))
        codes = conformance.wait_all(procs, timeout_s)
    finally:
        for proc in procs:
            conformance.stop(proc)
    tails = "\n".join(
        f"--- {p.name}: {c}\n{p.read_text(errors='replace')[-3000:]}"
        for p, c in zip(logs, codes, strict=True)
    )
    assert codes == [0] * len(cmds), tails
    return logs


def _wait_for_text(log_path: Path, text: str, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while text not in (log_path.read_text(errors="replace") if log_path.exists() else ""):
        assert time.monotonic() < deadline, f"{text!r} not in {log_path}"
        time.sleep(0.2)


def _completed(out_dir: Path, rounds: int) -> dict:
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == rounds, summary
    return summary


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    """One HOME for every process here (matplotlib builds its font cache once)."""
    return tmp_path_factory.mktemp("home")


@pytest.fixture
def cli(monkeypatch, home):
    """`fedml_moon.cli.main` from the repository root; what main() sets process-wide is put back."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("HOME", str(home))
    with restored_main() as main:
        yield main


def _entry_point(command: str) -> list[str]:
    """The arguments of a `.venv/bin/fedml-moon` command (given to main())."""
    words = shlex.split(command)
    assert words[0] == ".venv/bin/fedml-moon", command
    return words[1:]


# --- single-process commands ----------------------------------------------------------------------


@needs_fmnist
@pytest.mark.slow
def test_single_process_commands(tmp_path, home, cli, capsys, monkeypatch):
    done: set[str] = set()
    started = time.monotonic()

    # the main job: what `bash run/main.sh --set train_args.comm_round=5` execs, as a real process
    # (also the standalone row's command); its output starts with the plugin's own lines
    args = shlex.split(MAIN_JOB)[2:]
    job = [*shlex.split(_exec_line()), *args, *_sets(MAIN_JOB), "--output-dir", str(tmp_path / "job")]
    _quiet(_run_all([job], tmp_path / "job-logs", home, 300)[0])
    template = tmp_path / "job"
    assert len((template / "metrics.jsonl").read_text().splitlines()) == 5
    _completed(template, 5)
    done |= {MAIN_JOB, STANDALONE}

    # a setting changed, then the same run through `python -m fedml_moon`: the same final model
    words = _entry_point(SYNOPSIS)
    assert words[-2:] == ["--output-dir", "outputs/moon-mu5"]
    assert cli([*words[:-1], str(tmp_path / "mu5"), *_sets(SYNOPSIS), "-v"]) == 0
    assert _completed(tmp_path / "mu5", 1)["config"]["algorithm_args"]["mu"] == 5
    done.add(SYNOPSIS)
    words = _entry_point(STATUS)
    assert words[-1] == "outputs/moon-mu5"  # the run just made, in this test's folder
    capsys.readouterr()
    assert cli([*words[:-1], str(tmp_path / "mu5")]) == 0
    assert "run mu5: moon, round 1 of 1, finished (1 rounds recorded" in capsys.readouterr().out
    done.add(STATUS)
    words = shlex.split(PYTHON_M)
    assert words[:3] == [".venv/bin/python", "-m", "fedml_moon"] and words[-1] == "outputs/moon-mu5-again"
    out = tmp_path / "python-m"
    monkeypatch.setattr(sys, "argv", ["fedml_moon", *words[3:-1], str(out), *_sets(PYTHON_M)])
    with pytest.raises(SystemExit) as exit_code:
        runpy.run_module("fedml_moon", run_name="__main__", alter_sys=True)
    assert exit_code.value.code == 0
    both = [torch.load(d / "final_model.pt", weights_only=True) for d in (tmp_path / "mu5", out)]
    assert all(torch.equal(both[0][k], both[1][k]) for k in both[0])
    done.add(PYTHON_M)

    # privacy: secure aggregation, and DP with its epsilon in every round
    crowd = ["--set", "train_args.client_num_in_total=3", "--set", "train_args.client_num_per_round=3"]
    for command, out in ((SECURE, tmp_path / "secure"), (DP, tmp_path / "dp")):
        extra = crowd if command == SECURE else []  # secure aggregation sums 3 parties at least
        assert cli([*_entry_point(command), *_sets(command), *extra, "--output-dir", str(out)]) == 0
        summary = _completed(out, 1)
        assert summary["secure_aggregation"] == (command == SECURE)
        assert (command == DP) == (summary.get("dp_epsilon_release", 0) > 0)
    done |= {SECURE, DP}

    # buffered aggregation on its simulated clock: the record of the one buffer applied says when
    words = _entry_point(BUFFERED)
    assert words[-2:] == ["--output-dir", "outputs/moon-buffered"]
    assert cli([*words[:-1], str(tmp_path / "buffered"), *_sets(BUFFERED)]) == 0
    record = json.loads((tmp_path / "buffered" / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["sim_time_s"] > 0 and record["parties"] == 5 and "staleness_max" in record
    _completed(tmp_path / "buffered", 1)
    done.add(BUFFERED)
    words = _entry_point(REPLAY)  # that run replayed from its records: the same model
    assert words[-1] == "outputs/moon-buffered"
    capsys.readouterr()
    assert cli([*words[:-1], str(tmp_path / "buffered")]) == 0
    assert "the same model" in capsys.readouterr().out
    _completed(tmp_path / "buffered" / "replay", 1)
    done.add(REPLAY)

    # the stragglers' comparison, two rounds each on tiny data: one report, the two as rows of one
    # setting, with the simulated seconds to the target and accuracy against them
    compare = tmp_path / "stragglers"
    shrink = ["--set", "data_args.max_train_samples=100", "--set", "train_args.comm_round=2"]
    for command in COMPARE_RUNS:
        words = _entry_point(command)
        assert words[-2] == "--output-dir" and words[-1].startswith("outputs/stragglers/")
        folder = compare / Path(words[-1]).name
        assert cli([*words[:-1], str(folder), *_sets(command), *shrink]) == 0
        _completed(folder, 2)
    words = _entry_point(COMPARE_REPORT)
    assert words[1] == "outputs/stragglers"  # the runs' parent folder
    assert cli([words[0], str(compare), *words[2:]]) == 0
    report = (compare / "report" / "report.md").read_text()
    assert "| fedavg | " in report and "| fedavg (aggregation=buffered, buffer_size=5) | " in report
    assert "simulated s to target" in report and "### all runs (target 30.00%)" in report
    assert (compare / "report" / "time_all_runs.png").stat().st_size > 0
    done |= {*COMPARE_RUNS, COMPARE_REPORT}

    # with secure aggregation and DP: every buffer a secure sum of 3 of the 5 parties, each charged
    words, out = _entry_point(BUFFERED_PRIVATE), tmp_path / "buffered-private"
    five = ["--set", "train_args.client_num_in_total=5", "--set", "train_args.client_num_per_round=5"]
    assert cli([*words[:-1], str(out), *_sets(BUFFERED_PRIVATE), *five]) == 0
    ledger = [json.loads(line) for line in (out / "privacy_ledger.jsonl").read_text().splitlines()]
    assert len(ledger) == 5 and all(len(set(r["parties"])) == 3 for r in ledger)
    summary = _completed(out, 5)
    assert summary["secure_aggregation"] and summary["dp_epsilon_release"] == summary["dp_epsilon_server"] > 0
    done.add(BUFFERED_PRIVATE)

    # the example algorithm
    assert cli([*_entry_point(HEADPROX), *_sets(HEADPROX), "--output-dir", str(tmp_path / "headprox")]) == 0
    assert _completed(tmp_path / "headprox", 1)["config"]["train_args"]["algorithm"] == "fedprox_head"
    done.add(HEADPROX)

    # certificates for 10 silos
    assert cli([str(tmp_path / "certs") if w == "certs/" else w for w in _entry_point(CERTS)]) == 0
    written = {p.name for p in (tmp_path / "certs").iterdir()}
    assert {"ca.pem", "server.pem", "silo-10.pem", "silo-10.token", "server-tokens.json"} <= written
    done.add(CERTS)

    # the config reference in the terminal: every section, and one key of every algorithm that has it
    capsys.readouterr()
    assert cli(_entry_point(CONFIG_ALL)) == 0
    out = capsys.readouterr().out
    assert all(f"\n{section}:" in out for section in ("train_args", "privacy_args", "algorithm_args")), out
    assert cli(_entry_point(CONFIG_KEY)) == 0
    assert "temperature" not in (out := capsys.readouterr().out) and "moon" in out and "fedprox" in out
    done |= {CONFIG_ALL, CONFIG_KEY}

    # `--list`, as written (they write nothing)
    capsys.readouterr()
    assert cli(_entry_point(SWEEP_LIST)) == 0
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == 36 and all(line.startswith("fedml-moon simulate --cf ") for line in listed)
    assert cli(_entry_point(SWEEP_LIST_SET)) == 0
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == 36 and all("--set train_args.epochs=2" in line for line in listed)
    done |= {SWEEP_LIST, SWEEP_LIST_SET}

    # the sweeps, all but `real` of their runs already complete (copies of the main job's tiny run),
    # then their reports and a t-SNE picture of a real run
    shards = ["train_args.client_num_in_total=5", "train_args.client_num_per_round=5"]  # 10 classes
    sweeps = (
        (SWEEP, REPORT, (0, 3), []),
        (SWEEP_LG, REPORT_LG, (0,), shards),
        (SWEEP_DP, REPORT_DP, (3,), []),
        (SWEEP_PRECISION, REPORT_PRECISION, (3,), []),  # run 3: FedAvg in bf16
    )
    for sweep, report, real, extra in sweeps:
        words = _entry_point(sweep)
        output = tmp_path / "sweeps" / Path(words[1]).stem
        extra = [*extra, "train_args.save_party_models=true"]
        sets = [*_sets(sweep), *(a for item in extra for a in ("--set", item))]
        runs = load_sweep(words[1], output, sets[1::2])
        for i, run in enumerate(runs):
            if i not in real:
                config = config_to_dict(load_config(run.config, list(run.overrides)))
                _complete_copy(template, run.folder, config)
        assert cli([*words, *sets, "--output", str(output)]) == 0
        ran = sorted(r.name for r in runs if (r.folder / "run.log").is_file())
        assert ran == sorted(runs[i].name for i in real)
        for i in real:
            _quiet(runs[i].folder / "run.log")
            _completed(runs[i].folder, 1)
        report_words = _entry_point(report)
        assert report_words[1] == f"outputs/sweeps/{output.name}"  # the sweep's own output folder
        assert cli([report_words[0], str(output)]) == 0
        assert (output / "report" / "report.md").is_file()
        done |= {sweep, report}
        if sweep == SWEEP:
            run_dir = runs[real[0]].folder
            assert cli([str(run_dir) if w == "RUN_DIR" else w for w in _entry_point(TSNE)]) == 0
            assert (run_dir / "tsne.png").stat().st_size > 10_000
            done.add(TSNE)

    # the Results page's t-SNE: FedAvg and MOON trained (their own rounds and epochs on tiny data),
    # then one picture of both; every path under tmp
    runs = []
    for command in TSNE_RUNS:
        words = _entry_point(command)
        runs.append(tmp_path / words[-1])
        assert cli([*words[:-1], str(runs[-1]), *_sets(command)]) == 0
        assert _completed(runs[-1], 10)["config"]["train_args"]["save_party_models"]
    picture = tmp_path / "tsne_pair.png"
    pair = _entry_point(TSNE_PAIR)
    assert pair[1:3] == [f"outputs/tsne/{run.name}" for run in runs] and pair[-2] == "--out"
    assert cli([pair[0], *map(str, runs), *pair[3:-1], str(picture)]) == 0
    assert picture.stat().st_size > 10_000
    done |= {*TSNE_RUNS, TSNE_PAIR}

    # a partition from a file: the second run reads the first's partition.json and ends on its model
    for command in SPLIT_RUNS:
        words = [str(tmp_path / w) if w.startswith("outputs/split-") else w for w in _entry_point(command)]
        words = [w.replace("=outputs/split-a/", f"={tmp_path}/outputs/split-a/") for w in words]
        assert cli([*words, *_sets(command)]) == 0
        _completed(Path(words[words.index("--output-dir") + 1]), 1)
    first, second = (
        torch.load(tmp_path / f"outputs/split-{x}/final_model.pt", weights_only=True) for x in "ab"
    )
    assert all(torch.equal(first[k], second[k]) for k in first)
    done |= set(SPLIT_RUNS)

    assert done == {c for c, kind in COMMANDS.items() if kind == "single"}
    print(f"single-process README commands: {time.monotonic() - started:.1f} s")


@needs_fmnist
@pytest.mark.slow
def test_site_data_commands(tmp_path, home, capsys, monkeypatch):
    """The data how-to as a user types it, from a folder with the repository's config/ and examples/:
    the example data written, inspected and each shipped site config run (one tiny round; the
    folders' own parties and sizes kept)."""
    for name in ("config", "examples", ".venv"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(home))
    words = shlex.split(SITE_WRITE)
    subprocess.run(words, cwd=tmp_path, check=True, timeout=300, capture_output=True)
    assert {p.name for p in (tmp_path / "data" / "site").iterdir()} >= {"folder", "parties", "csv", "hf"}
    tiny = ["train_args.comm_round=1", "train_args.epochs=1", "device_args.torch_threads=1"]
    with restored_main() as main:
        for command in SITE_INSPECT:
            capsys.readouterr()
            assert main(_entry_point(command)) == 0, capsys.readouterr().out
            said = capsys.readouterr().out
            assert "problems: none" in said and ("--cf" not in command or "\n  passed\n" in said), said
        for i, command in enumerate([*SITE_RUNS, *SITE_TABLES]):
            out = tmp_path / f"run-{i}"
            sets = [a for s in tiny for a in ("--set", s)]
            assert main([*_entry_point(command), *sets, "--output-dir", str(out)]) == 0, command
            _completed(out, 1)


@needs_fmnist
@pytest.mark.slow
def test_network_commands(tmp_path, home, capsys, monkeypatch):
    """The network how-to as a user types it, from a folder with the repository's config/ and
    examples/: the RGB folders written, then each run (one tiny round), in order: the last starts
    from the model the one before it wrote, and says so."""
    pytest.importorskip("timm")
    for name in ("config", "examples", ".venv"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(home))
    subprocess.run(shlex.split(NETWORK_WRITE), cwd=tmp_path, check=True, timeout=300, capture_output=True)
    assert len(list((tmp_path / "data" / "site" / "rgb").iterdir())) == 3
    tiny = ["train_args.comm_round=1", "train_args.epochs=1", "device_args.torch_threads=1"]
    with restored_main() as main:
        for i, command in enumerate(NETWORK_RUNS):
            out = tmp_path / ("outputs/resnet18" if "--output-dir" in command else f"run-{i}")
            own = [] if "--output-dir" in command else ["--output-dir", str(out)]
            capsys.readouterr()
            args = [*_entry_point(command), *(a for t in tiny for a in ("--set", t)), *own]
            assert main(args) == 0, command
            _completed(out, 1)
    said = capsys.readouterr()
    loaded = "model_args.pretrained: 126 of 126 tensors loaded from outputs/resnet18/final_model.pt"
    assert loaded in said.err + said.out


@needs_fmnist
@pytest.mark.slow
def test_cluster_sweep_commands(tmp_path, home):
    """The cluster how-to as typed (6 tiny runs of the LG-FedAvg sweep): through the local executor,
    then on a one-node Slurm cluster started here (partition `debug`), 4 of its runs complete already
    (copies of the local executor's), the other 2 submitted, its states shown, followed to the end;
    `--status` then says every run is complete."""
    from tests.support import slurm_cluster

    env = {**_env(home), "PYTHONPATH": str(ROOT)}
    shards = ["--set", "train_args.client_num_in_total=5", "--set", "train_args.client_num_per_round=5"]

    def run(command: str, output: Path, *, env: dict[str, str] = env) -> subprocess.CompletedProcess:
        words = [w.replace("PARTITION", "debug") for w in _entry_point(command)]
        more = [*shards, "--poll", "1"] if command == CLUSTER_WAIT else shards  # not 30 s between looks
        argv = [sys.executable, "-m", "fedml_moon", *words, *_sets(command), *more, "--output", str(output)]
        return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)

    def all_complete(output: Path, env: dict[str, str]) -> None:
        status = run(CLUSTER_STATUS, output, env=env)
        assert status.returncode == 0 and status.stdout.splitlines()[-1] == "6 runs: 6 complete", status

    done = run(CLUSTER_LOCAL, tmp_path / "local")
    assert done.returncode == 0, done.stderr[-3000:]
    all_complete(tmp_path / "local", env)
    try:
        cluster = slurm_cluster.start()
    except slurm_cluster.Unavailable as err:
        pytest.skip(f"the local executor's commands ran; Slurm cannot start here: {err}")
    try:
        slurm_env, output = {**env, "SLURM_CONF": cluster.env["SLURM_CONF"]}, tmp_path / "slurm"
        local = sorted(p for p in (tmp_path / "local").iterdir() if (p / "summary.json").is_file())
        for folder in local[:4]:  # complete already (the local executor's): Slurm runs the other 2
            shutil.copytree(folder, output / folder.name)
        done = run(CLUSTER_SLURM, output, env=slurm_env)
        assert done.returncode == 0 and "submitted 2 runs to slurm" in done.stderr, done.stderr[-3000:]
        shown = run(CLUSTER_STATUS, output, env=slurm_env).stdout
        assert all(f"config={c},random_seed={s}" in shown for c in ("lg", "fedavg_shards") for s in (0, 1, 2))
        done = run(CLUSTER_WAIT, output, env=slurm_env)
        assert done.returncode == 0 and "0 submitted now" in done.stderr, done.stderr[-3000:]
        all_complete(output, slurm_env)
    finally:
        cluster.stop()


def _complete_copy(template: Path, folder: Path, config: dict) -> None:
    """A completed run folder for a sweep to skip: the template's records under this run's config."""
    folder.mkdir(parents=True)
    shutil.copy(template / "metrics.jsonl", folder / "metrics.jsonl")
    summary = json.loads((template / "summary.json").read_text())
    (folder / "summary.json").write_text(json.dumps({**summary, "config": config}))


# --- distributed commands -------------------------------------------------------------------------


@needs_fmnist
@pytest.mark.slow
def test_mpi_commands(tmp_path, home):
    """run/mpirun.sh adds what mpirun needs here (root, 2 cores); the cross-silo run takes its rank
    count from the config (2 silos at tiny scale: 3 ranks), also through the guide's hostfile. The
    hierarchical one (2 silos of 2 processes: 5 ranks, after the others), whose job ends when a
    group process is killed after the first checkpoint, started again with --resume, ends on the
    model of the run of one-process silos (ROUNDS rounds each, in float64: <= 1e-12, a bound float32's
    rounding alone would break over those 32 steps a party)."""
    started = time.monotonic()
    cmds, outs = [], []
    commands = (MPI_SIMULATION, MPI_CROSS_SILO, MPI_HOSTS, MPI_HIERARCHICAL)
    for i, command in enumerate(commands):
        outs.append(tmp_path / f"run-{i}")
        sets = _sets(command)
        if command in (MPI_CROSS_SILO, MPI_HIERARCHICAL):  # long enough to be stopped midway
            sets = _sets(command + "".join(f" --set {s}" for s in COMPARED)) + [
                a for s in COMPARED for a in ("--set", s)
            ]
        cmds.append([*shlex.split(command), *sets, "--output-dir", str(outs[-1])])
    logs = _run_all(cmds[:3], tmp_path / "logs", home, 420)
    _kill_a_group_process_after_the_first_checkpoint(cmds[3], outs[3], tmp_path / "killed.log", home)
    logs += _run_all([[*cmds[3], "--resume", str(outs[3])]], tmp_path / "resumed", home, 420)
    for log_path in logs:
        text = _quiet(log_path)
        assert {"rank 0", "rank 1", "rank 2"} <= set(re.findall(r"rank \d+", text)), text[-2000:]
    assert "resuming after the checkpoint of round" in text, text[-3000:]
    for silo in (1, 2):
        for process in (0, 1):
            assert f"silo {silo}: process {process} of 2 (gloo)" in text, text[-3000:]
    last = f"silo group process 1 of 2: round {ROUNDS - 1} trained"
    assert text.count(last) == 2, text[-3000:]  # a follower each
    for out, rounds in zip(outs, (1, ROUNDS, 1, ROUNDS), strict=True):
        _completed(out, rounds)
    one, group = (torch.load(o / "final_model.pt", weights_only=True) for o in (outs[1], outs[3]))
    assert one["encoder.conv1.weight"].dtype == torch.float64
    assert max(float((one[k] - group[k]).abs().max()) for k in one) <= 1e-12
    print(f"MPI README commands: {time.monotonic() - started:.1f} s")


ROUNDS = 4
COMPARED = [
    f"train_args.comm_round={ROUNDS}",
    "data_args.max_train_samples=1000",
    "train_args.batch_size=64",
    "train_args.precision=fp64",
    "train_args.checkpoint_every=1",
]
"""What the MPI runs of one-process and hierarchical silos add to TINY."""


def _kill_a_group_process_after_the_first_checkpoint(
    cmd: list[str], out: Path, log: Path, home: Path
) -> None:
    """Start `cmd` (an mpirun job of hierarchical silos); once its first checkpoint is written, SIGKILL
    silo 1's second process: mpirun ends the whole job (non-zero) within a minute, no rank left."""
    from fedml_moon.conformance.recovery import wait_checkpoint

    job = conformance.spawn(cmd, log, _env(home), ROOT)
    try:
        wait_checkpoint(out, 0, 240)
        assert job.poll() is None and not (out / "summary.json").exists(), log.read_text()[-3000:]
        pids = dict(re.findall(r"silo (\d: process \d) of 2 \(gloo\), pid (\d+)", log.read_text()))
        assert len(pids) == 4, log.read_text()[-3000:]
        os.kill(int(pids["1: process 1"]), signal.SIGKILL)
        code = job.wait(timeout=60)
        deadline = time.monotonic() + 30
        while (
            alive := [p for p in pids.values() if Path(f"/proc/{p}").exists()]
        ) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        conformance.stop(job)
    assert code != 0 and not alive, (code, alive, log.read_text()[-3000:])


def _grpc_comm(tmp_path: Path, out: Path) -> list[str]:
    """What every process of a gRPC run here adds: an ipconfig CSV of the server's row only, on a free
    port of 127.0.0.1, a bounded wait and the run's output folder."""
    ipconfig = tmp_path / "ipconfig.csv"
    port = conformance.free_port()
    ipconfig.write_text(
        f"eid,rank,grpc_server_ip,grpc_server_port,ingress_ip\n0,0,127.0.0.1,{port},127.0.0.1\n"
    )
    comm = ["--set", f"comm_args.grpc_ipconfig_path={ipconfig}", "--set", "comm_args.timeout_s=120"]
    return [*comm, "--output-dir", str(out)]


@needs_fmnist
@pytest.mark.slow
def test_grpc_commands(tmp_path, home):
    """The server gets the run's --set values; each silo only its comm settings (and its threads):
    the number of silos comes from train_args.client_num_in_total, the ipconfig CSV holds only the
    server's row, and silos take the run's config from the server."""
    started = time.monotonic()
    out = tmp_path / "run"
    comm = _grpc_comm(tmp_path, out)
    silos = [
        [*shlex.split(GRPC_SILO.replace("RANK", str(r))), *comm, "--set", "device_args.torch_threads=1"]
        for r in (1, 2)
    ]
    server = [*shlex.split(GRPC_SERVER), *_sets(GRPC_SERVER), *comm]
    for log_path in _run_all([*silos, server], tmp_path / "logs", home, 420):
        _quiet(log_path)
    _completed(out, 1)
    print(f"gRPC README commands: {time.monotonic() - started:.1f} s")


@needs_fmnist
@pytest.mark.slow
def test_grpc_tls_commands(tmp_path, home, capsys):
    """The cross-silo tutorial: certificates for 3 silos on 127.0.0.1, the server with TLS and its
    certificate and, as "Watch the run" starts it, its status port; silos 1 to 3 with theirs (mutual
    TLS), run as written from a folder holding `certs/` (the run's ipconfig CSV and the status port on
    free ports). Before the silos come, the operator's and a site's `fedml-moon status` of the port,
    and a real Prometheus started with the example configuration copied beside `certs/` (listening on
    a free loopback port), which scrapes the port over TLS as the operator."""
    from tests.support import monitoring

    started = time.monotonic()
    work = tmp_path / "work"
    work.mkdir()
    certs = work / "certs"
    with restored_main() as main:
        assert main([str(certs) if w == "certs/" else w for w in _entry_point(CERTS_LOCAL)]) == 0
    out = tmp_path / "run"
    comm = _grpc_comm(tmp_path, out)
    port = conformance.free_port()

    def placed(command: str, rank: str = "0") -> list[str]:
        words = shlex.split(command.replace("RANK", rank).replace("8891", str(port)))
        return [re.sub(r"(^|=)certs/", rf"\g<1>{certs}/", w) for w in words]

    silos = [[*placed(TLS_SILO, str(r)), *comm, "--set", "device_args.torch_threads=1"] for r in (1, 2, 3)]
    server = [*placed(WATCHED_SERVER), *_sets(WATCHED_SERVER), *comm]
    logs = [tmp_path / "logs" / f"process-{i}.log" for i in range(4)]
    logs[0].parent.mkdir()
    with contextlib.ExitStack() as stack:
        procs = [conformance.spawn(server, logs[-1], _env(home), ROOT)]
        stack.callback(lambda: [conformance.stop(p) for p in procs])
        _wait_for_text(logs[-1], f"status port: https://127.0.0.1:{port}/", 120)
        with restored_main() as main:
            deadline = time.monotonic() + 60
            while True:  # the port answers from its opening; the run's status once the server has one
                assert main(placed(WATCH_STATUS)[1:]) == 0
                said = capsys.readouterr().out
                if "round 1 of 1, waiting for sites" in said or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert "round 1 of 1, waiting for sites" in said and "site rank 3: gone" in said, said
            site = [w.replace("operator.token", "silo-1.token") for w in placed(WATCH_STATUS)[1:]]
            assert main([*site, "--json"]) == 0
            assert [s["rank"] for s in json.loads(capsys.readouterr().out)["sites"]] == [1]
        copy, source, target = shlex.split(SCRAPE_CONFIG)  # here: into the folder holding certs/
        assert copy == "cp" and target == "prometheus.yml"
        config = work / target
        config.write_text((ROOT / source).read_text().replace("8891", str(port)))
        listen = f"127.0.0.1:{conformance.free_port()}"  # not Prometheus's own 0.0.0.0:9090
        prometheus = [*shlex.split(SCRAPE), f"--web.listen-address={listen}"]
        prometheus += [f"--storage.tsdb.path={tmp_path / 'tsdb'}"]
        procs.append(conformance.spawn(prometheus, tmp_path / "logs" / "prometheus.log", _env(home), work))
        monitoring.Prometheus(f"http://{listen}/").until("fedml_moon_rounds_planned", 1)
        for cmd, log_path in zip(silos, logs, strict=False):
            procs.append(conformance.spawn(cmd, log_path, _env(home), ROOT))
        codes = conformance.wait_all([procs[0], *procs[2:]], 420)
    tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in logs)
    assert codes == [0, 0, 0, 0], tails
    for log_path in logs:
        _quiet(log_path)
    assert "(TLS True, auth mtls)" in logs[-1].read_text()  # the server's log: TLS on, silos by certificate
    _completed(out, 1)
    # started again as written in step 2, the server refuses the folder of this run's records
    again = [*placed(TLS_SERVER), *_sets(TLS_SERVER), *comm]
    again = subprocess.run(again, cwd=ROOT, env=_env(home), capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "holds an earlier run's records" in again.stderr, again.stderr[-2000:]
    assert "--overwrite" in again.stderr and f"--resume {out}" in again.stderr
    _completed(out, 1)
    print(f"gRPC + TLS README commands: {time.monotonic() - started:.1f} s")


@needs_fmnist
@pytest.mark.slow
def test_own_data_tutorial_commands(tmp_path, home):
    """Cross-silo with your own data: certificates with a cap per site, the server with no data and
    three sites each with its own folder (mutual TLS), run as written with the sites' folders and
    `certs/` in a scratch folder, one tiny round; the server says it holds no data, the sites'
    counts make the record."""
    started = time.monotonic()
    work = tmp_path / "work"
    sites = party_folders(work / "data" / "site" / "parties", per_party=40, n_test=10)
    certs = work / "certs"
    with restored_main() as main:
        assert main([str(certs) if w == "certs/" else w for w in _entry_point(OWN_CERTS)]) == 0
        check = [str(sites / "party-a") if w.startswith("data/") else w for w in _entry_point(OWN_CHECK)]
        assert main(check) == 0  # the site's folder passes the silo's start-up reading
    out = tmp_path / "run"
    comm = _grpc_comm(tmp_path, out)
    tiny = ["train_args.comm_round=1", "train_args.epochs=1", "train_args.batch_size=16"]
    tiny += ["device_args.torch_threads=1", "tracking_args.enable_wandb=false"]

    def placed(command: str) -> list[str]:
        words = shlex.split(command)
        return [
            w.replace("=certs/", f"={certs}/").replace("=data/site/parties/", f"={sites}/") for w in words
        ]

    silos = [[*placed(c), *comm, "--set", "device_args.torch_threads=1"] for c in OWN_SILOS]
    server = [*placed(OWN_SERVER), *(a for t in tiny for a in ("--set", t)), *comm]
    logs = _run_all([*silos, server], tmp_path / "logs", home, 420)
    for log_path in logs:
        _quiet(log_path)
    said = logs[-1].read_text()
    assert (
        "the server holds no training data; evaluation is federated" in said
        and "(TLS True, auth mtls)" in said
    )
    _completed(out, 1)
    record = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert set(record["party_test"]) == {"0", "1", "2"} and record["test_samples"] > 0
    claims = json.loads((out / "claims.json").read_text())
    assert sorted(claims) == ["0", "1", "2"] and all(c["samples"] <= 20000 for c in claims.values())
    print(f"own-data tutorial commands: {time.monotonic() - started:.1f} s")


@needs_fmnist
@pytest.mark.slow
def test_mqtt_s3_commands(tmp_path, home):
    """Server and silo 1 from the shipped config with the local broker and S3 given by --set; silo 2
    from a copy of the config with them written in (`edge.yaml`, as the README describes)."""
    started = time.monotonic()
    with conformance.services(tmp_path / "services") as svc:
        moto = svc.procs[1].args
        assert moto[0] == str(ROOT / ".venv/bin/moto_server") and "-p" in moto  # the README's moto_server
        run_id = f"readme-{conformance.free_port()}"
        comm = [*svc.overrides, f"comm_args.run_id={run_id}", "comm_args.timeout_s=120"]
        edge = yaml.safe_load((ROOT / "config/modes/moon_edge_mqtt_s3.yaml").read_text())
        s3 = f"http://127.0.0.1:{svc.s3_port}"
        edge["comm_args"].update(mqtt_port=svc.mqtt_port, s3_endpoint=s3, run_id=run_id, timeout_s=120)
        (tmp_path / "edge.yaml").write_text(yaml.safe_dump(edge))
        out = tmp_path / "run"
        cmds = []
        for rank, command, extra in ((1, EDGE, comm), (2, EDGE_COPY, []), (0, EDGE, comm)):
            words = [str(tmp_path / "edge.yaml") if w == "edge.yaml" else w for w in shlex.split(command)]
            words = [str(rank) if w == "R" else w for w in words]
            sets = [a for item in extra for a in ("--set", item)]
            cmds.append([*words, *_sets(command), *sets, "--output-dir", str(out)])
        for log_path in _run_all(cmds, tmp_path / "logs", home, 420):
            _quiet(log_path)
    _completed(out, 1)
    print(f"MQTT + S3 README commands: {time.monotonic() - started:.1f} s")


# --- the contributor tutorial ---------------------------------------------------------------------


@needs_fmnist
@pytest.mark.slow
def test_the_package_fedml_moon_new_writes_passes_check_in_every_mode(tmp_path, home):
    """The tutorial's first two commands as written, in a folder of their own (its `.venv` this
    repository's): `new` writes ./fedproto, and `check` passes it without installing, every mode."""
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    commands = [c for c, kind in COMMANDS.items() if kind == "tutorial-new"]
    assert [shlex.split(c)[1] for c in commands] == ["new", "check"]
    outputs = []
    for command in commands:
        done = subprocess.run(
            shlex.split(command), cwd=tmp_path, env=_env(home), capture_output=True, text=True, timeout=900
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        outputs.append(done.stdout)
    assert (tmp_path / "fedproto" / "fedml_moon_fedproto" / "__init__.py").is_file()
    assert "fedproto: 22 of 22 checks passed" in outputs[1], outputs[1]


@needs_fmnist
@pytest.mark.slow
def test_the_tutorials_fedproto_runs_and_passes_check(tmp_path, cli, capsys):
    """The finished FedProto (examples/fedproto): its standalone checks, and a run."""
    check, run = [c for c, kind in COMMANDS.items() if kind == "tutorial"]
    assert cli(_entry_point(check)) == 0
    out = capsys.readouterr().out
    assert "fedproto: 14 of 14 checks passed" in out, out
    assert cli([*_entry_point(run), *_sets(run), "--output-dir", str(tmp_path / "fedproto")]) == 0
    summary = _completed(tmp_path / "fedproto", 2)
    assert summary["config"]["train_args"]["algorithm"] == "fedproto"
    assert summary["config"]["common_args"]["plugins"] == ["fedml_moon_fedproto:spec"]


@needs_fmnist
@pytest.mark.slow
def test_hierarchical_commands(tmp_path, home):
    """The deployment guide's hierarchical silo, as written: silo 1 as torchrun's group of 2 processes
    on one host, then as 2 "hosts" of 1 process each (both here), beside silo 2 and the server."""
    one, *two = [c for c, kind in COMMANDS.items() if kind == "hierarchical"]
    assert "device_args.n_node_in_silo=2" in two[0] and "--node-rank 1" in two[1]
    for name, group in (("one-host", [one]), ("two-hosts", two)):
        out = tmp_path / name / "run"
        (tmp_path / name).mkdir()
        comm = _grpc_comm(tmp_path / name, out)
        silo1 = [[*shlex.split(c), *comm, "--set", "device_args.torch_threads=1"] for c in group]
        silo2 = [*shlex.split(GRPC_SILO.replace("RANK", "2")), *comm, "--set", "device_args.torch_threads=1"]
        server = [*shlex.split(GRPC_SERVER), *_sets(GRPC_SERVER), *comm]
        logs = _run_all([*silo1, silo2, server], tmp_path / name / "logs", home, 420)
        _completed(out, 1)
        said = "".join(p.read_text(errors="replace") for p in logs[: len(group)])
        assert (
            "silo 1: process 1 of 2 (gloo)" in said and "round 0 trained on its slice of every batch" in said
        )
        assert " rank 1 process 1 INFO " in said and " rank 1 process 0 INFO " in said  # as the guide says


@pytest.mark.slow
@pytest.mark.parametrize(
    ("left_out", "says"),
    [
        (
            "--set common_args.scenario=hierarchical ",
            "common_args.scenario is horizontal (a silo is one process)",
        ),
        (
            "--set device_args.n_proc_per_node=2",
            "n_node_in_silo x n_proc_per_node is 1 x 1 = 1, but torchrun",
        ),
    ],
)
def test_the_one_host_silo_command_missing_a_key_is_refused_naming_the_sets_to_add(home, left_out, says):
    """The guide's one-host silo command with one of its --set left out: every process that gets as
    far as its config refuses it before anything is built (no output folder), naming the --set that
    make it agree with torchrun; without the scenario each process would otherwise act as the whole
    silo 1."""
    from fedml_moon.conformance import free_port

    one = next(c for c, kind in COMMANDS.items() if kind == "hierarchical")
    assert left_out in one
    cmd = one.replace(left_out, "").replace("--master-port 29500", f"--master-port {free_port()}")
    argv = [*shlex.split(cmd), "--output-dir", str(home / "never")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, env=_env(home), cwd=ROOT)
    fix = "--set device_args.n_node_in_silo=1 --set device_args.n_proc_per_node=2"
    # torchrun stops the other process once one has exited: each refused, or was stopped before it
    # got as far (on a busy machine the other may still be importing); none went further
    refused = done.stderr.count(says)
    assert done.returncode == 1 and refused in (1, 2) and done.stderr.count(fix) == refused, done.stderr
    assert not (home / "never").exists()


@pytest.mark.slow
def test_a_master_port_in_use_stops_torchrun_naming_it(home):
    """The guide's promise: the one-host silo command with its --master-port already taken stops
    within seconds (exit 1), its last line naming the port and that it is in use."""
    import socket

    one = next(c for c, kind in COMMANDS.items() if kind == "hierarchical")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = shlex.split(one.replace("--master-port 29500", f"--master-port {port}"))
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=_env(home))
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1
    assert f"port: {port}" in last and "EADDRINUSE, message: address already in use" in last, last
