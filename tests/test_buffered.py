"""`server_args.aggregation: buffered` (FedBuff) in the standalone simulation: the discount and the
buffer by hand, the simulated clock, a whole run's model checked update by update against Algorithm 1,
the reduction to the synchronous round, determinism, max_staleness, every algorithm that buffers, and
the refusals, each naming its key."""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from fedml_moon.adapters.run import assemble
from fedml_moon.algorithms.base import ServerAlgorithm
from fedml_moon.config.load import load_config
from fedml_moon.config.schema import ConfigError, ServerArgs
from fedml_moon.core.fedbuff import Buffer, discount
from fedml_moon.core.sim_clock import SimClock, party_durations, read_times
from fedml_moon.privacy.sums import Sums, contribution
from tests.support.bn_cnn import REF as BN_NETWORK
from tests.support.buffered_runs import (
    BUFFERED,
    CONFIGS,
    SECURE,
    TINY,
    algorithm_1_sets,
    max_distance,
    read_once,  # noqa: F401 (a fixture of this module)
    run_standalone,
)
from tests.support.marks import needs_fmnist
from tests.support.tiny import Stop, stop_after, train_args

MPI = ["comm_args.backend=MPI", "validation_args.local_test=false"]  # the MPI simulation


# --- the math, by hand ------------------------------------------------------------------------------
def test_the_discounts_are_the_papers():
    assert discount("sqrt", 0) == 1.0 and discount("sqrt", 3) == 0.5  # 1 / sqrt(1 + 3)
    assert discount("polynomial", 1, 2.0) == 0.25 and discount("polynomial", 3, 0.5) == discount("sqrt", 3)
    assert discount("constant", 7) == 1.0
    with pytest.raises(ValueError, match="staleness must be >= 0"):
        discount("sqrt", -1)


def test_a_two_update_buffer_by_hand():
    """x = 1; Delta_1 = +2 fresh (s = 1), Delta_2 = +4 three rounds stale (s = 1/2); K = 2, uniform:
    x + eta (2 + 2) / 2 = 1 + 2 eta; with eta = 0.5 that is 2."""
    x = OrderedDict(w=torch.tensor([1.0]))
    buffer = Buffer()
    for delta, tau in ((2.0, 0), (4.0, 3)):
        upload = {"model": {"w": x["w"] + delta}}
        buffer.add(contribution(upload, {"model": x}, {"model": "update"}, discount("sqrt", tau)), 1.0, tau)
    assert (
        len(buffer) == 2
        and buffer.weight == 2.0
        and buffer.stats() == {"staleness_mean": 1.5, "staleness_max": 3}
    )
    for eta, want in ((1.0, 3.0), (0.5, 2.0)):
        server = ServerAlgorithm(None, ServerArgs(server_lr=eta), train_args())
        new = server.aggregate_sums(x, Sums(buffer.weight, len(buffer), buffer.fields))
        assert new["w"].item() == pytest.approx(want, abs=1e-6)


def test_the_clock_breaks_ties_by_party_id_and_cycles_a_files_times(tmp_path):
    times = tmp_path / "times.csv"
    times.write_text("party,seconds\n2,1.0\n0,1.0\n1,0.5\n1,1.5\n")
    clock = SimClock(read_times(times, 3))
    for party in (2, 0, 1):
        clock.start(party)
    assert clock.next_instant() == (0.5, [1])
    clock.start(1)  # its second time: 1.5 from 0.5
    assert clock.next_instant() == (1.0, [0, 2])
    assert clock.next_instant() == (2.0, [1])
    clock.start(1)  # cycles back to 0.5
    assert clock.next_instant() == (2.5, [1])
    assert clock.sync_round([0, 1, 2]) == 4.0  # a synchronous round waits for the slowest (party 1's 1.5)


def test_party_speeds_are_seeded_and_a_bad_file_is_named(tmp_path):
    for kind in ("lognormal", "halfnormal"):
        assert party_durations(kind, 5, 1) == party_durations(kind, 5, 1) != party_durations(kind, 5, 2)
    assert party_durations("constant", 2, 0) == [[1.0], [1.0]]
    noted = tmp_path / "noted.csv"  # comments, then a header, then the times
    noted.write_text("# measured on 2 sites\nparty,seconds\n0,1.0\n# party 1\n1,2.5\n")
    assert read_times(noted, 2) == [[1.0], [2.5]]
    bad = tmp_path / "bad.csv"
    bad.write_text("0,1.0\n1,fast\n")
    with pytest.raises(ValueError, match=r"bad.csv, line 2: write party,seconds"):
        read_times(bad, 2)
    bad.write_text("0,1.0\n")
    with pytest.raises(ValueError, match=r"no time for parties \[1\]"):
        read_times(bad, 2)


