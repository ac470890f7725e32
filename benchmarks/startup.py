"""How soon each kind of process starts, against `python -c "import torch"` measured in the same run.

Each command is started `--repeats` times, one at a time (its wall time from start to exit, and its
peak RSS from the kernel's rusage of that child); the median is printed with its ratio to PyTorch's
own import. The commands: `fedml-moon --help`, `fedml-moon config`, an argument error
(`fedml-moon simulate` without `--cf`), what a server or silo process imports
(`fedml_moon.distributed.managers`, the trainer and the aggregator: FedML's parts), a party's first
local step (`make_optimizer`, one SGD step with momentum and weight decay: `core.optim.EagerSGD`)
beside the same step with `torch.optim.SGD` (which imports `torch._dynamo`), and the time a
cross-silo server takes to log its first line (`fedml-moon run --role server`, stopped once it has).
Last line:  help_vs_torch=<ratio> config_vs_torch=<ratio> ... server_first_line_minus_torch_s=<s>

Run: .venv/bin/python benchmarks/startup.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FEDML_MOON = str(ROOT / ".venv" / "bin" / "fedml-moon")
PARTS = "import fedml_moon.distributed.managers, fedml_moon.adapters.trainer, fedml_moon.adapters.aggregator"
STEP = (
    "import torch\n"
    "from fedml_moon.algorithms.base import make_optimizer\n"
    "from fedml_moon.config.schema import TrainArgs\n"
    "model = torch.nn.Linear(784, 10)\n"
    "opt = {}\n"
    "opt.zero_grad(); model(torch.randn(64, 784)).sum().backward(); opt.step()\n"
)
OURS = "make_optimizer(model, TrainArgs(momentum=0.9, weight_decay=1e-4))"
TORCHS = "torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)"
log = logging.getLogger("startup")


def commands() -> dict[str, list[str]]:
    """Name -> command, PyTorch's own import first."""
    return {
        "torch": [sys.executable, "-c", "import torch"],
        "help": [FEDML_MOON, "--help"],
        "config": [FEDML_MOON, "config"],
        "argument_error": [FEDML_MOON, "simulate"],
        "server_imports": [sys.executable, "-c", PARTS],
        "first_step": [sys.executable, "-c", STEP.format(OURS)],
        "first_step_torch_sgd": [sys.executable, "-c", STEP.format(TORCHS)],
    }


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, peak RSS in MB) of one run of `cmd`."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0  # reaped here
    return time.perf_counter() - started, usage.ru_maxrss / 1024


def first_line(env: dict[str, str], folder: Path) -> float:
    """Seconds from a cross-silo server's start to its first log line (its ipconfig on a free port)."""
    from fedml_moon import conformance

    folder.mkdir(parents=True)
    ipconfig = conformance.write_ipconfig(folder / "ip.csv", 2, conformance.free_port())
    cmd = [FEDML_MOON, "run", "--cf", str(ROOT / "config/modes/moon_cross_silo_grpc.yaml"), "--rank", "0"]
    cmd += ["--role", "server", "--output-dir", str(folder / "run"), "--overwrite"]
    cmd += ["--set", "train_args.client_num_in_total=1", "--set", "train_args.client_num_per_round=1"]
    cmd += ["--set", f"comm_args.grpc_ipconfig_path={ipconfig}", "--set", "tracking_args.enable_wandb=false"]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = threading.Timer(120, proc.kill)  # a server that never prints is stopped, and fails below
    deadline.start()
    try:
        line = proc.stderr.readline()
        elapsed = time.perf_counter() - started
        assert line, "the server printed nothing"
        log.info("server's first line: %s", line.strip())
        return elapsed
    finally:  # only its start is measured: stopped at once, its folder a temporary one
        deadline.cancel()
        proc.kill()
        proc.wait(timeout=60)
        proc.stderr.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs of each command (the median is kept)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    figures: dict[str, tuple[float, float]] = {}
    for name, cmd in commands().items():
        runs = [timed(cmd, env) for _ in range(args.repeats)]
        figures[name] = (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))
        log.info("%-16s %6.2f s  %6.0f MB peak RSS", name, *figures[name])
    with tempfile.TemporaryDirectory() as tmp:
        lines = [first_line(env, Path(tmp) / str(i)) for i in range(args.repeats)]
    server = statistics.median(lines)
    log.info("%-16s %6.2f s  (a cross-silo server's first log line)", "server_first", server)
    torch_s = figures["torch"][0]
    ratios = " ".join(f"{n}_vs_torch={figures[n][0] / torch_s:.2f}" for n in figures if n != "torch")
    after = server - torch_s
    sys.stdout.write(f"{ratios} torch_s={torch_s:.2f} server_first_line_minus_torch_s={after:.2f}\n")


if __name__ == "__main__":
    main()
