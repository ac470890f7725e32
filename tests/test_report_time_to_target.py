"""`fedml-moon report`'s time to target where runs keep simulated time: first reach on both sides (a
synchronous run is measured at its first round at the target, not its last), client updates counting
the updates a buffer left out, mean ± std over seeds, and the rounds run apart from the settings."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from fedml_moon.results.report import write_report


def _run(root: Path, name: str, seed: int, records: list[dict], **server) -> None:
    config = {
        "train_args": {"algorithm": "fedavg", "comm_round": len(records)},
        "common_args": {"random_seed": seed},
        "server_args": {"aggregation": "sync", "buffer_size": None, **server},
        "validation_args": {"frequency_of_the_test": 1},
        "data_args": {"partition_alpha": 0.5},
    }
    folder = root / f"{name}-{seed}"
    folder.mkdir(parents=True)
    summary = {"status": "completed", "config": config, "final_test_acc": records[-1]["test_acc"]}
    summary["best_test_acc"] = max(r["test_acc"] for r in records)
    (folder / "summary.json").write_text(json.dumps(summary))
    lines = [json.dumps({"round": i, **r}) for i, r in enumerate(records)]
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def _sync(accs: list[float], seconds: float) -> list[dict]:
    """Rounds of 10 parties, each `seconds` long."""
    return [{"parties": 10, "test_acc": a, "sim_time_s": seconds * (i + 1)} for i, a in enumerate(accs)]


def _buffered(accs: list[float], seconds: float, left: int = 0) -> list[dict]:
    """Buffers of K = 5, `seconds` apart; the first leaves `left` updates out."""
    out = [
        {"parties": 5, "test_acc": a, "sim_time_s": seconds * (i + 1), "left_out": []}
        for i, a in enumerate(accs)
    ]
    out[0]["left_out"] = [[3, 0, "2 rounds stale", 1]] * left
    return out


def test_first_reach_on_both_sides_in_seconds_and_updates(tmp_path: Path):
    """Target 0.8. Sync: seed 0 reaches it in round 2 (20 s, 20 updates), then goes on to round 4
    (40 s): its time is 20, not 40; seed 1 in round 3 (30 s, 30 updates): 25 ± 7.07 s, 25 ± 7.07
    updates. Buffered: seed 0 in buffer 3 (6 s; 15 updates + 2 left out = 17), seed 1 in buffer 2
    (4 s, 10 updates): 5 ± 1.41 s, 13.5 ± 4.95 updates; 25 / 5 = 5.00x sooner, 25 / 13.5 = 1.85x fewer
    updates. The rounds run (4 and 3 sync, 3 buffered) are no setting: one table."""
    _run(tmp_path, "sync", 0, _sync([0.5, 0.8, 0.7, 0.9], 10))
    _run(tmp_path, "sync", 1, _sync([0.5, 0.6, 0.85], 10))
    buffered = {"aggregation": "buffered", "buffer_size": 5}
    _run(tmp_path, "buffered", 0, _buffered([0.5, 0.7, 0.81], 2, left=2), **buffered)
    _run(tmp_path, "buffered", 1, _buffered([0.6, 0.8, 0.5], 2), **buffered)
    out = write_report([tmp_path], tmp_path / "report", 0.8)
    rows = {r["method"]: r for r in csv.DictReader((out / "time_to_target.csv").open())}
    assert set(rows) == {"fedavg", "fedavg (aggregation=buffered, buffer_size=5)"}
    sync, buf = rows["fedavg"], rows["fedavg (aggregation=buffered, buffer_size=5)"]
    assert (sync["setting"], sync["reached"], sync["sim_s_mean"], sync["updates_mean"]) == (
        "all runs",
        "2",
        "25.00",
        "25.00",
    )
    assert float(sync["sim_s_std"]) == float(sync["updates_std"]) == 7.07
    assert (buf["sim_s_mean"], buf["sim_s_std"], buf["updates_mean"], buf["updates_std"]) == (
        "5.00",
        "1.41",
        "13.50",
        "4.95",
    )
    assert (buf["time_ratio_vs_sync"], buf["update_ratio_vs_sync"]) == ("5.00", "1.85")
    text = (out / "report.md").read_text()
    assert "## Time to target (simulated)" in text
    assert (
        "| fedavg (aggregation=buffered, buffer_size=5) | 2 of 2 | 5.0 ± 1.4 | 14 ± 5 | 5.00x | 1.85x |"
        in text
    )


def test_a_seed_that_never_reaches_the_target_is_counted_not_averaged(tmp_path: Path):
    _run(tmp_path, "sync", 0, _sync([0.5, 0.9], 10))
    _run(tmp_path, "sync", 1, _sync([0.5, 0.6], 10))
    out = write_report([tmp_path], tmp_path / "report", 0.8)
    row = next(csv.DictReader((out / "time_to_target.csv").open()))
    assert (row["seeds"], row["reached"], row["sim_s_mean"], row["sim_s_std"]) == ("2", "1", "20.00", "0.00")
    assert row["time_ratio_vs_sync"] == "-"  # the synchronous row itself