# --- whole runs (in-process, a few hundred images) -------------------------------------------------
@needs_fmnist
def test_a_run_is_algorithm_1_update_by_update(tmp_path, monkeypatch):
    """Two parties both training, K = 2, party 0 taking 1 s and party 1 1.5 s. t=1: party 0 (A, from
    x0) into the buffer, party 0 again from x0 (C); t=1.5: party 1 (B) fills it: x1 = x0 + (dA + dB) / 2;
    party 1 from x1 (D). t=2: C arrives one round stale; party 0 from x1 (E); t=3: E fills the buffer:
    x2 = x1 + (dC / sqrt(2) + dE) / 2."""
    sets = algorithm_1_sets(tmp_path)
    spy: list = []
    final, records = run_standalone(tmp_path, "fedavg", sets, monkeypatch, spy)
    assert [p for p, _, _ in spy] == [0, 1, 0, 0, 1]  # A and B together, C, then E and D together
    (_, x0, a), (_, _, b), (_, _, c), (_, x1, e), _ = ((p, s["model"], u["model"]) for p, s, u in spy)

    def delta(up: dict, base: dict, k: str) -> torch.Tensor:
        return up[k].double() - base[k].double()

    want1 = {k: x0[k].double() + (delta(a, x0, k) + delta(b, x0, k)) / 2 for k in x0}
    assert max_distance(want1, x1) <= 1e-6
    want2 = {k: x1[k].double() + (delta(c, x0, k) / math.sqrt(2) + delta(e, x1, k)) / 2 for k in x1}
    assert max_distance(want2, final) <= 1e-6
    assert [r["sim_time_s"] for r in records] == [1.5, 3.0]
    assert [(r["staleness_mean"], r["staleness_max"], r["refused_stale"]) for r in records] == [
        (0, 0, 0),
        (0.5, 1, 0),
    ]
    assert [r["parties"] for r in records] == [2, 2]


@needs_fmnist
def test_max_staleness_refuses_and_counts(tmp_path, monkeypatch):
    """K = 1: party 0 (1 s) applies rounds 0 and 1 alone; party 1 (2.5 s, from x0) arrives two rounds
    stale at t=2.5 and is refused under max_staleness 1, counted in round 2's record (t=3)."""
    speeds = tmp_path / "speeds.csv"
    speeds.write_text("0,1.0\n1,2.5\n")
    sets = [*BUFFERED, "train_args.client_num_in_total=2", "train_args.client_num_per_round=2"]
    sets += ["train_args.comm_round=3", "server_args.buffer_size=1", "server_args.max_staleness=1"]
    sets += ["train_args.party_speed=file", f"train_args.party_speed_file={speeds}"]
    _, records = run_standalone(tmp_path / "limited", "fedavg", sets, monkeypatch)
    assert [(r["sim_time_s"], r["staleness_max"], r["refused_stale"]) for r in records] == [
        (1.0, 0, 0),
        (2.0, 0, 0),
        (3.0, 0, 1),
    ]
    _, records = run_standalone(tmp_path / "unlimited", "fedavg", sets[:-3] + sets[-2:], monkeypatch)
    assert [(r["sim_time_s"], r["staleness_max"]) for r in records] == [(1.0, 0), (2.0, 0), (2.5, 2)]


@needs_fmnist
def test_every_party_at_once_with_no_staleness_is_the_synchronous_round(tmp_path, monkeypatch):
    """K = concurrency = the parties sampled = all of them, equal speeds: every slot frees at the same
    instant, the buffer is the round's uploads, every update fresh (s = 1), and the samples-weighted
    buffer is sum_i n_i Delta_i / sum_i n_i, FedAvg's step. The same model to float rounding, the
    same training loss; and the synchronous run with a clock waits 1 s a round."""
    sets = ["train_args.client_num_per_round=3", "train_args.party_speed=constant"]
    sync, sync_records = run_standalone(tmp_path / "sync", "fedavg", sets, monkeypatch)
    buffered, records = run_standalone(
        tmp_path / "buffered", "fedavg", [*sets, *BUFFERED, "server_args.buffer_weights=samples"], monkeypatch
    )
    assert max_distance(sync, buffered) <= 1e-6
    assert [r["sim_time_s"] for r in sync_records] == [r["sim_time_s"] for r in records] == [1.0, 2.0]
    for a, b in zip(sync_records, records, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-9) and a["bytes_up"] == b["bytes_up"]


