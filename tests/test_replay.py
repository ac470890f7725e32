"""`fedml-moon replay RUN_DIR`: a buffered run replayed from its records ends at the run's model bit
for bit, with the same records (updates kept and left out); MOON's party state advances through the
updates left out too; edited records are reported as a replay that diverged, naming the round; a
synchronous run, a folder without records and a replay folder already written are refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from fedml_moon.adapters.run import build_base, build_runner, build_server
from fedml_moon.config.load import config_from_dict
from fedml_moon.engine.replay import ReplayDiverged, ReplaySimulation, arrivals
from tests.support.buffered_runs import (
    BUFFERED,
    max_distance,
    read_once,  # noqa: F401 (a fixture of this module)
    run_standalone,
)
from tests.support.cli import restored_main
from tests.support.marks import needs_fmnist

STALE = [  # three parties, two buffers' worth training at once, K = 2: the slow ones come in stale
    *BUFFERED,
    "train_args.party_speed=lognormal",
    "server_args.buffer_size=2",
    "server_args.concurrency=3",
    "server_args.max_staleness=0",
    "train_args.comm_round=4",
]
MOON_STALE = [  # four parties, three at once, K = 1: party 0's stale update is refused, then it trains on
    *BUFFERED,
    "train_args.party_speed=lognormal",
    "server_args.buffer_size=1",
    "server_args.concurrency=3",
    "train_args.client_num_in_total=4",
    "server_args.max_staleness=1",
    "train_args.comm_round=6",
]


def _records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def _replay(run_dir: Path, out: Path, records: list[dict] | None = None) -> list[dict]:
    """ReplaySimulation of `run_dir` (its records, or `records`) into `out`; the replayed records."""
    cfg = config_from_dict(json.loads((run_dir / "summary.json").read_text())["config"])
    base = build_base(cfg, out)
    loop = ReplaySimulation(build_server(base), build_runner(base), cfg, records or _records(run_dir))
    loop.run()
    return _records(out)


@pytest.fixture(autouse=True)
def no_pictures(monkeypatch):
    monkeypatch.setattr("fedml_moon.data.federated.save_partition_heatmap", lambda *a: None)
    monkeypatch.setattr("fedml_moon.records.recorder.RunRecorder.plot", lambda *a: None)


@pytest.fixture(scope="module")
def stale_run(tmp_path_factory) -> Path:
    """A FedAvg buffered run with updates refused as too stale, its folder (read-only to the tests)."""
    folder = tmp_path_factory.mktemp("stale") / "run"
    with pytest.MonkeyPatch.context() as patch:
        run_standalone(folder, "fedavg", STALE, patch)
    return folder


def test_the_records_arrivals_merge_by_position():
    records = [
        {"round": 0, "updates": [[1, 0], [2, 0]], "left_out": []},
        {"round": 1, "updates": [[0, 1], [1, 1]], "left_out": [[2, 0, "1 rounds stale", 1], [0, 0, "x", 0]]},
    ]
    got = [(a.record, a.party, a.start, a.kept, a.fills) for a in arrivals(records)]
    assert got == [
        (0, 1, 0, True, False),
        (0, 2, 0, True, True),
        (1, 0, 0, False, False),
        (1, 0, 1, True, False),
        (1, 2, 0, False, False),
        (1, 1, 1, True, True),
    ]


@needs_fmnist
def test_a_buffered_run_replays_to_its_model_and_records(stale_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(stale_run, run)
    records = _records(run)
    assert any(r["left_out"] for r in records)  # the run refused stale updates: the replay must too
    with restored_main() as main:
        assert main(["replay", str(run)]) == 0
        said = capsys.readouterr().out
        assert "largest difference" in said and "the same model" in said
        assert main(["replay", str(run)]) == 2  # the replay's folder holds its records now
        refused = capsys.readouterr()
        assert "--overwrite" in refused.err + refused.out and "--resume" not in refused.err + refused.out
        assert main(["replay", str(run), "--overwrite", "--atol", "0"]) == 0
    replayed = _records(run / "replay")
    final = torch.load(run / "replay" / "final_model.pt", weights_only=True)
    assert max_distance(final, torch.load(run / "final_model.pt", weights_only=True)) <= 1e-6
    for key in ("round", "updates", "left_out", "refused_stale", "sim_time_s", "train_loss"):
        assert [r[key] for r in replayed] == [r[key] for r in records], key


@needs_fmnist
def test_moon_party_state_advances_through_the_updates_left_out(tmp_path, monkeypatch):
    """Party 0's update is refused as too stale and it trains again: its next upload depends on the
    previous model the refused round left it (MOON's l_con), and on how far its data stream went."""
    final, records = run_standalone(tmp_path / "run", "moon", MOON_STALE, monkeypatch)
    events = arrivals(records)
    after = [b for i, a in enumerate(events) if not a.kept for b in events[i + 1 :] if b.party == a.party]
    assert any(b.kept for b in after)  # a party trained on after an update of its was left out
    replayed = _replay(tmp_path / "run", tmp_path / "replay")
    assert max_distance(torch.load(tmp_path / "replay" / "final_model.pt", weights_only=True), final) <= 1e-6
    assert [r["updates"] for r in replayed] == [r["updates"] for r in records]
    assert [r["l_con"] for r in replayed] == [r["l_con"] for r in records]
    without = [{**r, "left_out": []} for r in records]  # the refused rounds not trained: another state
    with pytest.raises(ReplayDiverged, match=r"^the replay diverged at round \d: its updates"):
        _replay(tmp_path / "run", tmp_path / "without", without)


@needs_fmnist
def test_an_update_moved_to_another_party_diverges(stale_run, tmp_path, capsys):
    records = _records(stale_run)
    r = next(i for i, rec in enumerate(records) if i > 0 and rec["updates"][0][1] == i)  # a fresh update
    party = records[r]["updates"][0][0]
    moved = json.loads(json.dumps(records))
    moved[r]["updates"][0][0] = other = next(p for p in range(3) if p != party)
    run = tmp_path / "run"
    shutil.copytree(stale_run, run)
    (run / "metrics.jsonl").write_text("".join(json.dumps(rec) + "\n" for rec in moved))
    with restored_main() as main:
        assert main(["replay", str(run)]) == 1
    said = capsys.readouterr().err
    assert f"the replay diverged at round {r}: its updates (party, version) [[{other}, {r}]" in said
    kept = json.loads(json.dumps(records))  # a refused stale update said to be kept
    rs = next(i for i, rec in enumerate(kept) if rec["left_out"])
    party, start, _, position = kept[rs]["left_out"].pop(0)
    kept[rs]["updates"].insert(position, [party, start])
    with pytest.raises(ReplayDiverged, match=f"at round {rs}: party {party}'s update from version {start} "
                       "was kept in the run, not in the replay"):  # fmt: skip
        _replay(stale_run, tmp_path / "kept", kept)


@needs_fmnist
def test_a_synchronous_run_or_no_records_is_refused(stale_run, tmp_path, capsys, monkeypatch):
    run_standalone(tmp_path / "sync", "fedavg", ["train_args.comm_round=1"], monkeypatch)
    empty = tmp_path / "empty"
    shutil.copytree(stale_run, empty)
    (empty / "metrics.jsonl").write_text("")
    with restored_main() as main:
        assert main(["replay", str(tmp_path / "sync")]) == 2
        assert "config error: " in (said := capsys.readouterr().err)
        assert "server_args.aggregation is 'sync', not buffered" in said
        assert main(["replay", str(empty)]) == 2
        assert "no records (metrics.jsonl is missing or empty)" in capsys.readouterr().err
        assert main(["replay", str(tmp_path / "nothing")]) == 2
        assert "not a run folder (no summary.json)" in capsys.readouterr().err
    assert not (tmp_path / "sync" / "replay").exists() and not (empty / "replay").exists()


@needs_fmnist
def test_a_cross_silo_runs_records_replay_in_one_process(stale_run, tmp_path, capsys):
    """A distributed run's folder holds the same records and a cross-silo config: the replay is the
    standalone simulation's whatever the run's mode (here the standalone run's records, said to be a
    gRPC run's); a run on the sites' own data, which no one process holds, is refused."""
    run = tmp_path / "run"
    shutil.copytree(stale_run, run)
    summary = json.loads((run / "summary.json").read_text())
    summary["config"]["common_args"]["training_type"] = "cross_silo"
    summary["config"]["comm_args"]["backend"] = "GRPC"
    (run / "summary.json").write_text(json.dumps(summary))
    with restored_main() as main:
        assert main(["replay", str(run), "--atol", "0"]) == 0
        assert "largest difference" in capsys.readouterr().out
        data = dict(dataset="imagefolder", partition_method="natural", max_train_samples=None)
        summary["config"]["data_args"].update(data, max_test_samples=None)
        (run / "summary.json").write_text(json.dumps(summary))
        assert main(["replay", str(run), "--output-dir", str(tmp_path / "own")]) == 2
    assert "the sites' own data" in capsys.readouterr().err


@needs_fmnist
def test_a_run_with_an_availability_trace_and_arrivals_replays_to_its_model(tmp_path, monkeypatch):
    """The rounds the trace cut off are left out in the records ("went offline"); the replay, which
    keeps no clock, leaves them out as the record says and ends with the run's model."""
    trace = tmp_path / "trace.csv"
    trace.write_text("party,start,end\n0,0,2.2\n1,0,inf\n2,1.5,inf\n")
    sets = ["server_args.aggregation=buffered", "server_args.buffer_size=1", "train_args.comm_round=6"]
    sets += ["train_args.client_num_in_total=3", "train_args.client_num_per_round=3"]
    sets += [f"train_args.availability_file={trace}", "server_args.arrival_rate=3"]
    final, records = run_standalone(tmp_path / "run", "fedavg", sets, monkeypatch)
    assert any(why == "went offline" for r in records for _, _, why, _ in r["left_out"])
    replayed = _replay(tmp_path / "run", tmp_path / "replay")
    assert max_distance(torch.load(tmp_path / "replay" / "final_model.pt", weights_only=True), final) <= 1e-6
    assert [(r["updates"], r["left_out"]) for r in replayed] == [
        (r["updates"], r["left_out"]) for r in records
    ]
