"""Print a markdown results table from run output directories (their summary.json and metrics.jsonl).

Run: .venv/bin/python benchmarks/results_table.py outputs/table/moon outputs/table/fedavg ...
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

log = logging.getLogger("results_table")


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.2f}"


def row(run: Path) -> str:
    summary = json.loads((run / "summary.json").read_text())
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    cfg = summary["config"]
    last = records[-1]
    final = _pct(summary["final_test_acc"])
    if "final_test_acc_std" in summary:
        final += f" ± {100 * summary['final_test_acc_std']:.2f}"
    cells = [
        cfg["train_args"]["algorithm"],
        final,
        f"{_pct(summary['best_test_acc'])} (round {summary['best_round']})",
        _pct(last.get("local_test_acc")),
        _pct(last.get("new_test_acc")),
        f"{last['params_up']:.3g}",
        f"{last['params_down']:.3g}",
        summary["status"],
    ]
    return "| " + " | ".join(cells) + " |"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    runs = parser.parse_args().runs
    header = (
        "| algorithm | final test acc (%) | best test acc (%) | local test (%) | new test (%) "
        "| params up | params down | status |"
    )
    lines = [header, "|" + "---|" * 8]
    for run in runs:
        if not (run / "summary.json").is_file():
            log.error("%s has no summary.json (still running, or not a run directory)", run)
            return 1
        lines.append(row(run))
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    sys.exit(main())
