"""The report's numbers by hand, on run folders written here: mean and sample std over seeds, settings
as columns and algorithm options as rows, rounds to FedAvg's final accuracy with the speed-up and the
parameters communicated by then, DP runs' final epsilon beside their accuracy (none for runs without
DP), the plain-language verdicts, and the files it writes."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from fedml_moon.results.report import find_runs, group, targets, write_report
from fedml_moon.results.report_plots import time_series
from fedml_moon.results.report_text import summary_lines
from fedml_moon.results.tables import mean_std, rounds_to_target

PARAMS = 100  # parameters each way per round, so round r (0-based) has communicated 2 * 100 * (r + 1)


def _run(root: Path, algorithm: str, seed: int, alpha: float, accs: list[float], status="completed", **algo):
    folder = root / f"{algorithm}-{seed}-{alpha}-{json.dumps(algo, sort_keys=True)}"
    folder.mkdir(parents=True)
    records = [
        {"round": r, "test_acc": a, "params_up": PARAMS * (r + 1), "params_down": PARAMS * (r + 1)}
        for r, a in enumerate(accs)
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    config = {
        "common_args": {"random_seed": seed},
        "train_args": {"algorithm": algorithm, "comm_round": len(accs)},
        "data_args": {"partition_alpha": alpha},
        "algorithm_args": algo,
        "tracking_args": {"wandb_project": f"p{seed}"},  # how, not what: never a setting
    }
    summary = {"status": status, "final_test_acc": accs[-1], "best_test_acc": max(accs), "config": config}
    (folder / "summary.json").write_text(json.dumps(summary))


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    root = tmp_path / "sweep"
    _run(root, "fedavg", 0, 0.5, [0.50, 0.60, 0.70])
    _run(root, "fedavg", 1, 0.5, [0.50, 0.60, 0.74])
    _run(root, "moon", 0, 0.5, [0.60, 0.72, 0.75], mu=1)
    _run(root, "moon", 1, 0.5, [0.65, 0.73, 0.76], mu=1)
    _run(root, "moon", 0, 0.5, [0.40, 0.50, 0.60], mu=10)
    _run(root, "moon", 1, 0.5, [0.40, 0.50, 0.62], mu=10)
    _run(root, "fedavg", 0, 0.1, [0.30, 0.40, 0.50])
    _run(root, "fedavg", 1, 0.1, [0.30, 0.40, 0.50])
    _run(root, "moon", 0, 0.1, [0.50, 0.60, 0.70], mu=1)
    _run(root, "moon", 1, 0.1, [0.50, 0.60, 0.70], mu=1)
    _run(root, "moon", 2, 0.1, [0.10, 0.10, 0.10], status="interrupted", mu=1)  # left out
    return root


def test_sample_std_by_hand():
    assert mean_std([70.0, 74.0]) == (72.0, pytest.approx(math.sqrt(8)))
    assert mean_std([5.0]) == (5.0, 0.0)
    assert all(math.isnan(v) for v in mean_std([]))


def test_settings_are_columns_and_algorithm_options_rows(runs: Path):
    table = group(find_runs([runs]))
    assert list(table) == ["partition_alpha=0.1", "partition_alpha=0.5"]
    assert sorted(table["partition_alpha=0.5"]) == ["fedavg", "moon (mu=1)", "moon (mu=10)"]
    assert len(table["partition_alpha=0.1"]["moon (mu=1)"].runs) == 2  # the interrupted run is left out
    half = table["partition_alpha=0.5"]
    assert half["fedavg"].stat("final_test_acc") == (pytest.approx(72.0), pytest.approx(math.sqrt(8)))
    assert half["moon (mu=1)"].stat("final_test_acc") == (pytest.approx(75.5), pytest.approx(math.sqrt(0.5)))
    assert half["moon (mu=1)"].stat("best_test_acc") == (pytest.approx(75.5), pytest.approx(math.sqrt(0.5)))


def test_rounds_to_fedavgs_final_accuracy_with_speedup_and_parameters(runs: Path):
    table = group(find_runs([runs]))
    goal = targets(table, None)["partition_alpha=0.5"]
    assert goal == pytest.approx(0.72)  # FedAvg's mean final accuracy in the same setting
    fedavg = rounds_to_target(table["partition_alpha=0.5"]["fedavg"], goal)
    moon = rounds_to_target(table["partition_alpha=0.5"]["moon (mu=1)"], goal)
    assert fedavg.rounds == [None, 3] and fedavg.params == [None, 600]  # seed 0 ends at 0.70
    assert moon.rounds == [2, 2] and moon.params == [400, 400]
    assert fedavg.mean_rounds() / moon.mean_rounds() == 1.5
    assert targets(table, 0.55)["partition_alpha=0.1"] == 0.55


def test_the_summary_says_which_differences_exceed_the_seed_spread(runs: Path):
    lines = summary_lines(group(find_runs([runs])))
    tenth, half = lines
    # +3.5 points against a spread of 2.83 + 0.71 = 3.54: within; mu=10: -11 points: beyond
    assert "moon (mu=1) vs fedavg +3.50 points, within the seed spread (3.54)" in half
    assert "moon (mu=10) vs fedavg -11.00 points, exceeds the seed spread" in half
    assert tenth.startswith("partition_alpha=0.1: moon (mu=1) leads with 70.00 ± 0.00%")
    assert "moon (mu=1) vs fedavg +20.00 points, within the seed spread (0.00)" not in tenth
    assert "exceeds the seed spread (0.00)" in tenth


def test_the_report_files(runs: Path, tmp_path: Path):
    out = write_report([runs], tmp_path / "report", None, latex=True)
    text = (out / "report.md").read_text()
    assert "| fedavg | 50.00 ± 0.00 (n=2) | 72.00 ± 2.83 (n=2) |" in text
    assert "| moon (mu=1) | 2.0 | 2 of 2 | 1.50x | 400 |" in text
    rows = list(csv.DictReader((out / "table1.csv").open()))
    assert {r["method"] for r in rows} == {"fedavg", "moon (mu=1)", "moon (mu=10)"}
    moon = next(r for r in rows if r["setting"] == "partition_alpha=0.5" and r["method"] == "moon (mu=1)")
    assert (moon["seeds"], moon["final_mean"], moon["final_std"]) == ("2", "75.5000", "0.7071")
    reach = list(csv.DictReader((out / "table2.csv").open()))
    fedavg = next(r for r in reach if r["setting"] == "partition_alpha=0.5" and r["method"] == "fedavg")
    assert (fedavg["reached"], fedavg["rounds_mean"], fedavg["params_mean"]) == ("1", "3.00", "600")
    for name in ("curves_partition_alpha_0.5.png", "curves_partition_alpha_0.1.png", "table1.tex"):
        assert (out / name).stat().st_size > 0


def test_no_completed_run_is_an_error_naming_the_folder(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="no completed run"):
        find_runs([tmp_path])


def test_personalised_runs_get_local_and_new_test_against_parameters(tmp_path: Path):
    root = tmp_path / "lg"
    for seed in (0, 1):
        _run(root, "lg", seed, 0.5, [0.5, 0.6])
        metrics = root / f"lg-{seed}-0.5-{{}}" / "metrics.jsonl"
        records = [json.loads(line) for line in metrics.read_text().splitlines()]
        records[0].update(local_test_acc=0.1, new_test_acc=0.1)  # not the last round: not reported
        records[1].update(local_test_acc=0.9 - seed / 10, new_test_acc=0.7)
        metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = write_report([root], tmp_path / "out", None)
    assert (out / "personal_all_runs.png").stat().st_size > 0
    text = (out / "report.md").read_text()
    assert "personal_all_runs.png" in text
    # local test 90 and 80 over the two seeds: mean 85, sample std sqrt(50) = 7.07
    assert "| lg | 85.00 ± 7.07 (n=2) | 70.00 ± 0.00 (n=2) |" in text
    (row,) = csv.DictReader((out / "table1.csv").open())
    assert (row["local_test_mean"], row["local_test_std"], row["new_test_mean"]) == (
        "85.0000",
        "7.0711",
        "70.0000",
    )


def test_runs_without_local_test_have_no_personalised_table(runs: Path, tmp_path: Path):
    out = write_report([runs], tmp_path / "report", None)
    assert "Personalised" not in (out / "report.md").read_text()
    assert "local_test_mean" not in (out / "table1.csv").read_text()


def test_a_key_only_newer_runs_have_is_no_setting(runs: Path):
    newer = next(runs.glob("moon-1-0.5-*mu*1}"))
    summary = json.loads((newer / "summary.json").read_text())
    summary["config"]["train_args"]["an_option_added_later"] = False
    (newer / "summary.json").write_text(json.dumps(summary))
    assert list(group(find_runs([runs]))) == ["partition_alpha=0.1", "partition_alpha=0.5"]


def _privacy(folder: Path, epsilon: float | None) -> None:
    """Gives a run privacy_args as a run writes them: DP (C 1, sigma 0.5) with its final epsilon in
    summary.json and each round's in metrics.jsonl (with the sample secret, and twice that with it
    known), or none (no epsilon anywhere)."""
    summary = json.loads((folder / "summary.json").read_text())
    dp = epsilon is not None
    summary["config"]["privacy_args"] = {
        "dp_clip_norm": 1.0 if dp else None,
        "dp_noise_multiplier": 0.5 if dp else 0.0,
        "dp_delta": 1e-5,
    }
    if dp:
        summary.update(dp_epsilon_release=epsilon, dp_epsilon_sample_known=2 * epsilon, dp_delta=1e-5)
        records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        for r in records:
            r["dp_epsilon_release"] = epsilon * (r["round"] + 1) / len(records)
            r["dp_epsilon_sample_known"] = 2 * r["dp_epsilon_release"]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "summary.json").write_text(json.dumps(summary))


def test_dp_runs_show_their_final_epsilon_and_runs_without_dp_none(tmp_path: Path):
    root = tmp_path / "dp"
    for seed, epsilon, last in ((0, 2.0, 0.55), (1, 3.0, 0.65)):
        for algorithm in ("fedavg", "moon"):
            _run(root / "on", algorithm, seed, 0.5, [0.5, last])
            _privacy(root / "on" / f"{algorithm}-{seed}-0.5-{{}}", epsilon)
            _run(root / "off", algorithm, seed, 0.5, [0.6, 0.8])
            _privacy(root / "off" / f"{algorithm}-{seed}-0.5-{{}}", None)
    out = write_report([root], tmp_path / "report", None)
    text = (out / "report.md").read_text()
    off, on = "dp_clip_norm=None, dp_noise_multiplier=0.0", "dp_clip_norm=1.0, dp_noise_multiplier=0.5"
    final = text.split("## Final test accuracy")[1].split("## Best test accuracy")[0]
    eps = "epsilon (sample secret / known)"
    assert f"| method | {off} | {off}: {eps} | {on} | {on}: {eps} |" in final
    # epsilon 2 and 3 over the two seeds: mean 2.5, known 5; accuracy 55 and 65: 60 ± sqrt(50)
    assert "| fedavg | 80.00 ± 0.00 (n=2) | - | 60.00 ± 7.07 (n=2) | 2.50 / 5.00 |" in final
    assert "| moon | 80.00 ± 0.00 (n=2) | - | 60.00 ± 7.07 (n=2) | 2.50 / 5.00 |" in final
    assert "delta = 1e-05" in final
    best = text.split("## Best test accuracy")[1].split("##")[0]
    assert "epsilon" not in best
    rows = {(r["setting"], r["method"]): r for r in csv.DictReader((out / "table1.csv").open())}
    assert rows[(on, "moon")]["epsilon_mean"] == "2.5000" and rows[(off, "moon")]["epsilon_mean"] == ""


def test_runs_without_dp_have_no_epsilon(runs: Path, tmp_path: Path):
    out = write_report([runs], tmp_path / "report", None)
    assert "epsilon" not in (out / "report.md").read_text()
    assert "epsilon" not in (out / "table1.csv").read_text()


def _clocked(folder: Path, times: list[float] | None, aggregation: str = "sync", buffer_size=None) -> None:
    """Gives a run server_args as a run writes them, and each record the simulated second it ended at
    (`times`, one a round; None: a run without train_args.party_speed, no sim_time_s)."""
    summary = json.loads((folder / "summary.json").read_text())
    summary["config"]["server_args"] = {"aggregation": aggregation, "buffer_size": buffer_size}
    summary["config"]["train_args"]["party_speed"] = None if times is None else "lognormal"
    (folder / "summary.json").write_text(json.dumps(summary))
    if times is not None:
        records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        for r, t in zip(records, times, strict=True):
            r["sim_time_s"] = t
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture
def clocked(tmp_path: Path) -> Path:
    """FedAvg synchronous and buffered (K = 5), two seeds each, on the simulated clock; MOON synchronous
    without it. FedAvg's sync final accuracy, 0.72 (mean of 0.70 and 0.74), is the target."""
    root = tmp_path / "clocked"
    runs = (
        ("fedavg", 0, [0.50, 0.60, 0.70], [4.0, 8.0, 12.0], "sync", None),  # never reaches 0.72
        ("fedavg", 1, [0.50, 0.60, 0.74], [5.0, 10.0, 15.0], "sync", None),  # round 3, 15 s
        ("fedavg", 0, [0.60, 0.73, 0.75], [1.0, 2.0, 3.0], "buffered", 5),  # round 2, 2 s
        ("fedavg", 1, [0.70, 0.72, 0.80], [1.5, 3.0, 5.0], "buffered", 5),  # round 2, 3 s
        ("moon", 0, [0.60, 0.72, 0.75], None, "sync", None),  # round 2, no clock
    )
    for algorithm, seed, accs, times, aggregation, k in runs:
        folder = root / aggregation
        _run(folder, algorithm, seed, 0.5, accs)
        _clocked(folder / f"{algorithm}-{seed}-0.5-{{}}", times, aggregation, k)
    return root


