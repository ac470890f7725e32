"""Stragglers: synchronous rounds against buffered aggregation (FedBuff) at equal concurrency.

Setting: Fashion-MNIST (the Debian package), 100 parties, Dir(0.5), simple CNN, the first `--samples`
training images and `--test-samples` test images, `--epochs` local epochs at learning rate `--lr`;
seed `--seed`, CPU. Party
speeds with a heavy tail: a fifth of the parties (drawn with the seed) take 10 simulated seconds a local
round, the others 1 (`train_args.party_speed: file`, the file written here).

- sync: `--concurrency` parties sampled a round, `--rounds` rounds; a round lasts as long as its slowest
  party (`sim_time_s` in each record).
- buffered: `--concurrency` parties training at once, K = `--buffer` updates a round, the default
  staleness discount 1/sqrt(1 + s) and the paper's uniform 1/K; run until it passes the synchronous
  run's simulated time.

Per algorithm (`--algorithms`, MOON and FedAvg by default) it prints the synchronous run's final
accuracy and simulated time, the simulated time the buffered run takes to first reach that accuracy,
their ratio (sync / buffered: how many times sooner), and the buffered run's accuracy after the same
simulated time as the synchronous run. Accuracy: the global model on the test images, every round.
Where the synchronous run ends no better than its first round (it did not learn), there is no
accuracy to reach and no ratio.

Run: .venv/bin/python benchmarks/buffered.py [--rounds 20] [--samples 30000] [--concurrency 10]
    [--buffer 5]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import tempfile
import time
from pathlib import Path

import numpy as np

from fedml_moon.adapters.run import assemble
from fedml_moon.config.load import load_config

log = logging.getLogger("buffered")
CONFIGS = Path(__file__).resolve().parent.parent / "config" / "fashion_mnist"
PARTIES, SLOW_SHARE, SLOW, FAST = 100, 0.2, 10.0, 1.0


def write_speeds(path: Path, seed: int) -> list[float]:
    """A fifth of the parties 10x slower than the rest, chosen with `seed`; written as party,seconds."""
    slow = set(np.random.default_rng(seed).choice(PARTIES, int(PARTIES * SLOW_SHARE), replace=False).tolist())
    speeds = [SLOW if p in slow else FAST for p in range(PARTIES)]
    path.write_text("".join(f"{p},{s}\n" for p, s in enumerate(speeds)))
    return speeds


def run(algorithm: str, sets: list[str], out: Path) -> list[dict]:
    """One standalone run; its records."""
    cfg = load_config(CONFIGS / f"{algorithm}.yaml", sets)
    assemble(cfg, out).loop.run()
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def compare(sync: list[dict], buffered: list[dict]) -> dict[str, float | None]:
    """The figures of one algorithm (module docstring)."""
    target, horizon = sync[-1]["test_acc"], sync[-1]["sim_time_s"]
    learned = target > sync[0]["test_acc"]  # else "reaching" the final accuracy means nothing
    reached = next((r["sim_time_s"] for r in buffered if r["test_acc"] >= target), None) if learned else None
    within = [r for r in buffered if r["sim_time_s"] <= horizon]
    return {
        "sync_acc": target,
        "sync_time": horizon,
        "buffered_time": reached,
        "ratio": None if reached is None else horizon / reached,
        "buffered_acc": within[-1]["test_acc"] if within else None,
        "buffered_rounds": len(within),
        "learned": learned,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--algorithms", nargs="+", default=["moon", "fedavg"])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--samples", type=int, default=30000)
    parser.add_argument("--test-samples", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--buffer", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    folder = Path(tempfile.mkdtemp(prefix="buffered-"))
    speeds = write_speeds(folder / "speeds.csv", args.seed)
    common = [
        f"train_args.client_num_in_total={PARTIES}",
        f"train_args.epochs={args.epochs}",
        f"train_args.learning_rate={args.lr}",
        f"data_args.max_train_samples={args.samples}",
        f"data_args.max_test_samples={args.test_samples}",
        f"common_args.random_seed={args.seed}",
        f"device_args.torch_threads={args.threads}",
        "device_args.using_gpu=false",
        "tracking_args.enable_wandb=false",
        "validation_args.local_test=false",
        "train_args.checkpoint_every=0",
        "train_args.party_speed=file",
        f"train_args.party_speed_file={folder / 'speeds.csv'}",
    ]
    # enough buffered rounds to pass the synchronous run's time: its parties finish about
    # concurrency / mean(speed) updates a simulated second, K of them a round
    rate = args.concurrency / float(np.mean(speeds))
    rows = []
    for algorithm in args.algorithms:
        started = time.perf_counter()
        sync = run(
            algorithm,
            [
                *common,
                f"train_args.client_num_per_round={args.concurrency}",
                f"train_args.comm_round={args.rounds}",
            ],
            folder / f"{algorithm}-sync",
        )
        rounds = math.ceil(1.3 * sync[-1]["sim_time_s"] * rate / args.buffer)
        buffered_sets = [
            *common,
            "server_args.aggregation=buffered",
            f"server_args.concurrency={args.concurrency}",
            f"server_args.buffer_size={args.buffer}",
            f"train_args.comm_round={rounds}",
        ]
        buffered = run(algorithm, buffered_sets, folder / f"{algorithm}-buffered")
        rows.append((algorithm, compare(sync, buffered), time.perf_counter() - started))
    print(
        "| algorithm | sync: final acc | sync: sim. s | buffered: sim. s to that acc | ratio | "
        "buffered: acc at the sync run's sim. s (rounds) | wall s |"
    )
    print("|---|--:|--:|--:|--:|--:|--:|")
    for algorithm, f, wall in rows:
        reached = "not reached" if f["buffered_time"] is None else f"{f['buffered_time']:.1f}"
        reached = reached if f["learned"] else "- (sync did not learn)"
        ratio = "-" if f["ratio"] is None else f"{f['ratio']:.2f}x"
        print(
            f"| {algorithm} | {100 * f['sync_acc']:.2f}% | {f['sync_time']:.0f} | {reached} | {ratio} | "
            f"{100 * f['buffered_acc']:.2f}% ({f['buffered_rounds']}) | {wall:.0f} |"
        )


if __name__ == "__main__":
    main()
