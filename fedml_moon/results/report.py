"""From run folders to a paper's tables: accuracy as mean +- std over seeds (the MOON paper's Table 1),
rounds to a target accuracy with the speed-up against FedAvg and the parameters communicated by then
(Table 2), accuracy-per-round curves with a band over seeds, and one plain-language line per setting.
Where runs used client-level DP (privacy_args), the final-accuracy table and table1.csv add each
setting's epsilon: summary.json's final `dp_epsilon_release` (what an observer of the released models
faces), mean over seeds (none for runs without DP).

Runs are grouped by what varies among them. A *setting* (a column) is a config value that differs
between runs of the same algorithm, seeds aside (e.g. `partition_alpha`, `epochs`); a *row* is an
algorithm, with the `algorithm_args` that differ between its runs (e.g. `moon (mu=5)`). Values that
differ only from one algorithm to another (each algorithm's own config) belong to the algorithm. How
the server aggregates (server_args.aggregation and the buffered keys) is a row's too: a buffered run
and a synchronous run of the same setting are rows side by side (`fedavg` and `fedavg
(aggregation=buffered, buffer_size=5)`), the synchronous one named as before, so it stays the target's
reference. Where runs record simulated seconds (`sim_time_s`), the rounds-to-target table adds the
simulated time to the target, the curves accuracy against it, and a table of time to target in
simulated seconds and client updates with their spread over seeds, against the synchronous run of
the same algorithm, first reach on both sides (`time_to_target.py`, time_to_target.csv). Where
synchronous and buffered runs are compared, the rounds they ran and tested (`RUN_LENGTH`) are no setting.
The std is the sample standard deviation over seeds (n - 1 in the denominator; 0 for one seed).
"""

from __future__ import annotations

import csv
import json
import logging
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from fedml_moon.results.report_text import markdown, summary_lines
from fedml_moon.results.tables import (
    EPSILON,
    PERSONAL,
    Cell,
    RunData,
    baseline,
    has_dp,
    has_sim_time,
    is_personalised,
    rounds_to_target,
    speedup,
)
from fedml_moon.results.time_to_target import write_time_csv
from fedml_moon.run_folder import SUMMARY, RunFolder, read_json, read_records

log = logging.getLogger(__name__)
NOT_SETTINGS = (
    "tracking_args.",
    "device_args.",
    "comm_args.",
    "common_args.random_seed",
    "train_args.algorithm",
)
NOT_SETTINGS_KEYS = {
    "train_args.checkpoint_every",
    "train_args.state_store",
    "train_args.stream_uploads",
    "train_args.parties_in_parallel",
    "train_args.cuda_graphs",
    "train_args.together",
    "train_args.save_party_models",
    "data_args.data_cache_dir",
    "data_args.download",
}
AGGREGATION = "server_args.aggregation"
BUFFERED_KEYS = (
    AGGREGATION,
    "server_args.buffer_size",
    "server_args.concurrency",
    "server_args.staleness",
    "server_args.staleness_exponent",
    "server_args.max_staleness",
    "server_args.buffer_weights",
    "server_args.buffered_rule",
    "server_args.fedasync_alpha",
)
"""How the server aggregates: part of a row's name, not a setting; a synchronous run ignores them."""
RUN_LENGTH = ("train_args.comm_round", "validation_args.frequency_of_the_test")
"""Where synchronous and buffered runs are compared, a round means another thing on each side (a
buffer of K updates, one update), so the rounds run and tested are neither a setting nor a row."""


def flatten(config: dict[str, Any]) -> dict[str, Any]:
    """{"section.key": value} from the nested config a summary holds."""
    return {f"{s}.{k}": v for s, sec in config.items() if isinstance(sec, dict) for k, v in sec.items()}


def find_runs(folders: list[Path]) -> list[RunData]:
    """Every completed run under `folders` (a run folder holds summary.json and metrics.jsonl)."""
    runs = []
    for folder in folders:
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder}: no such folder")
        for path in sorted(folder.rglob(SUMMARY)):
            summary = read_json(path)
            if summary.get("status") != "completed":
                log.warning("%s: %s, left out", path.parent, summary.get("status"))
                continue
            if "dp_epsilon" in summary:  # a run from before the release / server epsilons were apart
                summary.setdefault(EPSILON, summary["dp_epsilon"])
            records = read_records(path.parent)
            runs.append(RunData(path.parent, flatten(summary.get("config", {})), records, summary))
    if not runs:
        raise FileNotFoundError(f"no completed run (summary.json with status completed) under {folders}")
    return runs


def _varying_within_algorithm(runs: list[RunData], keys: list[str]) -> list[str]:
    by_algo: dict[str, list[RunData]] = defaultdict(list)
    for run in runs:
        by_algo[run.algorithm].append(run)
    return [
        k
        for k in keys
        if any(len({json.dumps(r.config.get(k), sort_keys=True) for r in rs}) > 1 for rs in by_algo.values())
    ]


def _label(run: RunData, keys: list[str]) -> str:
    return ", ".join(f"{k.rsplit('.', 1)[-1]}={run.config.get(k)}" for k in keys)