@needs_fmnist
def test_the_same_seed_gives_the_same_model_bit_for_bit(tmp_path, monkeypatch):
    sets = [
        *BUFFERED,
        "train_args.party_speed=lognormal",
        "server_args.buffer_size=1",
        "train_args.comm_round=3",
    ]
    first, a = run_standalone(tmp_path / "a", "moon", sets, monkeypatch)
    second, b = run_standalone(tmp_path / "b", "moon", sets, monkeypatch)
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert [r["sim_time_s"] for r in a] == [r["sim_time_s"] for r in b]
    other, c = run_standalone(tmp_path / "c", "moon", [*sets, "common_args.random_seed=1"], monkeypatch)
    assert [r["sim_time_s"] for r in c] != [r["sim_time_s"] for r in a]


BUFFERS = {  # each algorithm that buffers, beside fedavg and moon above
    "fedprox": ("fedprox", []),
    "fedavgm": ("fedavg", ["server_args.server_momentum=0.9"]),
    "fedssc": ("fedssc", ["algorithm_args.prototype_mode=mean"]),
    "lg": ("lg", ["algorithm_args.warmup_rounds=0", "data_args.partition_method=hetero"]),
}


@needs_fmnist
@pytest.mark.parametrize("case", list(BUFFERS))
def test_each_algorithm_runs_buffered_rounds(case, tmp_path, monkeypatch):
    name, extra = BUFFERS[case]
    sets = [*BUFFERED, *extra, "train_args.party_speed=halfnormal", "server_args.buffer_size=1"]
    final, records = run_standalone(tmp_path, name, sets, monkeypatch)
    assert [r["round"] for r in records] == [0, 1] and all(r["parties"] == 1 for r in records)
    assert all(torch.isfinite(t.double()).all() for t in final.values())
    assert records[0]["sim_time_s"] <= records[1]["sim_time_s"]


@pytest.mark.parametrize(
    ("config", "sets", "key", "why"),
    [
        ("scaffold", [], "server_args.aggregation", "scaffold cannot buffer: a party's delta_c"),
        ("solo", [], "server_args.aggregation", "solo sums nothing"),
        (
            "moon",
            [
                "common_args.training_type=cross_silo",
                "comm_args.backend=MPI",
                "train_args.party_speed=constant",
            ],
            "train_args.party_speed",
            "real pace",
        ),
        ("moon", ["server_args.robust_aggregation=median"], "server_args.aggregation", "robust_aggregation"),
        ("moon", ["train_args.stream_uploads=true"], "server_args.aggregation", "stream_uploads"),
        ("fedssc", [], "server_args.aggregation", "prototype_mode: random-k picks some parties"),
        (
            "moon",
            [
                "privacy_args.secure_aggregation=true",
                "validation_args.local_test=false",
                "server_args.buffer_size=2",
            ],
            "server_args.buffer_size",
            "at least 3 parties a round",
        ),
        (
            "moon",
            [*SECURE, "server_args.buffer_size=4", "privacy_args.secagg_min_group=5"],
            "privacy_args.secagg_min_group",
            "exceeds server_args.buffer_size=4",
        ),
        (
            "moon",
            [
                "privacy_args.dp_clip_norm=1",
                "privacy_args.dp_noise_multiplier=1",
                "server_args.buffer_size=11",
            ],
            "server_args.buffer_size",
            "at most one update per party",
        ),
        ("moon", ["server_args.staleness=linear"], "server_args.staleness", "'linear'"),
        ("moon", ["server_args.buffer_size=0"], "server_args.buffer_size", "must be >= 1"),
        ("moon", ["server_args.concurrency=11"], "server_args.concurrency", "client_num_in_total \\(10\\)"),
        ("moon", ["server_args.max_staleness=-1"], "server_args.max_staleness", ">= 0"),
        ("moon", ["server_args.buffer_weights=equal"], "server_args.buffer_weights", "uniform"),
        ("moon", ["train_args.party_speed=fast"], "train_args.party_speed", "'fast' is unknown"),
        ("moon", ["train_args.party_speed=file"], "train_args.party_speed_file", "None is not a file"),
        ("moon", ["train_args.party_speed_sigma=0"], "train_args.party_speed_sigma", "> 0"),
        (
            "moon",
            ["server_args.aggregation=sync", "train_args.party_speed=constant", "comm_args.backend=MPI"],
            "train_args.party_speed",
            "standalone simulation only",
        ),
    ],
)
def test_config_errors_name_the_key(config, sets, key, why):
    with pytest.raises(ConfigError, match=f"^{key}: .*{why}"):
        load_config(CONFIGS / f"{config}.yaml", [*BUFFERED, *sets])


