"""One MOON round alone and beside a one-thread busy process, as a ratio (target <= 2.5).

Setting: the default job's data (Fashion-MNIST, 10 parties, Dir(0.5), simple CNN, batch 64), 1 local
epoch, evaluation included; round 1 is timed (MOON has its previous models). "Beside" runs a
pure-Python busy loop (one thread, as a second single-threaded simulation would be) in another
process for the whole round. Each thread setting is measured alone then beside, `--repeats` times
alternating, and the medians are compared:
  - `auto` (the default device_args.torch_threads: half the cores, 1 on a 2-core machine);
  - every core (PyTorch's own default before, 2 here), for reference.
Last line:  shared_cpu_ratio_auto=<beside/alone> shared_cpu_ratio_all_cores=<beside/alone>

Run: .venv/bin/python benchmarks/shared_cpu.py [--repeats 3] [--samples 60000]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fedml_moon.adapters.run import Assembled, assemble
from fedml_moon.config.load import load_config

log = logging.getLogger("shared_cpu")
CONFIG = Path(__file__).resolve().parent.parent / "config" / "fashion_mnist" / "moon.yaml"


class _Bar:
    def set_postfix_str(self, _: str) -> None:
        pass


def timed_round(run: Assembled, state: dict) -> float:
    run.loop.aggregator.set_model_params(state)
    started = time.perf_counter()
    run.loop.one_round(1, _Bar())
    return time.perf_counter() - started


def beside_busy(run: Assembled, state: dict) -> float:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)  # let it take its core
        return timed_round(run, state)
    finally:
        busy.kill()
        busy.wait(timeout=10)


def measure(threads: str, samples: int, repeats: int, out: Path) -> tuple[float, float, float]:
    """Median alone and beside round times and the median of the per-pair ratios."""
    overrides = ["train_args.epochs=1", "train_args.comm_round=2", "tracking_args.enable_wandb=false"]
    overrides += [f"device_args.torch_threads={threads}", f"data_args.max_train_samples={samples}"]
    run = assemble(load_config(CONFIG, overrides), out / f"threads-{threads}")
    run.loop.one_round(0, _Bar())
    state = dict(run.loop.aggregator.global_state)
    alone, beside, ratios = [], [], []
    for _ in range(repeats):
        alone.append(timed_round(run, state))
        beside.append(beside_busy(run, state))
        ratios.append(beside[-1] / alone[-1])
        log.info(
            "torch_threads %s: alone %.2f s, beside %.2f s, ratio %.2f",
            threads,
            alone[-1],
            beside[-1],
            ratios[-1],
        )
    return statistics.median(alone), statistics.median(beside), statistics.median(ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--samples", type=int, default=60000, help="training samples (60000: all)")
    opts = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    os.environ.pop("OMP_NUM_THREADS", None)
    cores = len(os.sched_getaffinity(0))
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["HOME"] = tmp  # FedML writes under ~/.fedml
        for label, threads in (("auto", "auto"), ("all_cores", str(cores))):
            results[label] = measure(threads, opts.samples, opts.repeats, Path(tmp))
    for label, (alone, beside, ratio) in results.items():
        log.info("%s: alone %.2f s, beside a busy process %.2f s, ratio %.2f", label, alone, beside, ratio)
    line = " ".join(f"shared_cpu_ratio_{label}={r[2]:.2f}" for label, r in results.items())
    print(line)  # noqa: T201 (the script's output)


if __name__ == "__main__":
    main()