def _buffered(run: RunData) -> bool:
    """Whether the run aggregated buffered (a run from before server_args.aggregation did not)."""
    return run.config.get(AGGREGATION, "sync") == "buffered"


def group(runs: list[RunData]) -> dict[str, dict[str, Cell]]:
    """{setting label: {row label: Cell}}, settings and rows in the order the runs first show them."""
    common = set.intersection(*(set(r.config) for r in runs))  # a key a newer release added is no setting
    keys = sorted(k for k in common if not k.startswith(NOT_SETTINGS) and k not in NOT_SETTINGS_KEYS)
    varying = _varying_within_algorithm(runs, keys)
    apart = BUFFERED_KEYS + (RUN_LENGTH if any(_buffered(r) for r in runs) else ())
    setting_keys = [k for k in varying if not k.startswith("algorithm_args.") and k not in apart]
    options = sorted({k for r in runs for k in r.config if k.startswith("algorithm_args.")})
    row_keys = _varying_within_algorithm(runs, options)  # each algorithm's own options
    row_keys += _varying_within_algorithm(runs, list(BUFFERED_KEYS))
    table: dict[str, dict[str, Cell]] = {}
    for run in runs:
        setting = _label(run, setting_keys) or "all runs"
        own = [k for k in row_keys if k in run.config and (k not in BUFFERED_KEYS or _buffered(run))]
        row = run.algorithm + (f" ({_label(run, own)})" if own else "")
        table.setdefault(setting, {}).setdefault(row, Cell([])).runs.append(run)
    return table


def targets(table: dict[str, dict[str, Cell]], target: float | None) -> dict[str, float | None]:
    """The target accuracy of each setting: `target`, else FedAvg's mean final accuracy there."""
    out: dict[str, float | None] = {}
    for setting, rows in table.items():
        fedavg = rows.get("fedavg")
        out[setting] = (
            target if target is not None else (fedavg.stat("final_test_acc")[0] / 100 if fedavg else None)
        )
    return out


def write_csv(table: dict[str, dict[str, Cell]], goals: dict[str, float | None], out: Path) -> None:
    with (out / "table1.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        personal = [f"{field[:-4]}_{m}" for field, _ in PERSONAL for m in ("mean", "std")]
        personal = personal if is_personalised(table) else []
        dp = ["epsilon_mean"] if has_dp(table) else []  # the runs' final release epsilon; empty without DP
        w.writerow(
            ["setting", "method", "seeds", "final_mean", "final_std", "best_mean", "best_std", *personal, *dp]
        )
        for setting, rows in table.items():
            for row, cell in rows.items():
                stats = [*cell.stat("final_test_acc"), *cell.stat("best_test_acc")]
                stats += [v for field, _ in PERSONAL for v in cell.last(field)] if personal else []
                epsilon = cell.stat(EPSILON, scale=1.0)[0] if dp else math.nan
                extra = ["" if math.isnan(epsilon) else f"{epsilon:.4f}"] if dp else []
                w.writerow([setting, row, len(cell.runs), *(f"{v:.4f}" for v in stats), *extra])
    with (out / "table2.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        timed = any(has_sim_time(rows) for rows in table.values())  # simulated time: its two columns
        w.writerow(
            ["setting", "method", "target", "seeds", "reached", "rounds_mean", "speedup", "params_mean"]
            + (["sim_time_mean", "time_speedup"] if timed else [])
        )
        for setting, rows in table.items():
            goal = goals[setting]
            if goal is None:
                continue
            base_rounds, base_time = baseline(rows, goal)
            for row, cell in rows.items():
                reach = rounds_to_target(cell, goal)
                got = [p for p in reach.params if p is not None]
                speed = speedup(base_rounds, reach.mean_rounds())
                times = [f"{reach.mean_time():.2f}", f"{speedup(base_time, reach.mean_time()):.2f}"]
                w.writerow(
                    [
                        setting,
                        row,
                        f"{goal:.4f}",
                        len(cell.runs),
                        len(got),
                        f"{reach.mean_rounds():.2f}",
                        f"{speed:.2f}",
                        f"{sum(got) / len(got):.0f}" if got else "nan",
                    ]
                    + (times if timed else [])
                )


def write_report(folders: list[Path], out: Path | None, target: float | None, latex: bool = False) -> Path:
    """Reads the runs under `folders`, writes report.md, table1.csv, table2.csv and the curves."""
    from fedml_moon.results.report_plots import curves  # matplotlib only when a report is written

    runs = find_runs(folders)
    table = group(runs)
    out = out or RunFolder(folders[0]).report
    out.mkdir(parents=True, exist_ok=True)
    goals = targets(table, target)
    write_csv(table, goals, out)
    write_time_csv(table, goals, out)
    pictures = curves(table, out)
    text = markdown(table, goals, pictures, len(runs), latex, out)
    (out / "report.md").write_text(text)
    for line in summary_lines(table):
        log.info("%s", line)
    log.info("report of %d runs in %s", len(runs), out)
    return out
