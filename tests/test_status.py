"""`fedml-moon status RUN_DIR`: a run's status.json joined with its records, by hand-checkable
numbers (the mean of the last round times, the rounds left, the sites' last heartbeat), through the
real command line; a folder that holds no run is refused naming it. The server writing status.json
in a real gRPC run, a killed silo shown as gone and back: tests/test_dead_silo.py."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from fedml_moon.cli import main
from fedml_moon.records.recorder import RunRecorder
from fedml_moon.status import record as status
from fedml_moon.status.record import render as status_text


def _records(folder: Path, times: list[float], accs: dict[int, float]) -> None:
    lines = []
    for r, t in enumerate(times):
        record = {"round": r, "round_time_s": t, "train_loss": 1.0}
        if r in accs:
            record.update(test_acc=accs[r], test_loss=2.0 - accs[r])
        lines.append(json.dumps(record))
    (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_a_live_run_says_its_round_phase_sites_figures_and_end(tmp_path, capsys):
    now = time.time()
    sites = [
        {"rank": 1, "connected": True, "heard_at": now - 2, "rounds": 3, "refused": 0},
        {"rank": 2, "connected": False, "heard_at": now - 40, "rounds": 1, "refused": 5},
    ]
    status.write(tmp_path, {"run": "r", "algorithm": "moon", "rounds": 10, "round": 3, "phase": "training"})
    live = json.loads((tmp_path / "status.json").read_text())
    (tmp_path / "status.json").write_text(json.dumps({**live, "sites": sites}))
    _records(tmp_path, [4.0, 2.0, 3.0], {0: 0.25, 2: 0.5})

    assert main(["status", str(tmp_path), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["round"], got["rounds"], got["rounds_completed"], got["phase"]) == (3, 10, 3, "training")
    assert got["latest"] == {"round": 2, "test_acc": 0.5, "test_loss": 1.5}
    assert got["curve"] == [[0, 0.25], [2, 0.5]]
    assert got["round_time_s"] == pytest.approx(3.0) and got["eta_s"] == pytest.approx(7 * 3.0)
    assert [round(s["last_heard_s"]) for s in got["sites"]] == [2, 40]

    assert main(["status", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "run r: moon, round 3 of 10 (from 0), training (3 rounds recorded" in text
    assert "test accuracy 0.5000, loss 1.5000 (round 2)" in text
    assert "test accuracy 0.250 ▁█ 0.500" in text
    assert "round time 3.0 s, done in about 21 s" in text
    assert "site rank 2: gone, last heard 40 s ago, 1 rounds taken part in, 5 messages refused" in text


def test_a_finished_run_is_read_from_its_records_and_watch_ends_with_it(tmp_path, capsys):
    """A run folder of an earlier version (no status.json): its summary and records say it all;
    `--watch` on a finished run prints it once and returns."""
    _records(tmp_path, [1.0, 1.0], {1: 0.75})
    summary = {"status": "completed", "config": {"train_args": {"algorithm": "fedavg", "comm_round": 2}}}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert main(["status", str(tmp_path), "--watch", "0.1", "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    got = json.loads(lines[0])
    assert (got["algorithm"], got["rounds"], got["phase"], got["eta_s"]) == ("fedavg", 2, "finished", None)


def test_the_recorder_writes_the_round_in_progress_and_the_end(tmp_path):
    """Each round's record moves status.json to the next round; finish writes the end; the fields a
    server published stay (its sites) unless it publishes them again."""
    config = {"train_args": {"algorithm": "moon", "comm_round": 2}}
    recorder = RunRecorder(tmp_path / "run", config)
    assert not (tmp_path / "run" / "status.json").exists()  # building a recorder writes nothing
    recorder.publish(phase="waiting for sites", round=0, sites=[{"rank": 1}])
    recorder.log_round({"round": 0, "round_time_s": 1.0})
    mid = status.read(tmp_path / "run")
    assert (mid["round"], mid["phase"], mid["sites"][0]["rank"]) == (1, "waiting for sites", 1)
    recorder.log_round({"round": 1, "round_time_s": 1.0, "test_acc": 0.5, "test_loss": 1.0})
    recorder.finish("completed")
    end = status.read(tmp_path / "run")
    assert (end["round"], end["phase"], end["rounds_completed"]) == (2, "finished", 2)


def test_a_folder_without_a_run_is_refused_naming_it(tmp_path, capsys):
    assert main(["status", str(tmp_path / "nothing")]) == 2
    assert f"{tmp_path / 'nothing'} holds no run" in capsys.readouterr().err
    assert main(["status", str(tmp_path), "--watch", "0"]) == 2
    assert "--watch takes seconds > 0" in capsys.readouterr().err


def test_the_sparkline_spans_lowest_to_highest():
    assert status.sparkline([0.0, 0.5, 1.0]) == "▁▅█"
    assert status.sparkline([0.3, 0.3]) == "▁▁"
    assert status.sparkline([]) == "" and len(status.sparkline(list(range(100)))) == status.CURVE_WIDTH


def test_a_sites_refused_count_is_its_refused_messages_only_and_its_sources_are_bounded():
    """`refused` in the server's status: every refusal of the rank's messages, logged or only counted;
    a BYE or an ERROR logged the same way is not one; a flood of sources adds no more than
    COUNTED_SOURCES keys (the rest under "other sources")."""
    import logging

    from fedml_moon.status import refusals

    log = refusals.RefusalLog(logging.getLogger("fedml_moon.test.status"), per_source=1)
    for _ in range(3):  # the first logged in full, the others only counted
        log.refused("rank 2", "HELLO refused: another config")
    log.refused("rank 2", "rank 2 said BYE in the train phase", reason="a BYE", counted=False)
    log.refused("rank 1", "rank 1 failed: out of memory", reason="an ERROR", counted=False)
    assert log.by_source["rank 2"] == 3 and log.by_source["rank 1"] == 0 and log.count == 5
    for i in range(refusals.COUNTED_SOURCES + 10):
        log.refused(f"10.0.0.{i}", "no token")
    assert len(log.by_source) == refusals.COUNTED_SOURCES + 1
    assert log.by_source[refusals.OTHER_SOURCES] == 11
    # by reason: a refusal's own short reason, else one name; BYE and ERROR are no refusals
    assert log.by_reason == {refusals.UNNAMED_REASON: refusals.COUNTED_SOURCES + 13}
    for i in range(refusals.COUNTED_REASONS + 5):  # reasons are bounded in number as sources are
        log.refused("rank 3", "a malformed message", reason=f"reason {i}")
    assert len(log.by_reason) == refusals.COUNTED_REASONS + 1
    assert log.by_reason[refusals.OTHER_REASONS] == 6


def test_a_status_file_alone_never_blocks_a_new_run_in_its_folder(tmp_path):
    """A run refused before its first record (its sites never came) leaves status.json: a new run
    in the folder is not refused for it, whatever it holds; a run's records still are."""
    from fedml_moon.config.schema import ConfigError
    from fedml_moon.records.folder import claim_folder

    status.write(tmp_path, {"run": "r", "round": 0, "phase": "waiting for sites"})
    claim_folder(tmp_path, overwrite=False)
    (tmp_path / "status.json").write_text("not json {")
    claim_folder(tmp_path, overwrite=False)
    (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(ConfigError, match="summary.json"):
        claim_folder(tmp_path, overwrite=False)


def test_the_pages_curves_stand_on_a_scale_from_zero_with_their_rounds():
    """A drop from 3 parties to 2 shows as a third of the way down, not as a fall to the bottom; the
    scale (0, its middle, its top) and the first and last rounds are written on the axes."""
    from fedml_moon.status.page import CHART, MARGIN, chart

    svg = chart("parties per round", [(4, 3), (5, 2), (6, 3)])
    line = re.search(r'points="([^"]+)"', svg).group(1)
    points = [tuple(map(float, p.split(","))) for p in line.split()]
    bottom = CHART[1] - MARGIN[3]
    (_, top), (_, two) = points[0], points[1]
    assert (two - top) / (bottom - top) == pytest.approx(1 / 3, abs=0.005)  # drawn to a tenth of a pixel
    labels = re.findall(r">([^<>]+)</text>", svg)
    assert labels[:3] == ["0", "1.5", "3"] and {"4", "6", "round"} <= set(labels)
    accuracy = chart("test accuracy", [(0, 0.2), (1, 0.4)], top=1.0)
    assert re.findall(r">([^<>]+)</text>", accuracy)[:3] == ["0", "0.5", "1"]


def test_a_site_never_heard_is_not_yet_connected_not_gone():
    from fedml_moon.status.page import render_html

    never = {"rank": 1, "connected": False, "heard_at": None, "rounds": 0, "refused": 0}
    sites = [never, {**never, "rank": 2, "heard_at": time.time() - 9, "rounds": 2}]
    status = {"run": "r", "rounds": 5, "round": 0, "phase": "waiting for sites", "sites": sites}
    status = {**status, "rounds_completed": 0, "latest": None, "curve": []}
    text = status_text(status)
    assert "site rank 1: not yet connected, 0 rounds" in text and "site rank 2: gone, last heard" in text
    page = render_html(status, [])
    assert 'class="site not-yet-connected" id="site-1"' in page and 'class="site gone" id="site-2"' in page