BUFFERED_ROW = "fedavg (aggregation=buffered, buffer_size=5)"


def test_a_buffered_and_a_synchronous_run_of_a_setting_are_rows_side_by_side(clocked: Path):
    table = group(find_runs([clocked]))
    assert list(table) == ["all runs"]  # how the server aggregates is no setting (column)
    assert sorted(table["all runs"]) == ["fedavg", BUFFERED_ROW, "moon"]  # synchronous FedAvg keeps its name
    assert len(table["all runs"][BUFFERED_ROW].runs) == 2
    assert targets(table, None)["all runs"] == pytest.approx(0.72)


def test_simulated_seconds_to_the_target_by_hand(clocked: Path, tmp_path: Path):
    rows = group(find_runs([clocked]))["all runs"]
    assert rounds_to_target(rows["fedavg"], 0.72).times == [None, 15.0]
    assert rounds_to_target(rows[BUFFERED_ROW], 0.72).times == [2.0, 3.0]
    assert rounds_to_target(rows["moon"], 0.72).times == [None]  # reached in round 2, no clock
    out = write_report([clocked], tmp_path / "report", None)
    text = (out / "report.md").read_text()
    # FedAvg 15 s, buffered (2 + 3) / 2 = 2.5 s: 6x sooner; rounds 3 against 2: 1.5x
    assert "| fedavg | 3.0 | 1 of 2 | 1.00x | 600 | 15.0 | 1.00x |" in text
    assert f"| {BUFFERED_ROW} | 2.0 | 2 of 2 | 1.50x | 400 | 2.5 | 6.00x |" in text
    assert "| moon | 2.0 | 1 of 1 | 1.50x | 400 | n/a | n/a |" in text
    reach = {r["method"]: r for r in csv.DictReader((out / "table2.csv").open())}
    assert (reach[BUFFERED_ROW]["sim_time_mean"], reach[BUFFERED_ROW]["time_speedup"]) == ("2.50", "6.00")
    assert reach["moon"]["sim_time_mean"] == "nan"


