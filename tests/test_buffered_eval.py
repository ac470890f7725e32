"""The parties' own evaluation in a distributed buffered run (distributed/server/buffered_eval.py), on the
in-process server of tests/test_buffered_resume.py (3 silos of one party, K = 2, all training at
once, the parties' local tests every other round and on the last): a buffer applied on an
evaluation round is recorded with its parties' reports before any update goes into the next
buffer, and no task is sent before it (LG-FedAvg's best warm-up model is chosen at the record);
the updates that arrive meanwhile are held, then taken; a silo restarted meanwhile gets its tasks,
then its EVAL, again; one that says BYE with tasks outstanding, having reported, is gone."""

from __future__ import annotations

import time

import pytest

from fedml_moon.distributed import managers as m
from tests.support.buffered_silos import EVALUATED, Silos
from tests.support.marks import needs_fmnist
from tests.support.server import receive, restart, server_manager

pytestmark = needs_fmnist


def _to_first_eval(tmp_path):
    """The run, its silos answering their TRAINs in turn, until the server is in an eval phase."""
    manager, wire = server_manager(tmp_path, *EVALUATED)
    silos = Silos(manager, wire)
    while manager.state.round.phase != "eval":
        silos.collect()
        rank = next(r for r, q in sorted(silos.queues.items()) if q and q[0].get_type() == m.TRAIN)
        silos.answer(rank, silos.queues[rank].pop(0))
    return manager, wire, silos


def test_an_evaluation_round_holds_the_updates_until_its_record(tmp_path):
    manager, wire, silos = _to_first_eval(tmp_path)
    round_idx, version, records = (
        manager.state.round.round_idx,
        manager.flow.core.version,
        manager.rounds.recorder.records,
    )
    assert round_idx == version - 1 == 0 and records == []
    silos.collect()
    order = [(q.get_receiver_id(), q.get_type()) for q in wire.sent if q.get_type() in (m.TRAIN, m.EVAL)]
    first_eval = order.index(next(o for o in order if o[1] == m.EVAL))
    assert all(kind == m.EVAL for _, kind in order[first_eval:])  # no task before the record
    for rank, queue in sorted(silos.queues.items()):  # every task sent before its EVAL, answered
        while queue and queue[0].get_type() == m.TRAIN:
            silos.answer(rank, queue.pop(0))
    assert manager.state.round.phase == "eval" and manager.flow.core.version == version and records == []
    assert manager.flow.core.arrived and len(manager.flow.core.buffer) == 0
    held, seen = set(manager.flow.core.arrived), len(wire.sent)
    for rank, queue in sorted(silos.queues.items()):
        evals = [q for q in queue if q.get_type() == m.EVAL]
        assert len(evals) == 1 and evals[0].get("round") == 0
        queue.remove(evals[0])
        silos.answer(rank, evals[0])
    assert records[0]["round"] == 0 and records[0]["local_test_acc"] == pytest.approx(0.2)  # (0.1+0.2+0.3)/3
    assert manager.state.round.phase == "buffered" and not manager.flow.core.arrived  # the held updates taken
    assert any(q.get_type() == m.TRAIN for q in wire.sent[seen:])  # the freed slots filled after the record
    taken = [p for r in records[1:] for p, _ in r["updates"]] + [p for p, _ in manager.flow.core.updates]
    assert held <= set(taken)


def test_a_silo_restarted_in_an_evaluation_round_gets_its_tasks_then_its_eval_again(tmp_path):
    manager, wire, silos = _to_first_eval(tmp_path)
    rank = next(r for r, tasks in sorted(manager.state.buffer.tasks.items()) if tasks)
    outstanding = set(manager.state.buffer.tasks[rank].values())
    seen = len(wire.sent)
    time.sleep(1.1)  # a silo is welcomed at most once a second (server_manager.WELCOME_EVERY_S)
    restart(manager, rank, "restarted", [rank - 1])
    again = [(q.get_type(), q.get("round")) for q in wire.sent[seen:] if q.get_receiver_id() == rank]
    trains = [v for kind, v in again if kind == m.TRAIN]
    assert set(trains) == outstanding and len(trains) == len(outstanding)
    assert [kind for kind, _ in again if kind in (m.TRAIN, m.EVAL)][-1] == m.EVAL
    assert manager.state.round.phase == "eval" and rank in manager.state.round.pending


def test_a_silo_that_reported_and_says_bye_with_tasks_outstanding_is_gone(tmp_path):
    manager, wire, silos = _to_first_eval(tmp_path)
    rank = next(r for r, tasks in sorted(manager.state.buffer.tasks.items()) if tasks)
    silos.collect()
    eval_msg = next(q for q in silos.queues[rank] if q.get_type() == m.EVAL)
    silos.queues[rank].remove(eval_msg)
    silos.answer(rank, eval_msg)
    assert manager.state.round.phase == "eval" and rank not in manager.state.round.pending
    receive(manager, rank, m.BYE)
    assert manager.state.sites[rank].gone
    for other, queue in sorted(silos.queues.items()):
        for msg in [q for q in queue if q.get_type() == m.EVAL]:
            queue.remove(msg)
            silos.answer(other, msg)
    receive(manager, 0, m.TICK)  # back in the buffered phase: its tasks dropped, its slots for others
    assert manager.state.round.phase == "buffered" and rank not in manager.state.buffer.tasks
    assert all(q.get_receiver_id() != rank for q in wire.sent[-3:] if q.get_type() == m.TRAIN)


def test_with_every_silo_gone_in_an_evaluation_round_one_back_takes_the_free_slots(tmp_path):
    """Every silo answers its tasks, then says BYE in an evaluation round: the round is recorded
    without their reports, the held updates are taken, and nothing is in flight or awaited; a silo
    back (HELLO) gets work at the next tick (the run waits `comm_args.round_timeout_s` for one)."""
    manager, wire, silos = _to_first_eval(tmp_path)
    for rank, queue in sorted(silos.queues.items()):  # their tasks answered first: none outstanding
        while queue and queue[0].get_type() == m.TRAIN:
            silos.answer(rank, queue.pop(0))
    assert not any(manager.state.buffer.tasks.values()) and manager.flow.core.arrived
    for rank in (1, 2, 3):
        receive(manager, rank, m.BYE)
    receive(manager, 0, m.TICK)
    receive(manager, 0, m.TICK)
    assert (
        manager.state.round.phase == "buffered"
        and not manager.flow.core.inflight
        and manager.rounds.recorder.records
    )
    time.sleep(1.1)  # a silo is welcomed at most once a second (server_manager.WELCOME_EVERY_S)
    hello = {"config": manager.settings.config, "explicit": [], "fresh_parties": [], "parties": [0]}
    receive(manager, 1, m.HELLO, process="back", **hello)
    seen = len(wire.sent)
    receive(manager, 0, m.TICK)
    assert [q.get_receiver_id() for q in wire.sent[seen:] if q.get_type() == m.TRAIN] == [1]
    assert manager.state.round.phase == "buffered" and set(manager.flow.core.inflight) == {0}
