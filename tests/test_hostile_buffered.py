"""The attacker's side of the buffered server (distributed/server_buffered.py), as a differential
property: a silo with valid credentials sends, before each of its honest results, well-formed
messages with hostile values (tests/hostile.py: another silo's party, a version it has no task of,
repeated, extreme, of the wrong phase, HELLOs of new processes), and its honest result again after
it. The run ends with bitwise the final model, the server algorithm's state and the records of the
same run without those messages.

The server manager runs in this process on a tiny real run (FedAvgM, K = 2 of 3 silos training at
once); the silos upload the model they were sent, moved by 0.01 x their rank, answering their
outstanding tasks in a fixed order."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedml_moon.distributed import managers as m
from tests.hostile import Target, hostile_messages
from tests.test_hostile_rounds import TIMING, _same
from tests.test_server_waits import CONFIG, _from, _server, pytestmark  # noqa: F401 (data)

SETTINGS = [
    "server_args.aggregation=buffered",
    "server_args.buffer_size=2",
    "train_args.comm_round=4",
    "server_args.server_momentum=0.9",
    "server_args.server_momentum_style=fedavgm",
]
_REFERENCE: dict = {}


def _buffered_server(tmp_path):
    """`_server`'s tiny cross-silo run (3 silos of one party), its manager buffered."""
    return _server(tmp_path, *SETTINGS)


def _task(wire, rank: int, version: int) -> dict:
    return next(
        t
        for t in reversed(wire.sent)
        if t.get_type() == m.TRAIN and t.get_receiver_id() == rank and t.get("round") == version
    )


def _run(tmp_path, plan: random.Random | None, per_task: int = 0) -> tuple[dict, list, dict]:
    manager, wire = _buffered_server(tmp_path)
    while manager.phase == "buffered":
        rank = min(manager.pending)  # the lowest rank answers its oldest task
        version = min(manager.tasks[rank].values())
        task = _task(wire, rank, version)
        party, model = task.get("tasks")[0]["party"], task.get("tasks")[0]["payload"]["model"]
        if plan is not None:
            other = next(p for p, r in manager.placement.items() if r != rank)
            samples = manager.rounds.samples[party]
            target = Target(version, rank, party, other, model, samples, manager.rounds.terms, manager.config)
            for kind, fields in hostile_messages(plan, target, per_task):
                _from(manager, rank, kind, **fields)
        moved = {k: v + 0.01 * rank if v.is_floating_point() else v for k, v in model.items()}
        item = {
            "party": party,
            "n": manager.rounds.samples[party],
            "upload": {"model": moved, "party_id": party},
        }
        _from(manager, rank, m.RESULT, round=version, results=[item])
        if plan is not None and plan.random() < 0.5:  # the same result again: its task is done
            _from(manager, rank, m.RESULT, round=version, results=[item])
    for rank in sorted(manager.pending):
        _from(manager, rank, m.BYE)
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
    got = _run(tmp_path_factory.mktemp("attacked"), random.Random(seed), per_task)
    assert _same(got[0], model) and got[1] == records and _same(got[2], state)
