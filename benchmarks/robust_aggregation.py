"""Final global test accuracy under each robust aggregation rule, with and without one attacker.

Setting: Fashion-MNIST (the Debian package), 10 parties, Dir(0.5), all 10 sampled every round, simple
CNN, `--rounds` rounds x `--epochs` local epochs on the first `--samples` training images, the test
accuracy of the last round's global model on the first `--test-samples` test images; FedAvg by default
(`--algorithms fedavg moon` adds MOON), seed `--seed`, CPU, `device_args.torch_threads` = `--threads`.

Attacks (injected here, never in the plugin: the standalone run's party runner is wrapped so that
party 0's upload is replaced after its honest local training, every round), with w the global model
the round started from and w_0 party 0's trained model:
    none     no attacker
    scaled   w + S (w_0 - w), S = --scale (10: the model-replacement boost n / eta of Bagdasaryan et
             al. 2020 for 10 parties and server step 1)
    flipped  w - F (w_0 - w), F = --flip (10)
Rules: server_args.robust_aggregation in {none, median, trimmed_mean, krum, norm_clip} with their
defaults (trim_ratio 0.1, krum_byzantine 1, krum_select 1, clip_norm null: the median update norm).

Run: .venv/bin/python benchmarks/robust_aggregation.py [--rounds 12] [--epochs 2] [--samples 12000]
    [--plot PNG]
It prints one table per algorithm: rows the rules, columns the attacks, accuracy in %; `--plot` also
draws them as grouped bars (one panel per algorithm, a group per rule, a bar per attack).
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

from fedml_moon.adapters.run import Assembled, assemble
from fedml_moon.config.load import load_config

log = logging.getLogger("robust_aggregation")
CONFIGS = Path(__file__).resolve().parent.parent / "config" / "fashion_mnist"
RULES = ("none", "median", "trimmed_mean", "krum", "norm_clip")
ATTACKS = ("none", "scaled", "flipped")
ATTACKER = 0


def poisoned(upload: dict, start: OrderedDict, factor: float) -> dict:
    """`upload` with its model's floating-point entries moved to w + factor (w_0 - w)."""
    model = OrderedDict(
        (k, start[k] + factor * (v - start[k]) if v.is_floating_point() else v)
        for k, v in upload["model"].items()
    )
    return {**upload, "model": model}


def inject(run: Assembled, factor: float) -> None:
    """Replace party ATTACKER's upload every round (the standalone loop's runner, wrapped)."""
    runner, aggregator = run.loop.runner, run.loop.aggregator
    honest = runner.train_many

    def train_many(tasks: list, round_idx: int) -> list:
        start = OrderedDict((k, v.detach().cpu().clone()) for k, v in aggregator.global_state.items())
        results = honest(tasks, round_idx)
        return [
            (n, poisoned(up, start, factor)) if party == ATTACKER else (n, up)
            for (party, _), (n, up) in zip(tasks, results, strict=True)
        ]

    runner.train_many = train_many


def overrides(args: argparse.Namespace, rule: str) -> list[str]:
    return [
        f"data_args.max_train_samples={args.samples}",
        f"data_args.max_test_samples={args.test_samples}",
        "train_args.client_num_in_total=10",
        "train_args.client_num_per_round=10",
        f"train_args.comm_round={args.rounds}",
        f"train_args.epochs={args.epochs}",
        f"common_args.random_seed={args.seed}",
        f"validation_args.frequency_of_the_test={args.rounds}",  # round 0 and the last round
        "train_args.checkpoint_every=0",
        f"device_args.torch_threads={args.threads}",
        "device_args.using_gpu=false",
        "tracking_args.enable_wandb=false",
        f"server_args.robust_aggregation={rule}",
    ]


