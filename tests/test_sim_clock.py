"""The simulated clock's laws and costs (core/sim_clock.py), as FLSim draws a local round's seconds:
the five laws' parameters by their seeded moments, fresh draws per local round keyed by party and
round (the order the server asks in does not matter), the per-example law and the bytes at a
bandwidth by hand, a synchronous round's seconds checked against the run's own parties, and the
MPI simulation on this clock ending with the standalone run's records."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from fedml_moon import conformance
from fedml_moon.adapters.run import assemble
from fedml_moon.config.load import load_config
from fedml_moon.config.schema import ConfigError
from fedml_moon.core.seeds import rng
from fedml_moon.core.sim_clock import Costs, Law, SimClock, party_durations
from tests.support.buffered_runs import (  # noqa: F401 (read_once: a fixture of this module)
    CONFIGS,
    TINY,
    read_once,
    run_records,
    standalone_and_mpi,
)
from tests.support.marks import needs_fmnist


@pytest.mark.parametrize(
    ("law", "mean", "low", "high"),
    [
        (Law("exponential", mean=2.0), 2.0, 0.0, math.inf),
        (Law("uniform", mean=2.0, low=0.5), 2.0, 0.5, 3.5),
        (Law("halfnormal", sigma=1.5, low=0.25), 0.25 + 1.5 * math.sqrt(2 / math.pi), 0.25, math.inf),
        (Law("lognormal", sigma=0.5, mean=3.0), 3.0 * math.exp(0.5**2 / 2), 0.0, math.inf),
        (Law("constant", mean=0.7), 0.7, 0.7, 0.7),
    ],
    ids=["exponential", "uniform", "halfnormal", "lognormal", "constant"],
)
def test_each_law_has_its_parameters(law, mean, low, high):
    """20,000 seeded draws: within [low, high] and their mean within 4 standard errors of the law's
    (exponential: mean; uniform on [0.5, 3.5]: 2; halfnormal: min + sigma sqrt(2 / pi); lognormal of
    median 3: 3 exp(sigma^2 / 2))."""
    draws = law.sample(rng(0, "party_speed"), 20_000)
    assert low <= min(draws) and max(draws) <= high
    error = statistics.pstdev(draws) / math.sqrt(len(draws))
    assert abs(statistics.fmean(draws) - mean) <= 4 * error + 1e-12


def test_the_laws_drawn_once_per_party_are_the_earlier_ones():
    """lognormal exp(sigma z) and halfnormal sigma |z| on the "party_speed" stream, as before the keys
    mean and min (a run's simulated seconds are unchanged)."""
    z = rng(3, "party_speed").standard_normal(4)
    assert party_durations("lognormal", 4, 3, 0.8) == [[math.exp(0.8 * float(v))] for v in z]
    assert party_durations("halfnormal", 4, 3, 0.8) == [[0.8 * abs(float(v))] for v in z]


def test_per_round_draws_are_fresh_and_keyed_by_party_and_round():
    """draw: round: a party's rounds take different seconds, and two clocks asked in other orders give
    each party's k-th round the same seconds."""
    costs = Costs(Law("exponential", mean=1.0), per_round=True, seed=5)
    a, b = SimClock([[1.0]] * 3, costs), SimClock([[1.0]] * 3, costs)
    first = {(p, k): a.duration(p) for k in range(3) for p in range(3)}
    second = {(p, k): b.duration(p) for p in (2, 0, 1) for k in range(3)}
    assert first == second and len(set(first.values())) == 9


def test_per_example_seconds_and_bytes_at_a_bandwidth_by_hand():
    """0.01 s an example x 300 examples = 3 s, plus 1,000,000 bytes at 8 Mbit/s = 1 s: 4 s; a
    synchronous round of parties of 300 and 500 examples waits for the larger: 5 + 1 = 6 s."""
    costs = Costs(Law("constant", mean=0.01), per_example=True, bandwidth_bps=8e6)
    clock = SimClock([[0.01]] * 2, costs)
    assert clock.duration(0, 300, 1_000_000) == pytest.approx(4.0)
    assert clock.sync_round([0, 1], {0: (300, 1_000_000), 1: (500, 1_000_000)}) == pytest.approx(6.0)


@pytest.mark.parametrize(
    ("sets", "key"),
    [
        (["train_args.party_speed=uniform", "train_args.party_speed_min=2"], "train_args.party_speed_min"),
        (
            ["train_args.party_speed=exponential", "train_args.party_speed_mean=0"],
            "train_args.party_speed_mean",
        ),
        (["train_args.party_speed_draw=epoch"], "train_args.party_speed_draw"),
        (["train_args.bandwidth_mbps=-1"], "train_args.bandwidth_mbps"),
    ],
)
def test_bad_clock_settings_name_their_key(sets, key):
    with pytest.raises(ConfigError, match=key):
        load_config(CONFIGS / "fedavg.yaml", sets)


@needs_fmnist
def test_a_synchronous_round_waits_for_its_slowest_party_examples_and_bytes(tmp_path, monkeypatch):
    """constant 0.001 s an example at 100 Mbit/s: round 0's simulated second is the largest, over its
    parties, of 0.001 x the party's examples + 8 x its bytes down and up / 1e8."""
    monkeypatch.setattr("fedml_moon.data.federated.save_partition_heatmap", lambda *a: None)
    sets = [*TINY, "train_args.party_speed=constant", "train_args.party_speed_mean=0.001"]
    sets += ["train_args.party_speed_per_example=true", "train_args.bandwidth_mbps=100"]
    run = assemble(load_config(CONFIGS / "fedavg.yaml", sets), tmp_path)
    run.loop.run()
    first = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    parties = run.loop.server.parties(0)
    per_party = (first["bytes_down"] + first["bytes_up"]) / len(parties)  # FedAvg: the model each way
    want = max(0.001 * run.loop.server.samples[p] + 8 * per_party / 1e8 for p in parties)
    assert first["sim_time_s"] == pytest.approx(want, rel=1e-9)


@pytest.mark.slow
@needs_fmnist
def test_the_mpi_simulation_on_this_clock_is_the_standalone_run(tmp_path):
    """Buffered, fresh halfnormal draws per round and per example, with bytes at 50 Mbit/s: the MPI
    simulation's server (which knows the parties' examples from their claims) schedules every update
    at the standalone run's simulated second and ends with its model."""
    sets = [*conformance.TINY, "server_args.aggregation=buffered", "server_args.buffer_size=2"]
    sets += [
        "train_args.client_num_in_total=4",
        "train_args.client_num_per_round=3",
        "train_args.comm_round=4",
    ]
    sets += [
        "train_args.party_speed=halfnormal",
        "train_args.party_speed_draw=round",
        "train_args.bandwidth_mbps=50",
    ]
    sets += ["train_args.party_speed_per_example=true", "train_args.party_speed_sigma=0.01"]
    sets += ["validation_args.local_test=false"]
    config = CONFIGS / "fedavg.yaml"
    want, got = standalone_and_mpi(config, sets, tmp_path)
    assert [(r["updates"], r["sim_time_s"]) for r in got] == [(r["updates"], r["sim_time_s"]) for r in want]
    assert any(r["staleness_max"] > 0 for r in got)


@needs_fmnist
@pytest.mark.parametrize(
    ("shape", "want"),
    [
        (["train_args.comm_round=2"], [1.5, 3.0]),
        (
            ["server_args.aggregation=buffered", "server_args.buffer_size=3", "train_args.comm_round=2"],
            [1.5, 3.0],
        ),
    ],
    ids=["sync", "buffered"],
)
def test_a_secure_sums_session_is_charged_after_each_upload(shape, want, tmp_path, monkeypatch):
    """Secure aggregation, 1 s a round and a 0.5 s session: a synchronous round of 3 parties ends at
    1.5 s, the next at 3; 3 parties buffered by 3 (all training at once) fill each buffer at 1 + 0.5."""
    monkeypatch.setattr("fedml_moon.data.federated.save_partition_heatmap", lambda *a: None)
    sets = [*TINY, "privacy_args.secure_aggregation=true", "train_args.party_speed=constant"]
    sets += ["train_args.client_num_in_total=3", "train_args.client_num_per_round=3"]
    sets += ["train_args.secure_session_s=0.5", *shape]
    assemble(load_config(CONFIGS / "fedavg.yaml", sets), tmp_path).loop.run()
    records = run_records(tmp_path)
    assert [r["sim_time_s"] for r in records] == want
    with pytest.raises(ConfigError, match="train_args.secure_session_s"):
        load_config(CONFIGS / "fedavg.yaml", ["train_args.secure_session_s=1"])
