"""Who can take work on the simulated clock (core/presence.py): an availability trace (a party works
only while online; a round it cannot finish online is lost, named in the record) and parties arriving
as a Poisson process (one slot per arrival). By hand in whole standalone runs, and the MPI
simulation on both ending with the standalone run's records."""

from __future__ import annotations

import math

import pytest

from fedml_moon import conformance
from fedml_moon.config.load import load_config
from fedml_moon.config.schema import ConfigError
from fedml_moon.core.presence import Arrivals, Presence, read_windows
from fedml_moon.core.sim_clock import WAKE, SimClock
from tests.support.buffered_runs import (
    BUFFERED,
    CONFIGS,
    read_once,  # noqa: F401 (a fixture of this module)
    run_standalone,
    standalone_and_mpi,
)
from tests.support.marks import needs_fmnist

TRACE = "# party,start,end\nparty,start,end\n0,0,2.5\n1,0,inf\n2,1.5,inf\n"


def test_a_trace_is_read_merged_and_checked(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("party,start,end\n0,5,8\n0,0,2\n0,1.5,3\n1,0,inf\n")
    presence = Presence(read_windows(trace, 2))
    assert presence.windows == [[(0.0, 3.0), (5.0, 8.0)], [(0.0, math.inf)]]
    assert (presence.leaves(0, 2.9), presence.leaves(0, 3.0), presence.opens(0, 3.0)) == (3.0, None, 5.0)
    assert presence.opens(0, 5.0) is None and presence.leaves(1, 1e9) == math.inf
    trace.write_text("0,0,1\n")
    with pytest.raises(ValueError, match=r"no window for parties \[1\]"):
        read_windows(trace, 2)
    trace.write_text("0,2,1\n1,0,1\n")
    with pytest.raises(ValueError, match="line 1: party in"):
        read_windows(trace, 2)


def test_a_round_past_its_partys_window_ends_then_lost_and_a_wake_waits_for_the_next():
    clock = SimClock([[1.0]] * 2, presence=Presence([[(0.0, 0.5)], [(2.0, 3.0)]]))
    assert clock.start(0) == 0.5 and clock.lost == {0}
    assert not clock.online(1)
    clock.wake_for([1])
    clock.wake_for([1])  # one is enough
    assert sorted(clock.events) == [(0.5, 0), (2.0, WAKE)]


def test_arrivals_are_a_seeded_poisson_process():
    """20,000 gaps of rate 4: their mean within 4 standard errors of 1/4; the same seed, the same times."""
    arrivals, now, gaps = Arrivals(4.0, 7), 0.0, []
    for _ in range(20_000):
        after = arrivals.next_after(now)
        gaps.append(after - now)
        now = after
    assert abs(sum(gaps) / len(gaps) - 0.25) <= 4 * 0.25 / math.sqrt(len(gaps))
    again = Arrivals(4.0, 7)
    assert [again.next_after(0.0) for _ in range(3)] == pytest.approx(gaps[:3], rel=1e-12)


@needs_fmnist
def test_a_trace_gives_work_only_online_and_loses_a_round_cut_off(tmp_path, monkeypatch):
    """3 parties all at once, K = 1, 1 s a round; party 0 online [0, 2.5), 1 always, 2 from 1.5.
    t=0: 0 and 1 start (2 is offline: a wake at 1.5); t=1: rounds 0, 1, then 0 and 1 again; t=1.5: 2
    starts; t=2: rounds 2, 3; 0 starts from version 4 but goes offline at 2.5, 1 starts; t=2.5: 0's
    round is lost ("went offline") and 2's (from version 2) is round 4; t=3: 1's is round 5."""
    trace = tmp_path / "trace.csv"
    trace.write_text(TRACE)
    sets = [*BUFFERED, "train_args.client_num_in_total=3", "train_args.client_num_per_round=3"]
    sets += ["server_args.buffer_size=1", "train_args.comm_round=6", f"train_args.availability_file={trace}"]
    _, records = run_standalone(tmp_path / "run", "fedavg", sets, monkeypatch)
    assert [r["sim_time_s"] for r in records] == [1.0, 1.0, 2.0, 2.0, 2.5, 3.0]
    assert [r["updates"] for r in records] == [[[0, 0]], [[1, 0]], [[0, 2]], [[1, 2]], [[2, 2]], [[1, 4]]]
    assert records[4]["left_out"] == [[0, 4, "went offline", 0]]
    assert all(not r["left_out"] for i, r in enumerate(records) if i != 4)


def _by_hand(rate: float, seed: int, concurrency: int, rounds: int) -> list[float]:
    """The seconds at which K = 1 buffers apply when parties of 1 s start only at arrivals (a slot
    free at an arrival takes a party; otherwise that arrival is lost)."""
    arrivals, now, ends, applied = Arrivals(rate, seed), 0.0, [], []
    arrival = arrivals.next_after(0.0)
    while len(applied) < rounds:
        if ends and min(ends) <= arrival:
            now = min(ends)
            applied += [now] * ends.count(now)
            ends = [e for e in ends if e != now]
        else:
            now = arrival
            if len(ends) < concurrency:
                ends.append(now + 1.0)
            arrival = arrivals.next_after(now)
    return applied[:rounds]


@needs_fmnist
def test_parties_start_at_poisson_arrivals(tmp_path, monkeypatch):
    """Rate 1.5 a second, at most 2 training at once, K = 1, 1 s a round: each buffer's second is
    an arrival's + 1, as the arrival process by hand gives it."""
    sets = [*BUFFERED, "train_args.client_num_in_total=4", "train_args.client_num_per_round=2"]
    sets += ["server_args.buffer_size=1", "train_args.comm_round=5", "server_args.arrival_rate=1.5"]
    _, records = run_standalone(tmp_path / "run", "fedavg", sets, monkeypatch)
    assert [r["sim_time_s"] for r in records] == pytest.approx(_by_hand(1.5, 0, 2, 5), abs=1e-12)


@pytest.mark.parametrize(
    ("sets", "key"),
    [
        (["server_args.arrival_rate=1"], "server_args.arrival_rate"),
        ([*BUFFERED, "server_args.arrival_rate=0"], "server_args.arrival_rate"),
        ([*BUFFERED, "train_args.availability_file=nowhere.csv"], "train_args.availability_file"),
        (["train_args.availability_file=TRACE"], "train_args.availability_file"),  # a synchronous run
    ],
)
def test_bad_presence_settings_name_their_key(sets, key, tmp_path):
    """Refused, naming the key: a rate of 0, a trace that is no file, and either on a synchronous run
    (a round trains the parties its schedule samples: the clock gives work in buffered runs only)."""
    trace = tmp_path / "trace.csv"
    trace.write_text(TRACE)
    with pytest.raises(ConfigError, match=key):
        load_config(CONFIGS / "fedavg.yaml", [s.replace("TRACE", str(trace)) for s in sets])


@pytest.mark.slow
@needs_fmnist
def test_the_mpi_simulation_with_a_trace_and_arrivals_is_the_standalone_run(tmp_path):
    """The trace above (party 0 online until 2.2) and arrivals at rate 3 a second, 3 parties, K = 1:
    the MPI simulation's server takes the clock's own events (arrivals, wakes) without waiting for
    any worker and ends with the standalone run's records (their updates, seconds and the round
    lost) and model."""
    trace = tmp_path / "trace.csv"
    trace.write_text(TRACE.replace("0,0,2.5", "0,0,2.2"))  # party 0's second round is cut off
    sets = [
        *conformance.TINY,
        *BUFFERED,
        "train_args.client_num_in_total=3",
        "train_args.client_num_per_round=3",
    ]
    sets += ["server_args.buffer_size=1", "train_args.comm_round=6", f"train_args.availability_file={trace}"]
    sets += ["server_args.arrival_rate=3", "validation_args.local_test=false"]
    config = CONFIGS / "fedavg.yaml"
    want, got = standalone_and_mpi(config, sets, tmp_path)
    fields = ("updates", "sim_time_s", "left_out")
    assert [[r[k] for k in fields] for r in got] == [[r[k] for k in fields] for r in want]
    assert any(why == "went offline" for r in want for _, _, why, _ in r["left_out"])
