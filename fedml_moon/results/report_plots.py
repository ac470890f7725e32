"""The report's curves: test accuracy per round, mean over seeds with a +- std band, one PNG per
setting; for personalised methods (parties report their own models' local test), local and new test
against the parameters communicated so far; where runs record simulated seconds (`sim_time_s`), test
accuracy against them.

Seeds' rounds end at different simulated seconds, so the time curve does not average matching rounds:
at each second a run's accuracy is its last evaluation at or before it (the global model's accuracy
holds until the next one is measured), and the mean +- std over seeds is taken of these steps at every
second some seed evaluated, from when every seed has been evaluated once to when the first seed ends.
"""

from __future__ import annotations

import bisect
import math
from pathlib import Path

from fedml_moon.results.tables import PERSONAL, SIM_TIME, Cell, has_sim_time, mean_std


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name) or "all"


def _series(cell: Cell, field: str, x_field: str | None) -> tuple[list[float], list[float], list[float]]:
    """x, mean and std over seeds of `field` at the rounds every seed evaluated."""
    per_run = [{r["round"]: r for r in run.records if field in r} for run in cell.runs]
    rounds = sorted(set.intersection(*(set(p) for p in per_run))) if per_run else []
    xs, means, stds = [], [], []
    for rnd in rounds:
        m, s = mean_std([100 * float(p[rnd][field]) for p in per_run])
        if x_field is None:
            xs.append(rnd)
        else:
            xs.append(
                mean_std(
                    [float(p[rnd].get("params_up", 0)) + float(p[rnd].get("params_down", 0)) for p in per_run]
                )[0]
            )
        means.append(m)
        stds.append(s)
    return xs, means, stds


def timed_runs(cell: Cell) -> list[list[tuple[float, float]]]:
    """Per run that records simulated time: its (sim_time_s, test accuracy in %) evaluations in order."""
    per_run = [
        [
            (float(r[SIM_TIME]), 100 * float(r["test_acc"]))
            for r in run.records
            if SIM_TIME in r and "test_acc" in r
        ]
        for run in cell.runs
    ]
    return [points for points in per_run if points]


def time_series(cell: Cell) -> tuple[list[float], list[float], list[float]]:
    """Simulated seconds, mean and std over seeds of each seed's last accuracy at or before them
    (module docstring); empty where no run records simulated time."""
    per_run = timed_runs(cell)
    if not per_run:
        return [], [], []
    start, end = max(p[0][0] for p in per_run), min(p[-1][0] for p in per_run)
    grid = sorted({t for p in per_run for t, _ in p if start <= t <= end})
    times = [[t for t, _ in p] for p in per_run]
    xs, means, stds = [], [], []
    for t in grid:
        values = [p[bisect.bisect_right(ts, t) - 1][1] for p, ts in zip(per_run, times, strict=True)]
        m, s = mean_std(values)
        xs.append(t)
        means.append(m)
        stds.append(s)
    return xs, means, stds


def _draw(
    ax, xs: list[float], means: list[float], stds: list[float], label: str, steps: bool = False
) -> None:
    line = ax.plot(xs, means, label=label, drawstyle="steps-post" if steps else "default")[0]
    lo = [m - s for m, s in zip(means, stds, strict=True)]
    hi = [m + s for m, s in zip(means, stds, strict=True)]
    if any(s > 0 and not math.isnan(s) for s in stds):
        ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2, step="post" if steps else None)


def _figure(
    path: Path,
    lines: list[tuple[list, list, list, str]],
    xlabel: str,
    ylabel: str,
    title: str,
    steps: bool = False,
) -> None:
    """One PNG of mean curves with their bands (`steps`: each value holds until the next)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for xs, means, stds, label in lines:
        _draw(ax, xs, means, stds, label, steps)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _time_figure(setting: str, rows: dict[str, Cell], out: Path) -> str:
    """time_<setting>.png: test accuracy against simulated seconds, the rows whose runs record them."""
    name = f"time_{_safe(setting)}.png"
    lines = [
        (*time_series(cell), f"{row} (n={len(timed_runs(cell))})")
        for row, cell in rows.items()
        if timed_runs(cell)
    ]
    _figure(out / name, lines, "simulated seconds", "global test accuracy (%)", setting, steps=True)
    return name


def curves(table: dict[str, dict[str, Cell]], out: Path) -> dict[str, list[str]]:
    """Draws the PNGs into `out`; returns their file names per setting."""
    files: dict[str, list[str]] = {}
    for setting, rows in table.items():
        name = f"curves_{_safe(setting)}.png"
        lines = [
            (*_series(cell, "test_acc", None), f"{row} (n={len(cell.runs)})") for row, cell in rows.items()
        ]
        _figure(out / name, lines, "round", "global test accuracy (%)", setting)
        files[setting] = [name]
        if has_sim_time(rows):
            files[setting].append(_time_figure(setting, rows, out))
        personal = [
            (*_series(cell, field, "params"), f"{row} {what}")
            for row, cell in rows.items()
            if any("local_test_acc" in r for r in cell.runs[0].records)
            for field, what in PERSONAL
        ]
        personal = [line for line in personal if line[0]]  # a field no round has (FedAvg's new test)
        if personal:
            name = f"personal_{_safe(setting)}.png"
            _figure(
                out / name,
                personal,
                "parameters communicated",
                "test accuracy (%)",
                f"{setting}: local and new test",
            )
            files[setting].append(name)
    return files
