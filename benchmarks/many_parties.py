"""Start-up, peak memory and round time as the parties that exist grow, the parties sampled fixed.

Setting (as the many-parties issue measured it): MOON with the simple CNN on Fashion-MNIST-shaped
images split IID, `--per-party` samples a party (10), `--sampled` parties a round (10), `--rounds`
rounds (5) of one local epoch at batch 10, two threads; only `train_args.client_num_in_total` grows
(`--parties`, default 100 1000 10000 100000). Data: random 28 x 28 images written as idx files to a
temporary folder, `parties x per-party` of them and one test image a party, at least 1,000 (every
party holds a local test split, so the data grow with the parties: they are counted apart, as
`data_mb`). The global model is tested in the first and the last round only
(`frequency_of_the_test` = rounds), since testing a test set that grows with the parties is the
data's cost, not the parties'. Each run is the real entry point (`fedml-moon simulate`) in its own
process; its peak resident set is read from the kernel when it exits (getrusage of a wrapper process
that runs only it); start-up is its wall time less its rounds' `round_time_s`, and `round_s` the mean
of the rounds between the first and the last (at least 3 rounds).

One line per run, then the growth per party between the smallest and the largest run:
    parties=<n> data_mb=<mb> wall_s=<s> startup_s=<s> round_s=<mean s> peak_mb=<mb>
    per_party_kb=<kb> per_party_startup_ms=<ms> largest_peak_vs_smallest=<x>
    largest_startup_vs_smallest=<x>

Run: .venv/bin/python benchmarks/many_parties.py [--parties 100 1000 10000 100000] [--per-party 10]
[--sampled 10] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from fedml_moon.data.formats import write_idx

log = logging.getLogger("many_parties")
ROOT = Path(__file__).resolve().parent.parent
CLI = [str(ROOT / ".venv" / "bin" / "fedml-moon"), "simulate", "--cf", "config/fashion_mnist/moon.yaml"]
TEST_IMAGES = 1_000  # at least; one a party where there are more parties (each holds a local test split)


def write_data(folder: Path, n_train: int, n_test: int) -> None:
    """Random Fashion-MNIST-shaped images and labels, the four idx files."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images, labels = (
            rng.integers(0, 256, (n, 28, 28), dtype=np.uint8),
            rng.integers(0, 10, n, dtype=np.uint8),
        )
        write_idx(folder / f"{prefix}-images-idx3-ubyte", images)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte", labels)


def settings(opts: argparse.Namespace, parties: int, data: Path, out: Path) -> list[str]:
    sets = [
        "data_args.partition_method=homo",
        f"data_args.data_cache_dir={data}",
        f"train_args.client_num_in_total={parties}",
        f"train_args.client_num_per_round={opts.sampled}",
        f"train_args.comm_round={opts.rounds}",
        f"validation_args.frequency_of_the_test={opts.rounds}",
        "train_args.epochs=1",
        f"train_args.batch_size={opts.per_party}",
        "train_args.checkpoint_every=0",
        "device_args.using_gpu=false",
        "device_args.torch_threads=2",
        "tracking_args.enable_wandb=false",
    ]
    return [*CLI, *(a for s in sets for a in ("--set", s)), "--output-dir", str(out)]


def child(argv: list[str]) -> None:
    """Wrapper process: run `argv` alone and print its wall time and peak RSS (bytes) as JSON."""
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(done.returncode)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    sys.stdout.write(json.dumps({"peak": peak, "wall": wall}) + "\n")


def one_run(opts: argparse.Namespace, parties: int, work: Path) -> dict:
    data, out = work / f"data-{parties}", work / f"run-{parties}"
    n_train, n_test = parties * opts.per_party, max(TEST_IMAGES, parties)  # each party a test split
    write_data(data, n_train, n_test)
    wrapper = [sys.executable, __file__, "--child", json.dumps(settings(opts, parties, data, out))]
    done = subprocess.run(wrapper, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the run of {parties} parties failed:\n{done.stderr}")
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    rounds = [json.loads(line)["round_time_s"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    data_mb = (n_train + n_test) * 28 * 28 / 2**20
    result = {
        "parties": parties,
        "data_mb": data_mb,
        "wall_s": measured["wall"],
        "startup_s": measured["wall"] - sum(rounds),
        "round_s": sum(rounds[1:-1]) / max(1, len(rounds) - 2),  # the first and last rounds test the model
        "peak_mb": measured["peak"] / 2**20,
    }
    print(" ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in result.items()))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parties", type=int, nargs="+", default=[100, 1000, 10_000, 100_000])
    parser.add_argument("--per-party", type=int, default=10)
    parser.add_argument("--sampled", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.rounds < 3:
        parser.error("--rounds: at least 3 (the first and the last test the model; round_s is the others')")
    if opts.child:
        return child(json.loads(opts.child))
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        runs = [one_run(opts, n, Path(tmp)) for n in sorted(opts.parties)]
    small, large = runs[0], runs[-1]
    extra = max(large["parties"] - small["parties"], 1)
    grown = large["peak_mb"] - small["peak_mb"] - (large["data_mb"] - small["data_mb"])
    per_party_kb = grown * 1024 / extra
    print(
        f"per_party_kb={per_party_kb:.1f} "
        f"per_party_startup_ms={(large['startup_s'] - small['startup_s']) * 1000 / extra:.2f} "
        f"largest_peak_vs_smallest={large['peak_mb'] / small['peak_mb']:.2f} "
        f"largest_startup_vs_smallest={large['startup_s'] / small['startup_s']:.2f}"
    )


if __name__ == "__main__":
    main()