def test_the_time_curve_holds_each_seeds_last_accuracy(tmp_path: Path):
    root = tmp_path / "steps"
    for seed, accs, times in ((0, [0.5, 0.7, 0.72], [1.0, 3.0, 3.5]), (1, [0.6, 0.8, 0.9], [2.0, 4.0, 5.0])):
        _run(root, "fedavg", seed, 0.5, accs)
        _clocked(root / f"fedavg-{seed}-0.5-{{}}", times)
    (cell,) = group(find_runs([root]))["all runs"].values()
    xs, means, stds = time_series(cell)
    # from 2 s (both evaluated) to 3.5 s (seed 0 ends): 50 and 60, 70 and 60, 72 and 60 (not the
    # mean of matching rounds: round 1 is 50 and 60 at 1 s and 2 s)
    assert xs == [2.0, 3.0, 3.5]
    assert means == [pytest.approx(55.0), pytest.approx(65.0), pytest.approx(66.0)]
    assert stds == [pytest.approx(math.sqrt(50)), pytest.approx(math.sqrt(50)), pytest.approx(math.sqrt(72))]


def test_runs_on_the_clock_get_a_time_figure_and_runs_without_none(clocked: Path, runs: Path, tmp_path: Path):
    out = write_report([clocked], tmp_path / "timed", None)
    assert (out / "time_all_runs.png").stat().st_size > 0
    text = (out / "report.md").read_text()
    assert "![all runs](time_all_runs.png)" in text and "time_*.png: test accuracy against simulated" in text
    out = write_report([runs], tmp_path / "untimed", None)
    assert not list(out.glob("time_*.png"))
    assert "simulated" not in (out / "report.md").read_text()
    assert "sim_time_mean" not in (out / "table2.csv").read_text()
