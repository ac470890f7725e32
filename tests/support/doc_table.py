"""Every command the README and the docs show, and the test that runs it, from the repository root, at
tiny scale.

`readme_commands()` collects them from README.md and every page under docs/ (DOC_FILES): each line of
the ```bash blocks and every inline `...` span that starts with `.venv/bin/`, `bash run/` or `mpirun`.
Each must be a key of COMMANDS, which says how the suite runs it; a command the docs gain without an
entry here fails tests/test_readme_commands.py's `test_the_docs_show_only_commands_this_file_runs`,
and so does an entry the docs lost. The kinds and the files that run them:

- `single`, `script`, `setup`, `install`, `benchmark`, `docs`, `synopsis`, `fragment`:
  tests/test_readme_commands.py (the single-process commands run; the scripts, installs and
  benchmarks checked, not run: they install, run the whole suite, or measure for minutes);
- `site-data`, `network`: tests/test_docs_data.py (`network-check`: tests/test_network_runs.py);
- `cluster`: tests/test_docs_cluster_sweep.py;
- `mpi`, `grpc`, `mqtt`, `hierarchical`: tests/test_docs_deployment_modes.py;
- `grpc-tls`, `own-data`: tests/test_docs_cross_silo.py;
- `tutorial-new`, `tutorial`: tests/test_docs_write_algorithm.py;
- `contributor-kit`: tests/test_contributor_kit.py; `gpu-check`: tests/test_gpu_check.py.
"""

from __future__ import annotations

import re

from tests.support import ROOT
from tests.support import doc_commands as cmd

README = ROOT / "README.md"
DOC_FILES = [README, *sorted(p for p in (ROOT / "docs").rglob("*.md") if "results" not in p.parts)]
"""Where commands are shown: the README and the documentation's pages (the generated reports aside)."""
PREFIXES = (".venv/bin/", "bash run/", "mpirun")

COMMANDS: dict[str, str] = {
    "bash run/main.sh": "script",
    cmd.CLUSTER_LOCAL: "cluster",
    cmd.CLUSTER_SLURM: "cluster",
    cmd.CLUSTER_STATUS: "cluster",
    cmd.CLUSTER_WAIT: "cluster",
    "bash run/test.sh": "script",
    "bash run/test.sh --quick": "script",  # .ci/run runs it after the whole suite, timed
    ".venv/bin/python benchmarks/suite_budget.py --top 20": "benchmark",  # run/test.sh runs it
    "bash run/setup.sh": "setup",  # tests/test_docs.py (nothing the second time), tests/test_interpreters.py
    cmd.MAIN_JOB: "single",
    cmd.SYNOPSIS: "single",
    cmd.STATUS: "single",
    cmd.PYTHON_M: "single",
    cmd.STANDALONE: "single",
    cmd.HEADPROX: "single",
    cmd.CERTS: "single",
    cmd.SWEEP: "single",
    cmd.SWEEP_LIST: "single",
    cmd.SWEEP_LIST_SET: "single",
    cmd.REPORT: "single",
    cmd.TSNE: "single",
    cmd.SWEEP_LG: "single",
    cmd.REPORT_LG: "single",
    cmd.SWEEP_DP: "single",
    cmd.REPORT_DP: "single",
    cmd.SWEEP_STRAGGLERS: "single",
    cmd.REPORT_STRAGGLERS: "single",
    cmd.SWEEP_PRECISION: "single",
    cmd.REPORT_PRECISION: "single",
    cmd.SECURE: "single",
    cmd.DP: "single",
    cmd.CONFIG_ALL: "single",
    cmd.TSNE_RUNS[0]: "single",
    cmd.TSNE_RUNS[1]: "single",
    cmd.TSNE_PAIR: "single",
    cmd.CONFIG_KEY: "single",
    **dict.fromkeys(cmd.SPLIT_RUNS, "single"),
    cmd.BUFFERED: "single",
    cmd.REPLAY: "single",
    **dict.fromkeys([*cmd.COMPARE_RUNS, cmd.COMPARE_REPORT], "single"),
    cmd.BUFFERED_PRIVATE: "single",
    cmd.SITE_WRITE: "site-data",
    cmd.NETWORK_WRITE: "network",
    **dict.fromkeys(cmd.NETWORK_RUNS, "network"),
    cmd.NETWORK_CHECK: "network-check",  # run as written by tests/test_network_runs.py
    ".venv/bin/python benchmarks/networks.py": "benchmark",
    **dict.fromkeys([*cmd.SITE_RUNS, *cmd.SITE_TABLES, *cmd.SITE_INSPECT], "site-data"),
    cmd.MPI_SIMULATION: "mpi",
    cmd.CERTS_LOCAL: "grpc-tls",
    cmd.TLS_SERVER: "grpc-tls",
    cmd.TLS_SILO: "grpc-tls",
    cmd.WATCHED_SERVER: "grpc-tls",
    cmd.WATCH_STATUS: "grpc-tls",
    cmd.SCRAPE_CONFIG: "grpc-tls",
    cmd.SCRAPE: "grpc-tls",
    cmd.OWN_CERTS: "own-data",
    cmd.OWN_SERVER: "own-data",
    cmd.OWN_CHECK: "own-data",
    **dict.fromkeys(cmd.OWN_SILOS, "own-data"),
    "bash run/docs.sh": "docs",  # run/test.sh runs it; tests/test_docs.py breaks it on purpose
    ".venv/bin/mkdocs serve": "docs",  # a server for editing: the site it serves is the one built
    cmd.MPI_CROSS_SILO: "mpi",
    cmd.MPI_HOSTS: "mpi",
    cmd.MPI_HIERARCHICAL: "mpi",
    cmd.GRPC_SERVER: "grpc",
    cmd.GRPC_SILO: "grpc",
    cmd.EDGE: "mqtt",
    cmd.EDGE_COPY: "mqtt",
    cmd.MOTO: "mqtt",
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
    **dict.fromkeys(cmd.HIERARCHICAL, "hierarchical"),
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
    ".venv/bin/python benchmarks/honest_pace.py": "benchmark",
    ".venv/bin/python benchmarks/many_parties.py": "benchmark",
    ".venv/bin/python benchmarks/many_parties.py --parties 100 1000000 --per-party 1 --rounds 3": "benchmark",
    ".venv/bin/python benchmarks/server_memory.py --connections 4": "benchmark",
    ".venv/bin/python benchmarks/server_memory.py --connections 4 --reconnect": "benchmark",
    ".venv/bin/python benchmarks/server_memory.py --token wrong": "benchmark",
    ".venv/bin/python benchmarks/server_memory.py --window-kb 0": "benchmark",
    ".venv/bin/python benchmarks/modes.py": "benchmark",
    ".venv/bin/python benchmarks/startup.py --repeats 5": "benchmark",
    ".venv/bin/python benchmarks/shared_cpu.py --repeats 3": "benchmark",
    ".venv/bin/python benchmarks/recovery.py": "benchmark",  # its drills run in tests/test_own_data.py
    cmd.ROBUST: "benchmark",
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
