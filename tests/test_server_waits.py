"""Every wait of the server ends: a silo that says BYE or ERROR in the middle of a round counts as
missing (the quorum decides), and a phase left with nothing to wait for moves on at the next tick.

The server manager runs in this process on a tiny real run (data, model, ServerRounds); its transport
keeps in memory what the server sends (tests/support/server.py), and the test plays the three silos'
messages."""

from __future__ import annotations

import time

import pytest

from fedml_moon.distributed import managers as m
from fedml_moon.distributed.transport.budget import SMALL_FRAME_BYTES, SPARE_FRAMES
from tests.support.marks import needs_fmnist
from tests.support.server import answer_train, receive, restart, result_item, server_manager

pytestmark = needs_fmnist


LEAVING = {
    m.BYE: {},
    m.ERROR: {"reason": "its disk is full"},
    m.REFUSE: {"kind": "changed", "key": "data_args.data_cache_dir"},  # a site restarted on other data
}


@pytest.mark.parametrize("leaving", sorted(LEAVING))
def test_a_silo_leaving_mid_round_counts_as_missing_and_the_run_completes(tmp_path, leaving):
    manager, wire = server_manager(tmp_path)
    assert manager.state.round.phase == "train" and manager.state.round.round_idx == 0
    answer_train(manager, wire, 1)
    answer_train(manager, wire, 2)
    receive(manager, 3, leaving, **LEAVING[leaving])
    assert manager.state.round.phase == "train"  # nothing moves inside the handler ...
    receive(manager, 0, m.TICK)  # ... the next tick ends the wait: 2 of 3 parties meet the quorum (half)
    records = manager.rounds.recorder.records
    assert records[0]["missing_parties"] == [2] and records[0]["parties"] == 2
    for _ in range(3):  # round 1 without rank 3, then the checkpoint, then FINISH
        if manager.state.round.phase == "train":
            answer_train(manager, wire, 1)
            answer_train(manager, wire, 2)
        for rank in (1, 2):
            receive(manager, rank, m.CHECKPOINTED, round=manager.state.round.round_idx)
        receive(manager, 0, m.TICK)
    for rank in (1, 2):
        receive(manager, rank, m.BYE)
    receive(manager, 0, m.TICK)
    assert manager.status == "completed" and manager.state.round.phase == "done"
    assert len(records) == 2 and records[1]["missing_parties"] == [2]


def test_below_the_quorum_a_silo_that_left_ends_the_run_at_the_deadline(tmp_path):
    manager, wire = server_manager(tmp_path, "comm_args.min_reports=all", "comm_args.round_timeout_s=0.01")
    answer_train(manager, wire, 1)
    answer_train(manager, wire, 2)
    receive(manager, 3, m.BYE)
    time.sleep(0.05)  # past the deadline
    receive(manager, 0, m.TICK)
    assert manager.status == "failed" and manager.state.round.phase == "done"
    aborts = [x for x in wire.sent if x.get_type() == m.ABORT]
    assert {x.get_receiver_id() for x in aborts} == {1, 2, 3}
    assert "fewer than the 3 required" in aborts[0].get("reason")


def test_an_evaluation_phase_with_no_silo_alive_moves_on(tmp_path):
    manager, wire = server_manager(tmp_path, "validation_args.local_test=true", "comm_args.min_reports=1")
    answer_train(manager, wire, 1)
    for rank in (2, 3):
        receive(manager, rank, m.ERROR, reason="gone")
    receive(manager, 0, m.TICK)  # the round goes on with party 0 only; its evaluation waits for 1, 2, 3
    assert manager.state.round.phase == "eval"
    receive(manager, 1, m.BYE)
    receive(manager, 0, m.TICK)  # nobody left to report: the round is recorded without local test
    assert manager.rounds.recorder.records[0]["round"] == 0
    assert manager.state.round.phase in ("checkpoint", "train")


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("results", None, "refused a result message from rank 1: field results is a NoneType, not a list"),
        ("party", 1, "refused rank 1's result: results are for parties [1], not its parties [0]"),
        ("n", float("nan"), "field results[0].n is a float, not an integer"),
        ("n", -299, "field results[0].n is -299, not in [1, "),
        ("n", 10**30, "field results[0].n is 1000000000000000000000000000000, not in [1, "),
        ("n", 7, "refused rank 1's result: results[0].n 7 is not party 0's "),
        ("upload", {"model": {}}, "results[0].upload lacks ['party_id']"),
    ],
)
def test_a_result_for_another_silos_party_or_with_a_bad_field_is_refused_and_changes_nothing(
    tmp_path, caplog, field, value, named
):
    """Silo 1 may upload only for party 0, with the party's own sample count and an upload of the
    full model; anything else is refused whole with the field named, as if it never came: the round
    still waits for silo 1, and its valid result then completes the round with all three parties."""
    manager, wire = server_manager(tmp_path)
    task = next(t for t in wire.sent if t.get_type() == m.TRAIN and t.get_receiver_id() == 1)
    item = result_item(manager, 0, task.get("tasks")[0]["payload"]["model"])
    if field == "results":
        receive(manager, 1, m.RESULT, round=0, results=value)
    else:
        receive(manager, 1, m.RESULT, round=0, results=[{**item, field: value}])
    assert named in caplog.text
    answer_train(manager, wire, 2)
    answer_train(manager, wire, 3)
    receive(manager, 0, m.TICK)
    assert (
        manager.state.round.phase == "train"
        and manager.state.round.pending == {1}
        and not manager.rounds.recorder.records
    )
    answer_train(manager, wire, 1)
    record = manager.rounds.recorder.records[0]
    assert "missing_parties" not in record and record["parties"] == 3


def test_each_phase_lets_the_ranks_it_waits_for_send_one_large_frame_and_the_spare(tmp_path):
    """The server tells its transport at each phase which ranks owe it a message: each of those may
    send one frame over SMALL_FRAME_BYTES and SPARE_FRAMES more until the next phase, a rank it
    waits for nothing from the spare only, a rank whose work goes out again as much again
    (transport/budget.py refuses the rest undecoded)."""
    manager, wire = server_manager(tmp_path, "validation_args.local_test=true", "comm_args.min_reports=1")

    def allowance(rank: int) -> int:
        n = 0
        while n < 100 and wire.budget.take(rank, SMALL_FRAME_BYTES + 1):
            n += 1
        return n

    assert manager.state.round.phase == "train" and manager.state.round.round_idx == 0
    assert [allowance(r) for r in (1, 2, 3)] == [1 + SPARE_FRAMES] * 3
    answer_train(manager, wire, 1)
    assert allowance(1) == 0  # still the same phase: nothing more
    receive(manager, 2, m.BYE)
    receive(manager, 3, m.ERROR, reason="gone")
    receive(manager, 0, m.TICK)  # round 0 goes on without them; its evaluation waits for rank 1 only
    assert manager.state.round.phase == "eval" and manager.state.round.pending == {1}
    assert [allowance(r) for r in (1, 2, 3)] == [1 + SPARE_FRAMES, SPARE_FRAMES, SPARE_FRAMES]
    manager.state.sites[
        1
    ].welcomed_at = None  # rank 1 restarted: its work goes out again, and its allowance with it
    restart(manager, 1, "p1-again", [0])
    assert allowance(1) == 1 + SPARE_FRAMES and allowance(2) == 0