def test_a_synchronous_run_is_the_default_and_a_distributed_buffered_resume_needs_a_checkpoint(tmp_path):
    """--resume of a distributed buffered server (tests/test_buffered_resume.py) in a folder without a
    checkpoint is refused as a synchronous one is, before anything is written."""
    from fedml_moon.distributed.deploy import build_process

    cfg = load_config(CONFIGS / "moon.yaml", [])
    assert cfg.server_args.aggregation == "sync" and cfg.train_args.party_speed is None
    silos = [*BUFFERED, *MPI, "common_args.training_type=cross_silo"]
    with pytest.raises(ConfigError, match="^--resume .*: no checkpoint there"):
        build_process(load_config(CONFIGS / "moon.yaml", silos), tmp_path, 0, size=3, resume=True)
    assert not list(tmp_path.iterdir())  # refused before anything is written


@needs_fmnist
def test_unusable_updates_are_left_out_and_a_buffer_that_cannot_fill_stops_the_run(tmp_path, monkeypatch):
    """Party 1's uploads hold NaN: each is left out, named in the record's rejected_parties, and the
    buffers fill from party 0 and 2; when every upload is NaN no buffer can fill, and the run stops
    (BadUpload) after 10 x max(K, concurrency) updates in a row left out, not in an endless loop."""
    from fedml_moon.errors import BadUpload

    monkeypatch.setattr("fedml_moon.data.federated.save_partition_heatmap", lambda *a: None)
    monkeypatch.setattr("fedml_moon.records.recorder.RunRecorder.plot", lambda *a: None)

    def poisoned(run, bad):
        honest = run.loop.runner.train_many

        def train_many(tasks, round_idx):
            out = honest(tasks, round_idx)
            for (p, _), (_, upload) in zip(tasks, out, strict=True):
                if p in bad:
                    upload["model"] = {k: v.float() * float("nan") for k, v in upload["model"].items()}
            return out

        monkeypatch.setattr(run.loop.runner, "train_many", train_many)

    sets = [*TINY, *BUFFERED, "server_args.buffer_size=1", "model_args.model=mlp"]
    run = assemble(load_config(CONFIGS / "fedavg.yaml", sets), tmp_path / "one")
    poisoned(run, {1})
    run.loop.run()
    records = [json.loads(line) for line in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(r.get("rejected_parties", [1]) == [1] for r in records)
    run = assemble(load_config(CONFIGS / "fedavg.yaml", sets), tmp_path / "all")
    poisoned(run, {0, 1, 2})
    with pytest.raises(BadUpload, match="20 updates in a row left out"):
        run.loop.run()


@needs_fmnist
@pytest.mark.parametrize(
    "clock",
    [
        ["train_args.party_speed=lognormal"],
        [
            "train_args.party_speed=exponential",
            "train_args.party_speed_draw=round",
            "train_args.party_speed_per_example=true",
            "train_args.bandwidth_mbps=10",
        ],
    ],
    ids=["per-party", "per-round-example-bandwidth"],
)
def test_a_resumed_synchronous_run_keeps_its_simulated_clock(clock, tmp_path, monkeypatch):
    """A synchronous run with party_speed, stopped in round 2 and resumed from its round-1
    checkpoint, records the uninterrupted run's sim_time_s: the clock comes back with the checkpoint
    (fresh draws per round, per example, with the bytes' cost, too)."""
    monkeypatch.setattr("fedml_moon.data.federated.save_partition_heatmap", lambda *a: None)
    monkeypatch.setattr("fedml_moon.records.recorder.RunRecorder.plot", lambda *a: None)
    sets = [
        *TINY,
        "train_args.comm_round=3",
        "train_args.checkpoint_every=1",
        *clock,
    ]
    _, whole = run_standalone(tmp_path / "whole", "fedavg", sets[len(TINY) :], monkeypatch)
    cfg = load_config(CONFIGS / "fedavg.yaml", sets)
    run = assemble(cfg, tmp_path / "stopped")
    honest = run.loop.runner.train_many

    def train_many(tasks, round_idx):
        if round_idx == 2:
            raise RuntimeError("killed")
        return honest(tasks, round_idx)

    monkeypatch.setattr(run.loop.runner, "train_many", train_many)
    with pytest.raises(RuntimeError, match="killed"):
        run.loop.run()
    assemble(cfg, tmp_path / "stopped", resume=True).loop.run()
    lines = (tmp_path / "stopped" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["sim_time_s"] for line in lines] == [r["sim_time_s"] for r in whole]
    assert len(whole) == 3 and whole[0]["sim_time_s"] < whole[1]["sim_time_s"] < whole[2]["sim_time_s"]


@needs_fmnist
def test_a_plugin_whose_sums_drop_a_field_is_refused_before_any_round(tmp_path):
    """A buffer holds sums only: a plugin whose `summed` leaves out upload fields is refused at
    set-up, naming server_args.aggregation and the fields, as under privacy_args."""
    root = Path(__file__).resolve().parent
    sets = [
        f"common_args.plugins=[{root / 'support' / 'kit_plugins.py'}:unsummed]",
        "train_args.algorithm=proto_unsummed",
        *TINY,
        *BUFFERED,
    ]
    cfg = load_config(root.parent / "examples" / "fedproto" / "fedproto.yaml", sets)
    with pytest.raises(
        ConfigError, match=r"^server_args.aggregation: proto_unsummed's uploads hold \['proto_sum'"
    ):
        assemble(cfg, tmp_path)
    assert not (tmp_path / "metrics.jsonl").exists()


@needs_fmnist
@pytest.mark.parametrize(
    ("speed", "stop_in", "extra"),
    [
        ("lognormal", 3, ["server_args.server_optimizer=yogi", "server_args.server_lr=0.05"]),
        ("constant", 1, []),
        ("constant", 1, [f"model_args.model={BN_NETWORK}"]),
    ],
    ids=["yogi", "part-filled", "batchnorm"],
)
def test_a_buffered_run_stopped_and_resumed_is_the_same_run(speed, stop_in, extra, tmp_path, monkeypatch):
    """MOON (each party's previous model in the store), 3 of 4 parties training at once, K = 2, a
    checkpoint after every round: stopped abruptly once round `stop_in` is recorded, resumed with
    `assemble(..., resume=True)`: bit for bit the model and the records of the run never stopped. The
    checkpoints hold jobs in flight, some trained; at constant speed the three updates of an instant
    fill a buffer and begin the next, so they hold a part-filled buffer too (with a BatchNorm network,
    its running statistics' shifts); FedYogi's moments come back with the server's state."""
    monkeypatch.setattr("fedml_moon.data.federated.save_partition_heatmap", lambda *a: None)
    monkeypatch.setattr("fedml_moon.records.recorder.RunRecorder.plot", lambda *a: None)
    sets = [*TINY, *BUFFERED, "train_args.client_num_in_total=4", "train_args.client_num_per_round=3"]
    sets += ["server_args.buffer_size=2", f"train_args.party_speed={speed}", "train_args.comm_round=5"]
    cfg = load_config(CONFIGS / "moon.yaml", [*sets, *extra, "train_args.checkpoint_every=1"])
    ref, out = tmp_path / "ref", tmp_path / "stopped"
    assemble(cfg, ref).loop.run()
    first = assemble(cfg, out)
    stop_after(monkeypatch, first.loop, stop_in)
    with pytest.raises(Stop):
        first.loop.run()
    again = assemble(cfg, out, resume=True)
    assert again.loop.start_round == stop_in  # the checkpoint of round stop_in - 1
    again.loop.run()
    a, b = (torch.load(d / "final_model.pt", weights_only=True) for d in (ref, out))
    assert all(torch.equal(a[k], b[k]) for k in a)
    timing = ("round_time_s",)
    records = [
        [
            {k: v for k, v in json.loads(x).items() if k not in timing}
            for x in (d / "metrics.jsonl").read_text().splitlines()
        ]
        for d in (ref, out)
    ]
    assert records[0] == records[1] and len(records[0]) == 5
