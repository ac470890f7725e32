"""The report's curves: test accuracy per round, mean over seeds with a +- std band, one PNG per
setting; for personalised methods (parties report their own models' local test), local and new test
against the parameters communicated so far."""

from __future__ import annotations

import math
from pathlib import Path

from fedml_moon.results.tables import PERSONAL, Cell, mean_std


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


def _draw(ax, xs: list[float], means: list[float], stds: list[float], label: str) -> None:
    line = ax.plot(xs, means, label=label)[0]
    lo = [m - s for m, s in zip(means, stds, strict=True)]
    hi = [m + s for m, s in zip(means, stds, strict=True)]
    if any(s > 0 and not math.isnan(s) for s in stds):
        ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2)


def _figure(
    path: Path, lines: list[tuple[list, list, list, str]], xlabel: str, ylabel: str, title: str
) -> None:
    """One PNG of mean curves with their bands."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for xs, means, stds, label in lines:
        _draw(ax, xs, means, stds, label)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
