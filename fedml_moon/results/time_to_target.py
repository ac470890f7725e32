"""Time to a target accuracy where runs keep simulated time (`train_args.party_speed`, every buffered
run): for each row, the simulated second and the client updates at which each seed first reaches the
target, as mean ± std over the seeds that reach it, beside the same figures of the synchronous run of
that algorithm. First reach on both sides: the synchronous row's time is its own first reach too, not
its last round's, so the ratio says how many times sooner, never more than the runs show.

Client updates are local rounds trained and sent up to that round: a synchronous round's parties, a
buffer's updates and the updates it left out (too stale or unusable: they were trained all the same).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from fedml_moon.results.tables import SIM_TIME, Cell, RunData, has_sim_time, mean_std


def first_reach(run: RunData, target: float) -> tuple[float, int] | None:
    """(simulated second, client updates) of the first evaluated round at or above `target`; None
    where the run never reaches it or keeps no simulated time."""
    updates = 0
    for record in run.records:
        updates += int(record.get("parties", 0)) + len(record.get("left_out") or [])
        acc = record.get("test_acc")
        if acc is not None and acc >= target:
            when = record.get(SIM_TIME)
            return None if when is None else (float(when), updates)
    return None


@dataclass
class TimeReach:
    """One row's first reaches: per seed (second, updates), None where it never reaches the target."""

    hits: list[tuple[float, int] | None]

    def reached(self) -> int:
        return sum(h is not None for h in self.hits)

    def seconds(self) -> tuple[float, float]:
        return mean_std([h[0] for h in self.hits if h is not None])

    def updates(self) -> tuple[float, float]:
        return mean_std([float(h[1]) for h in self.hits if h is not None])


def reach(cell: Cell, target: float) -> TimeReach:
    return TimeReach([first_reach(run, target) for run in cell.runs])


def synchronous_row(rows: dict[str, Cell], row: str) -> str | None:
    """The synchronous row of `row`'s algorithm (named by the algorithm alone), None where absent."""
    cell = rows[row]
    algorithm = cell.runs[0].algorithm
    sync = rows.get(algorithm)
    return algorithm if sync is not None and sync is not cell else None


def _pm(values: tuple[float, float], digits: int) -> str:
    mean, std = values
    return "n/a" if math.isnan(mean) else f"{mean:,.{digits}f} ± {std:,.{digits}f}"


def _ratio(base: float, mean: float) -> str:
    return "n/a" if math.isnan(base) or math.isnan(mean) or mean == 0 else f"{base / mean:.2f}x"


def rows_of(rows: dict[str, Cell], goal: float) -> list[dict[str, object]]:
    """Per row: its reaches and the ratios against its algorithm's synchronous row (means over the
    seeds that reach the target on each side)."""
    out = []
    for row, cell in rows.items():
        mine, sync = reach(cell, goal), synchronous_row(rows, row)
        theirs = reach(rows[sync], goal) if sync else None
        out.append(
            {
                "row": row,
                "reach": mine,
                "sync": sync,
                "time_ratio": _ratio(theirs.seconds()[0], mine.seconds()[0]) if theirs else "-",
                "update_ratio": _ratio(theirs.updates()[0], mine.updates()[0]) if theirs else "-",
            }
        )
    return out


def time_table(rows: dict[str, Cell], goal: float) -> list[str]:
    """The Markdown table of one setting (module docstring); empty where no run keeps simulated time."""
    if not has_sim_time(rows):
        return []
    lines = [
        "| method | reached | simulated s to target | client updates to target | "
        "sooner than sync (time) | fewer updates than sync |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows_of(rows, goal):
        got: TimeReach = r["reach"]  # type: ignore[assignment]
        lines.append(
            f"| {r['row']} | {got.reached()} of {len(got.hits)} | {_pm(got.seconds(), 1)} | "
            f"{_pm(got.updates(), 0)} | {r['time_ratio']} | {r['update_ratio']} |"
        )
    return lines


def write_time_csv(table: dict[str, dict[str, Cell]], goals: dict[str, float | None], out: Path) -> None:
    """time_to_target.csv: one line per setting and row, where runs keep simulated time."""
    with (out / "time_to_target.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(
            ["setting", "method", "target", "seeds", "reached", "sim_s_mean", "sim_s_std"]
            + ["updates_mean", "updates_std", "time_ratio_vs_sync", "update_ratio_vs_sync"]
        )
        for setting, rows in table.items():
            goal = goals[setting]
            if goal is None or not has_sim_time(rows):
                continue
            for r in rows_of(rows, goal):
                got: TimeReach = r["reach"]  # type: ignore[assignment]
                (s, s_std), (u, u_std) = got.seconds(), got.updates()
                w.writerow(
                    [setting, r["row"], f"{goal:.4f}", len(got.hits), got.reached()]
                    + [f"{v:.2f}" for v in (s, s_std, u, u_std)]
                    + [str(r["time_ratio"]).rstrip("x"), str(r["update_ratio"]).rstrip("x")]
                )
