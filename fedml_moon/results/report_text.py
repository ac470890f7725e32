"""The report's Markdown (and LaTeX) and its plain-language summary lines."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from fedml_moon.results.tables import (
    EPSILON,
    EPSILON_KNOWN,
    PERSONAL,
    Cell,
    Reach,
    baseline,
    dp_deltas,
    dp_scopes,
    has_dp,
    has_sim_time,
    is_personalised,
    rounds_to_target,
    speedup,
)
from fedml_moon.results.time_to_target import time_table


def _pm(mean: float, std: float) -> str:
    return "n/a" if math.isnan(mean) else f"{mean:.2f} ± {std:.2f}"


Column = tuple[str, str, Callable[[Cell], str]]  # (setting, header, text of a cell)


def _grid(table: dict[str, dict[str, Cell]], columns: list[Column]) -> list[str]:
    """A method x column table; a column is (setting, header, text): text(cell) for the method's runs
    in that setting, empty where the method has none."""
    rows = list(dict.fromkeys(row for r in table.values() for row in r))
    lines = ["| method | " + " | ".join(c[1] for c in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for row in rows:
        cells = [text(table[setting][row]) if row in table[setting] else "" for setting, _, text in columns]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return lines


def _accuracy(field: str, per_round: bool = False) -> Callable[[Cell], str]:
    """A summary.json field by Cell.stat, or a per-round field at its last round by Cell.last."""

    def text(cell: Cell) -> str:
        return f"{_pm(*(cell.last if per_round else cell.stat)(field))} (n={len(cell.runs)})"

    return text


def _epsilon(cell: Cell) -> str:
    """The runs' final DP epsilons, mean over seeds: with the sample secret (summary.json's
    dp_epsilon_release) / known (dp_epsilon_sample_known; ? for a run that did not record it); -
    without DP."""
    mean, _ = cell.stat(EPSILON, scale=1.0)
    known, _ = cell.stat(EPSILON_KNOWN, scale=1.0)
    if math.isnan(mean):
        return "-"
    return f"{mean:.2f} / {'?' if math.isnan(known) else f'{known:.2f}'}"


def _scope(table: dict[str, dict[str, Cell]]) -> list[str]:
    """What the DP runs' epsilons cover and what they do not (summary.json's dp_scope), once each."""
    lines: list[str] = []
    for scope in dp_scopes(table):
        against = scope.get("epsilon_against", {})
        lines += [
            f"What the epsilon covers (summary.json's dp_scope): the unit is {scope.get('unit')}; "
            f"adjacency: {scope.get('adjacency')}; {scope.get('accountant')}.",
            "",
            *(f"- {name}: against {who}" for name, who in against.items()),
            *(f"- not covered: {what}" for what in scope.get("not_covered", [])),
            "",
        ]
    return lines


def _table1(table: dict[str, dict[str, Cell]], field: str, epsilon: bool = False) -> list[str]:
    """Settings as columns; with `epsilon` and any DP run, each setting followed by its epsilon."""
    eps = epsilon and has_dp(table)
    return _grid(
        table,
        [
            col
            for s in table
            for col in [(s, s, _accuracy(field))]
            + ([(s, f"{s}: epsilon (sample secret / known)", _epsilon)] if eps else [])
        ],
    )


def _personal(table: dict[str, dict[str, Cell]]) -> list[str]:
    """Final local and new test accuracy: columns are setting x (local test, new test)."""
    return _grid(
        table, [(s, f"{s}: {what}", _accuracy(field, True)) for s in table for field, what in PERSONAL]
    )


def _times(reach: Reach, base: float) -> list[str]:
    """The simulated seconds to the target (mean over the seeds that reach it) and FedAvg's over them."""
    mean = reach.mean_time()
    if math.isnan(mean):
        return ["never" if all(r is None for r in reach.rounds) else "n/a", "n/a"]
    speed = speedup(base, mean)
    return [f"{mean:.1f}", "n/a" if math.isnan(speed) else f"{speed:.2f}x"]


def _table2(rows: dict[str, Cell], goal: float) -> list[str]:
    """Rounds to the target; where runs record simulated time, the simulated seconds to it too."""
    base_rounds, base_time = baseline(rows, goal)
    timed = has_sim_time(rows)
    times = " simulated s to target | time speed-up vs FedAvg |" if timed else ""
    lines = [
        "| method | rounds to target (mean over seeds that reach it) | reached | speed-up vs FedAvg | "
        "parameters communicated by then |" + times,
        "|---" * (7 if timed else 5) + "|",
    ]
    for row, cell in rows.items():
        reach = rounds_to_target(cell, goal)
        got = [p for p in reach.params if p is not None]
        mean = reach.mean_rounds()
        rounds = "never" if math.isnan(mean) else f"{mean:.1f}"
        speed = speedup(base_rounds, mean)
        speed_text = "n/a" if math.isnan(speed) else f"{speed:.2f}x"
        params = f"{sum(got) / len(got):,.0f}" if got else "n/a"
        extra = "".join(f" {t} |" for t in _times(reach, base_time)) if timed else ""
        lines.append(
            f"| {row} | {rounds} | {len(got)} of {len(cell.runs)} | {speed_text} | {params} |{extra}"
        )
    return lines


