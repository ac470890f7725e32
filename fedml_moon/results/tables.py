"""What a report is made of: runs, cells of runs with their statistics over seeds, and the rounds a
cell needs to reach a target (report.py builds them; report_text.py and report_plots.py print them)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class RunData:
    """One completed run: its folder, flat config, per-round records and summary."""

    folder: Path
    config: dict[str, Any]
    records: list[dict[str, Any]]
    summary: dict[str, Any]

    @property
    def algorithm(self) -> str:
        return str(self.config.get("train_args.algorithm"))


@dataclass
class Cell:
    """Runs of one row in one setting, with the statistics the tables print."""

    runs: list[RunData]

    def stat(self, field: str, scale: float = 100.0) -> tuple[float, float]:
        """Mean and sample std over seeds of a summary field, in % (times `scale`); runs without the
        field are left out."""
        values = [scale * float(r.summary[field]) for r in self.runs if r.summary.get(field) is not None]
        return mean_std(values)

    def last(self, field: str) -> tuple[float, float]:
        """Mean and sample std over seeds of a per-round field at the last round that has it, in %
        (a personalised run's local_test_acc and new_test_acc, which summary.json does not hold)."""
        values = []
        for run in self.runs:
            hit = next((r[field] for r in reversed(run.records) if r.get(field) is not None), None)
            if hit is not None:
                values.append(100 * float(hit))
        return mean_std(values)


PERSONAL = (("local_test_acc", "local test"), ("new_test_acc", "new test"))


def is_personalised(table: dict[str, dict[str, Cell]]) -> bool:
    """Whether any run recorded a local test accuracy (validation_args.local_test)."""
    cells = (cell for rows in table.values() for cell in rows.values())
    return any("local_test_acc" in r for cell in cells for run in cell.runs for r in run.records)


EPSILON = "dp_epsilon_release"  # summary.json's epsilon of the released models (privacy_args' DP-FedAvg)
EPSILON_KNOWN = "dp_epsilon_sample_known"  # the same against anyone who knows the sample (privacy/scope.py)


def has_dp(table: dict[str, dict[str, Cell]]) -> bool:
    """Whether any run reports a DP epsilon (summary.json's `dp_epsilon_release`)."""
    cells = (cell for rows in table.values() for cell in rows.values())
    return any(run.summary.get(EPSILON) is not None for cell in cells for run in cell.runs)


def dp_scopes(table: dict[str, dict[str, Cell]]) -> list[dict]:
    """The distinct `dp_scope` statements of the runs (summary.json), in the order first met."""
    runs = (run for rows in table.values() for cell in rows.values() for run in cell.runs)
    out: list[dict] = []
    for run in runs:
        scope = run.summary.get("dp_scope")
        if isinstance(scope, dict) and scope not in out:
            out.append(scope)
    return out


def dp_deltas(table: dict[str, dict[str, Cell]]) -> list[float]:
    """The distinct `dp_delta` values the runs' epsilons are stated for, in order."""
    runs = (run for rows in table.values() for cell in rows.values() for run in cell.runs)
    return sorted({float(r.summary["dp_delta"]) for r in runs if r.summary.get("dp_delta") is not None})


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1; 0 for one value); NaN for none."""
    if not values:
        return math.nan, math.nan
    mean = sum(values) / len(values)
    if len(values) == 1:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


SIM_TIME = "sim_time_s"  # a record's simulated second (train_args.party_speed; every buffered run)


def has_sim_time(rows: dict[str, Cell]) -> bool:
    """Whether any run of a setting's rows records simulated time."""
    return any(SIM_TIME in r for cell in rows.values() for run in cell.runs for r in run.records)


def _mean(values: list[float | int | None]) -> float:
    reached = [v for v in values if v is not None]
    return sum(reached) / len(reached) if reached else math.nan


@dataclass
class Reach:
    """Rounds a row needs to reach the target: per seed, None where it never does; `times`: the
    simulated second it first does, None also where the run records no simulated time."""

    rounds: list[int | None]
    params: list[int | None]
    times: list[float | None]

    def mean_rounds(self) -> float:
        return _mean(self.rounds)

    def mean_time(self) -> float:
        """Mean simulated seconds to the target over the seeds that reach it (NaN: none does)."""
        return _mean(self.times)


def rounds_to_target(cell: Cell, target: float) -> Reach:
    """Per run: the number of rounds (1-based) after which test accuracy first is >= target, the
    parameters communicated (uploaded + downloaded, every party) up to then, and that round's
    simulated second where the run records one."""
    rounds, params, times = [], [], []
    for run in cell.runs:
        hit = next((r for r in run.records if "test_acc" in r and r["test_acc"] >= target), None)
        rounds.append(None if hit is None else int(hit["round"]) + 1)
        params.append(None if hit is None else int(hit.get("params_up", 0)) + int(hit.get("params_down", 0)))
        times.append(None if hit is None or hit.get(SIM_TIME) is None else float(hit[SIM_TIME]))
    return Reach(rounds, params, times)


def baseline(rows: dict[str, Cell], target: float) -> tuple[float, float]:
    """FedAvg's mean rounds and mean simulated seconds to `target` in a setting (NaN: no FedAvg row,
    none of its seeds reaches it, or no simulated time)."""
    if "fedavg" not in rows:
        return math.nan, math.nan
    reach = rounds_to_target(rows["fedavg"], target)
    return reach.mean_rounds(), reach.mean_time()


def speedup(base: float, mean: float) -> float:
    """FedAvg's mean over a row's mean (rounds or seconds to the target); NaN where either is NaN."""
    return math.nan if math.isnan(base) or math.isnan(mean) else base / mean
