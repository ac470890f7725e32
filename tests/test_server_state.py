"""What each of a site's messages changes in the server's record of its rank, as
`distributed/server/state.py` states it, and what none of them resets (the rounds it took part in,
its messages refused, when it was last heard). The server manager runs in this process on a tiny
real run (tests/support/server.py) and the test plays the silos."""

from __future__ import annotations

import time

from fedml_moon.distributed import managers as m
from fedml_moon.run_folder import RunFolder, read_json
from tests.support.buffered_silos import BUFFERED_FEDAVGM, Silos, finish
from tests.support.marks import needs_fmnist
from tests.support.server import answer_train, receive, server_manager

pytestmark = needs_fmnist
WELCOME_GAP_S = 1.05  # past the one WELCOME a second a rank gets (server/ready.py)


def _hello(manager, rank: int, process: str) -> None:
    hello = {"config": manager.settings.config, "explicit": [], "fresh_parties": [], "parties": [rank - 1]}
    receive(manager, rank, m.HELLO, process=process, **hello)


def _never_reset(site) -> tuple:
    return site.took_part, site.refused, site.heard_at


def test_refuse_bye_and_error_in_the_run_make_a_rank_gone_and_hello_brings_it_back(tmp_path):
    manager, wire = server_manager(tmp_path, "train_args.checkpoint_every=1")
    sites = manager.state.sites
    assert all(s.seen and s.ready and not s.gone for s in sites.values())
    answer_train(manager, wire, 1)  # rank 1's results are taken; ranks 2 and 3 owe theirs
    receive(manager, 1, m.RESULT, round=0, results=[])  # late: the server waits for nothing more from it
    one = sites[1]
    assert one.refused == 1 and one.heard_at is not None
    kept = _never_reset(one)
    receive(manager, 1, m.REFUSE, kind="changed", key="data_args.data_cache_dir")
    assert one.gone and one.resent == set() and one.seen and one.welcomed_at is not None
    assert _never_reset(one)[:2] == kept[:2] and one.heard_at >= kept[2]
    _hello(manager, 1, "p1-again")  # within a second of its WELCOME: back, not welcomed again
    assert not one.gone and one.process == "p1"
    time.sleep(WELCOME_GAP_S)
    _hello(manager, 1, "p1-again")
    assert not one.gone and one.process == "p1-again" and _never_reset(one)[:2] == kept[:2]
    receive(manager, 2, m.ERROR, reason="its disk is full")
    receive(manager, 3, m.BYE)
    assert sites[2].gone and sites[3].gone and not one.gone
    assert sites[2].refused == sites[3].refused == 0  # a BYE or an ERROR is the silo's to send


def test_a_refuse_before_the_run_makes_a_rank_as_if_it_never_said_hello(tmp_path):
    manager, _ = server_manager(tmp_path, ready=False)
    site = manager.state.sites[2]
    assert site.seen and not site.ready and manager.state.round.phase == "hello"
    welcomed = site.welcomed_at
    receive(manager, 2, m.REFUSE, kind="changed", key="data_args.data_cache_dir")
    assert not site.seen and not site.ready and site.process is None and site.welcomed_at == welcomed
    assert site.data_refused is not None and not site.gone
    _hello(manager, 2, "p2-again")  # within a second of its WELCOME: not welcomed again yet
    assert not site.seen and site.welcomed_at == welcomed
    time.sleep(WELCOME_GAP_S)
    _hello(manager, 2, "p2-again")
    assert site.seen and site.process == "p2-again" and site.data_refused is not None
    receive(manager, 2, m.READY, claims=[{"party": 1, "claim": manager.rounds.claims[1]}])
    assert site.ready and site.data_refused is None


def test_took_part_counts_the_train_phases_whose_answers_were_taken_and_nothing_resets_it(tmp_path):
    manager, wire = server_manager(tmp_path, "train_args.checkpoint_every=1")
    for rank in (1, 2, 3):
        answer_train(manager, wire, rank)
    sites = manager.state.sites
    assert manager.state.round.phase == "checkpoint" and [s.took_part for s in sites.values()] == [1, 1, 1]
    receive(manager, 2, m.REFUSE, kind="changed", key="data_args.data_cache_dir")
    time.sleep(WELCOME_GAP_S)
    _hello(manager, 2, "p2-again")
    assert sites[2].took_part == 1


def test_the_rounds_a_site_took_part_in_are_rounds_whatever_the_checkpoints(tmp_path):
    """Six rounds with a checkpoint every third: each site took part in six (it used to count the
    train phases left for a checkpoint: two)."""
    manager, wire = server_manager(tmp_path, "train_args.comm_round=6", "train_args.checkpoint_every=3")
    silos = Silos(manager, wire)
    finish(manager, silos)
    assert [s.took_part for s in manager.state.sites.values()] == [6, 6, 6]
    published = read_json(RunFolder(tmp_path).status)["sites"]
    assert [s["rounds"] for s in published] == [6, 6, 6]


def test_in_a_buffered_run_a_site_took_part_in_the_buffers_that_held_its_updates(tmp_path):
    manager, wire = server_manager(tmp_path, *BUFFERED_FEDAVGM)
    finish(manager, Silos(manager, wire))
    held = {rank: 0 for rank in (1, 2, 3)}
    for record in manager.rounds.recorder.records:
        for rank in {party + 1 for party, _ in record["updates"]}:
            held[rank] += 1
    assert [s.took_part for s in manager.state.sites.values()] == [held[1], held[2], held[3]]
    assert sum(held.values()) >= len(manager.rounds.recorder.records) == 6