def one_run(args: argparse.Namespace, algorithm: str, rule: str, attack: str, out: Path) -> float:
    """Final global test accuracy of one run."""
    cfg = load_config(CONFIGS / f"{algorithm}.yaml", overrides(args, rule))
    run = assemble(cfg, out / f"{algorithm}-{rule}-{attack}")
    if attack != "none":
        inject(run, args.scale if attack == "scaled" else -args.flip)
    sizes = [len(part) for part in run.fed.train_parts]
    log.warning("party %d holds %d of the %d training images", ATTACKER, sizes[ATTACKER], sum(sizes))
    started = time.perf_counter()
    run.loop.run()
    acc = float(run.loop.summary["final_test_acc"])
    log.warning("%s %s %s: %.4f (%.0f s)", algorithm, rule, attack, acc, time.perf_counter() - started)
    return acc


def heads(args: argparse.Namespace) -> dict[str, str]:
    """Each attack's column name."""
    return {
        "none": "no attacker",
        "scaled": f"scaled x{args.scale:g}",
        "flipped": f"sign-flipped x{args.flip:g}",
    }


def table(algorithm: str, results: dict, args: argparse.Namespace) -> str:
    lines = [
        f"{algorithm}: final global test accuracy (%)",
        "| rule | " + " | ".join(heads(args)[a] for a in args.attacks) + " |",
        "|---|" + "---|" * len(args.attacks),
    ]
    for rule in args.rules:
        lines.append(
            f"| {rule} | " + " | ".join(f"{100 * results[rule, a]:.2f}" for a in args.attacks) + " |"
        )
    return "\n".join(lines)


def plot(tables: dict[str, dict], args: argparse.Namespace, path: Path) -> None:
    """The tables as grouped bars: one panel per algorithm, a group per rule, a bar per attack."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(1.6 * len(args.rules) + 1.5, 3.6 * len(tables)))
    axes = fig.subplots(len(tables), 1, squeeze=False)[:, 0]
    width = 0.8 / len(args.attacks)
    for ax, (algorithm, results) in zip(axes, tables.items(), strict=True):
        for i, attack in enumerate(args.attacks):
            xs = [r + (i - (len(args.attacks) - 1) / 2) * width for r in range(len(args.rules))]
            accs = [100 * results[rule, attack] for rule in args.rules]
            bars = ax.bar(xs, accs, width, label=heads(args)[attack], color=f"C{ATTACKS.index(attack)}")
            ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=1)  # as the table
        ax.set_xticks(range(len(args.rules)), args.rules)
        ax.set(
            ylabel="final test accuracy (%)", ylim=(0, 100), title=f"{algorithm}: attacker party {ATTACKER}"
        )
        ax.grid(axis="y", alpha=0.3)
        ax.axhline(10, color="grey", linestyle=":", linewidth=1, label="chance (10 classes)")
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncols=len(args.attacks) + 1)
    fig.suptitle(
        f"Fashion-MNIST, Dir(0.5), 10 parties, {args.samples} training images, {args.rounds} rounds x "
        f"{args.epochs} epoch(s), seed {args.seed}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument(
        "--samples", type=int, default=12000, help="training images (data_args.max_train_samples)"
    )
    parser.add_argument("--test-samples", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scale", type=float, default=10.0)
    parser.add_argument("--flip", type=float, default=10.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--algorithms", nargs="+", default=["fedavg"], choices=["fedavg", "moon"])
    parser.add_argument("--rules", nargs="+", default=list(RULES), choices=RULES)
    parser.add_argument("--attacks", nargs="+", default=list(ATTACKS), choices=ATTACKS)
    parser.add_argument("--plot", type=Path, metavar="PNG", help="also draw the tables as grouped bars")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    print(
        f"Fashion-MNIST, Dir(0.5), 10 parties all sampled, {args.samples} training / "
        f"{args.test_samples} test images, {args.rounds} rounds x {args.epochs} epoch(s), seed {args.seed}, "
        f"CPU, {args.threads} thread(s); attacker: party {ATTACKER}, every round"
    )
    started = time.perf_counter()
    tables: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for algorithm in args.algorithms:
            results = {
                (r, a): one_run(args, algorithm, r, a, Path(tmp)) for a in args.attacks for r in args.rules
            }
            tables[algorithm] = results
            print(table(algorithm, results, args), flush=True)
    print(f"total {time.perf_counter() - started:.0f} s")
    if args.plot:
        plot(tables, args, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