def summary_lines(table: dict[str, dict[str, Cell]]) -> list[str]:
    """Per setting: the leading method by mean final accuracy, and for every other method whether its
    difference to the reference (FedAvg where present, else the leader) exceeds the seed spread, i.e.
    the sum of both sample stds. With one seed there is no spread to compare against."""
    out = []
    for setting, rows in table.items():
        stats = {row: cell.stat("final_test_acc") for row, cell in rows.items()}
        ranked = sorted((r for r in stats if not math.isnan(stats[r][0])), key=lambda r: -stats[r][0])
        if not ranked:
            continue
        ref = "fedavg" if "fedavg" in stats else ranked[0]
        seeds = min(len(cell.runs) for cell in rows.values())
        parts = [f"{setting}: {ranked[0]} leads with {_pm(*stats[ranked[0]])}%"]
        for row in ranked:
            if row == ref:
                continue
            delta = stats[row][0] - stats[ref][0]
            spread = stats[row][1] + stats[ref][1]
            if len(rows[row].runs) < 2 or len(rows[ref].runs) < 2:
                verdict = "one seed, no spread to judge by"
            elif abs(delta) > spread:
                verdict = f"exceeds the seed spread ({spread:.2f})"
            else:
                verdict = f"within the seed spread ({spread:.2f})"
            parts.append(f"{row} vs {ref} {delta:+.2f} points, {verdict}")
        out.append("; ".join(parts) + f" (at least {seeds} seed(s) per method).")
    return out


def _latex(table: dict[str, dict[str, Cell]]) -> str:
    settings = list(table)
    rows = list(dict.fromkeys(row for r in table.values() for row in r))
    lines = ["\\begin{tabular}{l" + "c" * len(settings) + "}", "method & " + " & ".join(settings) + " \\\\"]
    for row in rows:
        cells = [table[s][row].stat("final_test_acc") if row in table[s] else None for s in settings]
        text = ["" if c is None else f"{c[0]:.2f} $\\pm$ {c[1]:.2f}" for c in cells]
        lines.append(f"{row} & " + " & ".join(text) + " \\\\")
    return "\n".join([*lines, "\\end{tabular}", ""])


def _time_section(table: dict[str, dict[str, Cell]], goals: dict[str, float | None]) -> list[str]:
    """Time to target in simulated seconds and client updates, first reach on both sides."""
    timed = [(s, rows) for s, rows in table.items() if goals[s] is not None and has_sim_time(rows)]
    if not timed:
        return []
    text = [
        "## Time to target (simulated)",
        "",
        "The simulated second and the client updates (local rounds trained, those left out included) at "
        "which each seed first reaches the target, mean ± std over the seeds that reach it; the ratios "
        "are the synchronous run's of the same algorithm over the row's, each side's first reach.",
        "",
    ]
    for setting, rows in timed:
        text += [
            f"### {setting} (target {100 * goals[setting]:.2f}%)",
            "",
            *time_table(rows, goals[setting]),
            "",
        ]
    return text


def markdown(
    table: dict[str, dict[str, Cell]],
    goals: dict[str, float | None],
    pictures: dict[str, list[str]],
    n_runs: int,
    latex: bool,
    out: Path,
) -> str:
    """The whole report.md; with `latex`, table1.tex beside it."""
    text = [f"# Report of {n_runs} runs", "", "Test accuracy (%) as mean ± std over seeds (n: seeds).", ""]
    text += ["## Final test accuracy", ""]
    if has_dp(table):
        deltas = ", ".join(f"{d:g}" for d in dp_deltas(table))
        text += [
            f"epsilon: the runs' final DP epsilons{f' for delta = {deltas}' if deltas else ''} "
            "(privacy_args), mean over seeds: against an observer of the released models who does not know "
            "which parties each round summed (summary.json's dp_epsilon_release) / against anyone who "
            "knows it, every site and every reader of the records among them (dp_epsilon_sample_known); "
            "-: runs without DP.",
            "",
            *_scope(table),
        ]
    text += [*_table1(table, "final_test_acc", epsilon=True), ""]
    text += ["## Best test accuracy", "", *_table1(table, "best_test_acc"), ""]
    if is_personalised(table):
        text += ["## Personalised test accuracy, last evaluated round", ""]
        text += [
            "local test: the mean over parties of each party's model on its own test split; new test: the"
            " global test set, the parties' models combined (LG-FedAvg).",
            "",
        ]
        text += [*_personal(table), ""]
    text += ["## Rounds to target", ""]
    if any(has_sim_time(rows) for rows in table.values()):
        text += [
            "simulated s: the simulated second (the records' sim_time_s, train_args.party_speed's clock) of "
            "the round that first reaches the target, mean over the seeds that reach it; n/a: runs without "
            "simulated time.",
            "",
        ]
    for setting, rows in table.items():
        goal = goals[setting]
        if goal is None:
            text += [f"{setting}: no FedAvg run and no --target, so no target.", ""]
            continue
        text += [f"### {setting} (target {100 * goal:.2f}%)", "", *_table2(rows, goal), ""]
    text += _time_section(table, goals)
    text += ["## Summary", "", *(f"- {line}" for line in summary_lines(table)), ""]
    text += ["## Curves", ""]
    if any(name.startswith("time_") for files in pictures.values() for name in files):
        text += [
            "time_*.png: test accuracy against simulated seconds. Seeds' rounds end at different seconds, "
            "so each seed's curve holds its last evaluated accuracy until its next; the line is the mean "
            "and the band the std over seeds of these, from when every seed has been evaluated to when "
            "the first ends.",
            "",
        ]
    for setting, files in pictures.items():
        text += [f"![{setting}]({name})" for name in files] + [""]
    if latex:
        (out / "table1.tex").write_text(_latex(table))
    return "\n".join(text)
