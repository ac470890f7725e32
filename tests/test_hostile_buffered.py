"""The attacker's side of the buffered server (distributed/server/buffered.py), as a differential
property: a silo with valid credentials sends, before each of its honest results, well-formed
messages with hostile values (tests/support/hostile.py: another silo's party, a version it has no task of,
repeated, extreme, of the wrong phase, CHECKPOINTED for any round, HELLOs of new processes), and
its honest result again after it. The run ends with bitwise the final model, the server algorithm's
state and the records of the same run without those messages.

The server manager runs in this process on a tiny real run (FedAvgM, K = 2 of 3 silos training at
once); the silos upload the model they were sent, moved by 0.01 x their rank, answering their
outstanding tasks in a fixed order. Every other round and the last are evaluation rounds (the
parties' local tests, distributed/server/buffered_eval.py): the silos answer their tasks sent before the
EVAL first (the server holds those updates until the round's record), the hostile messages before
each, then their reports; a silo's own report for the round is its to send, so none is among the
hostile messages of an evaluation round."""

from __future__ import annotations

import random
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedml_moon.distributed import managers as m
from tests.support.hostile import Target, hostile_messages
from tests.support.marks import needs_fmnist
from tests.support.server import TIMING, receive, restart, same_tree, server_manager

pytestmark = needs_fmnist

SETTINGS = [
    "server_args.aggregation=buffered",
    "server_args.buffer_size=2",
    "train_args.comm_round=4",
    "train_args.checkpoint_every=1",  # a checkpoint waits for its silos' CHECKPOINTED after each round
    "server_args.server_momentum=0.9",
    "server_args.server_momentum_style=fedavgm",
    "validation_args.local_test=true",
    "validation_args.frequency_of_the_test=2",
]
_REFERENCE: dict = {}


def _buffered_server(tmp_path, *extra: str):
    """`server_manager`'s tiny cross-silo run (3 silos of one party), its manager buffered."""
    return server_manager(tmp_path, *SETTINGS, *extra)


def _task(wire, rank: int, version: int) -> dict:
    return next(
        t
        for t in reversed(wire.sent)
        if t.get_type() == m.TRAIN and t.get_receiver_id() == rank and t.get("round") == version
    )


def _report(manager, rank: int) -> None:
    """A silo's honest report on the evaluation round."""
    acc = 0.1 * rank + 0.01 * manager.state.round.round_idx
    receive(
        manager,
        rank,
        m.REPORT,
        round=manager.state.round.round_idx,
        reports=[{"party_id": rank - 1, "local_test_acc": acc}],
    )


def _run(tmp_path, plan: random.Random | None, per_task: int = 0) -> tuple[dict, list, dict]:
    manager, wire = _buffered_server(tmp_path)
    while manager.state.round.phase in ("buffered", "eval"):
        busy = sorted(r for r, tasks in manager.state.buffer.tasks.items() if tasks)
        if manager.state.round.phase == "eval" and not busy:
            _report(manager, min(manager.state.round.pending))
            continue
        rank = (
            min(manager.state.round.pending) if manager.state.round.phase == "buffered" else busy[0]
        )  # the lowest rank, oldest task
        version = min(manager.state.buffer.tasks[rank].values())
        task = _task(wire, rank, version)
        party, model = task.get("tasks")[0]["party"], task.get("tasks")[0]["payload"]["model"]
        if plan is not None:
            other = next(p for p, r in manager.settings.placement.items() if r != rank)
            samples = manager.rounds.samples[party]
            target = Target(
                version, rank, party, other, model, samples, manager.rounds.terms, manager.settings.config
            )
            for kind, fields in hostile_messages(plan, target, per_task):
                if (
                    manager.state.round.phase == "eval"
                    and kind == m.REPORT
                    and fields.get("round") == manager.state.round.round_idx
                ):
                    continue  # its own report for the round: the silo's to send
                receive(manager, rank, kind, **fields)
        moved = {k: v + 0.01 * rank if v.is_floating_point() else v for k, v in model.items()}
        item = {
            "party": party,
            "n": manager.rounds.samples[party],
            "upload": {"model": moved, "party_id": party},
        }
        receive(manager, rank, m.RESULT, round=version, results=[item])
        if plan is not None and plan.random() < 0.5:  # the same result again: its task is done
            receive(manager, rank, m.RESULT, round=version, results=[item])
    for rank in sorted(manager.state.round.pending):
        receive(manager, rank, m.BYE)
    assert manager.status == "completed", manager.status
    records = [{k: v for k, v in r.items() if k not in TIMING} for r in manager.rounds.recorder.records]
    return dict(manager.rounds.aggregator.global_state), records, manager.rounds.aggregator.algorithm.state()


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), per_task=st.integers(1, 8))
def test_hostile_messages_leave_a_buffered_run_as_it_is_without_them(tmp_path_factory, seed, per_task):
    if "run" not in _REFERENCE:
        _REFERENCE["run"] = _run(tmp_path_factory.mktemp("reference"), None)
    model, records, state = _REFERENCE["run"]
    assert len(records) == 4 and all(len(r["updates"]) == 2 for r in records)
    assert [("local_test_acc" in r) for r in records] == [True, False, True, True]
    got = _run(tmp_path_factory.mktemp("attacked"), random.Random(seed), per_task)
    assert same_tree(got[0], model) and got[1] == records and same_tree(got[2], state)


def _trains(wire, rank: int) -> list:
    return [t for t in wire.sent if t.get_type() == m.TRAIN and t.get_receiver_id() == rank]


def test_a_restarted_silo_gets_its_tasks_again_once_and_a_silo_gone_then_back_takes_work(tmp_path):
    """Rank 1 restarts (a HELLO from a new process) while its task of version 0 is outstanding: the
    task goes out again, once whatever more HELLOs say. Rank 2 says BYE with its task outstanding:
    at the next tick its task is dropped and no task goes to it; once it says HELLO again, its party
    takes work again, and the run completes (no evaluation round here: the server tests)."""
    manager, wire = _buffered_server(tmp_path, "validation_args.local_test=false")
    hello = {"config": manager.settings.config, "explicit": [], "fresh_parties": []}
    assert len(_trains(wire, 1)) == 1 and manager.state.buffer.tasks[1] == {0: 0}
    for i in range(2):
        time.sleep(1.1)  # a silo is welcomed at most once a second (server_manager.WELCOME_EVERY_S)
        restart(manager, 1, f"restarted-{i}", [0])
    assert [t.get("round") for t in _trains(wire, 1)] == [0, 0]
    receive(manager, 2, m.BYE)
    receive(manager, 0, m.TICK)
    assert 2 not in manager.state.buffer.tasks and 1 not in manager.flow.core.inflight
    sent_to_2 = len(_trains(wire, 2))
    time.sleep(1.1)
    receive(manager, 2, m.HELLO, parties=[1], process="back", **hello)
    while manager.state.round.phase == "buffered":
        rank = min(manager.state.round.pending)
        version = min(manager.state.buffer.tasks[rank].values())
        task = _task(wire, rank, version).get("tasks")[0]
        item = {"party": task["party"], "n": manager.rounds.samples[task["party"]]}
        item["upload"] = {"model": task["payload"]["model"], "party_id": task["party"]}
        receive(manager, rank, m.RESULT, round=version, results=[item])
    assert len(_trains(wire, 2)) > sent_to_2  # back: its party took work again
    assert manager.state.round.phase == "finish"
