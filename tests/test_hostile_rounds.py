"""The attacker's side, as a differential property: a silo with valid credentials sends, in every round,
well-formed messages with hostile values (tests/support/hostile.py: extreme, negative, colliding with the
names the server writes, another silo's party, out of round, repeated, of the wrong phase), mixed at
random among the honest silos' results. The run ends with bitwise the final model, the server
algorithm's state and the records of the same run without those messages; each refusal names the
field. Hypothesis draws which messages, from which silo, and where they fall.

The server manager runs in this process on a tiny real run (FedAvgM: a round applied twice would show
in its velocity); the silos upload the model they were sent, moved by 0.01 x their rank."""

from __future__ import annotations

import logging
import random
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedml_moon.distributed import managers as m
from tests.support.hostile import Target, honest_item, hostile_messages
from tests.support.marks import needs_fmnist
from tests.support.server import TIMING, answer_moved, fedavgm_server, receive, same_tree

pytestmark = needs_fmnist

_REFERENCE: dict = {}


def _target(manager, wire, rank: int) -> Target:
    task = next(
        t
        for t in reversed(wire.sent)
        if t.get_type() == m.TRAIN
        and t.get_receiver_id() == rank
        and t.get("round") == manager.state.round.round_idx
    )
    party = task.get("tasks")[0]["party"]
    other = next(p for p, r in manager.settings.placement.items() if r != rank)
    model = task.get("tasks")[0]["payload"]["model"]
    samples = manager.rounds.samples[party]
    return Target(
        manager.state.round.round_idx,
        rank,
        party,
        other,
        model,
        samples,
        manager.rounds.terms,
        manager.settings.config,
    )


def _run(tmp_path, plan: random.Random | None, per_round: int = 0) -> tuple[dict, list, dict]:
    """Three rounds; with `plan`, each round silos drawn from it send `per_round` hostile messages each,
    at random places among the honest results (each before its own silo's honest result)."""
    manager, wire = fedavgm_server(tmp_path)
    while manager.state.round.phase in ("train", "checkpoint", "finish"):
        if manager.state.round.phase != "train":
            for rank in sorted(manager.state.round.pending):
                kind = m.CHECKPOINTED if manager.state.round.phase == "checkpoint" else m.BYE
                receive(
                    manager,
                    rank,
                    kind,
                    **({"round": manager.state.round.round_idx} if kind == m.CHECKPOINTED else {}),
                )
            continue
        steps = [("honest", rank) for rank in sorted(manager.state.round.pending)]
        if plan is not None:
            for rank in plan.sample([1, 2, 3], plan.randint(1, 3)):
                target = _target(manager, wire, rank)
                at = steps.index(("honest", rank))
                for message in hostile_messages(plan, target, per_round):
                    steps.insert(plan.randint(0, at), ("hostile", rank, message))
                    at += 1
                steps.append(
                    (
                        "again",
                        rank,
                        (
                            m.RESULT,
                            {"round": manager.state.round.round_idx, "results": [honest_item(target)]},
                        ),
                    )
                )
        round_idx = manager.state.round.round_idx
        for step in steps:
            if step[0] == "honest":
                answer_moved(manager, wire, step[1], round_idx)
            else:
                kind, fields = step[2]
                receive(manager, step[1], kind, **fields)
    algorithm = manager.rounds.aggregator.algorithm
    records = [{k: v for k, v in r.items() if k not in TIMING} for r in manager.rounds.recorder.records]
    assert manager.status == "completed", manager.status
    return dict(manager.rounds.aggregator.global_state), records, algorithm.state()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), per_round=st.integers(1, 12))
def test_hostile_messages_leave_the_run_as_it_is_without_them(tmp_path_factory, seed, per_round):
    if "run" not in _REFERENCE:
        _REFERENCE["run"] = _run(tmp_path_factory.mktemp("reference"), None)
    model, records, state = _REFERENCE["run"]
    got_model, got_records, got_state = _run(
        tmp_path_factory.mktemp("attacked"), random.Random(seed), per_round
    )
    assert same_tree(got_model, model)
    assert got_records == records
    assert same_tree(got_state, state)  # FedAvgM's round counter and velocity: every round applied once


def test_each_hostile_kind_is_refused_naming_its_field(tmp_path, caplog):
    """One message of each kind in round 0, from silo 1: each leaves a refusal (or a drop) in the log that
    names what is wrong, and the round then completes with the honest results."""
    manager, wire = fedavgm_server(tmp_path)
    target = _target(manager, wire, 1)
    messages = hostile_messages(random.Random(0), target, 10)
    for kind, fields in messages:
        before = len(caplog.records)
        receive(manager, 1, kind, **fields)
        said = " ".join(r.getMessage() for r in caplog.records[before:])
        if kind == m.HELLO and not fields["explicit"]:
            continue  # a new process id: taken (idempotent), its work sent again at most once
        assert said and ("refused" in said or "dropped" in said), (kind, fields, said)
    assert manager.state.round.pending == {1, 2, 3} and not manager.rounds.recorder.records
    trains = [x for x in wire.sent if x.get_type() == m.TRAIN and x.get_receiver_id() == 1]
    assert len(trains) <= 2
    for rank in (1, 2, 3):
        answer_moved(manager, wire, rank, 0)
    assert manager.rounds.recorder.records[0]["parties"] == 3


def test_hellos_from_new_processes_bring_one_welcome_a_second_and_the_work_once(tmp_path, caplog):
    """1,000 HELLOs from rank 1, each naming a new process (a restarted silo, again and again), within
    a second of its WELCOME: no WELCOME and no work more. A HELLO a second later is a restarted silo:
    it is welcomed and sent its work of the round once."""
    caplog.set_level(logging.INFO, logger="fedml_moon.distributed.server")  # formats every line
    manager, wire = fedavgm_server(tmp_path)
    hello = {"config": manager.settings.config, "explicit": [], "fresh_parties": []}
    sent = lambda kind: [x for x in wire.sent if x.get_type() == kind and x.get_receiver_id() == 1]  # noqa: E731
    welcomes, trains = len(sent(m.WELCOME)), len(sent(m.TRAIN))
    for i in range(1000):
        receive(manager, 1, m.HELLO, parties=[0], process=f"new-{i}", **hello)
    assert len(sent(m.WELCOME)) == welcomes and len(sent(m.TRAIN)) == trains
    time.sleep(1.1)
    receive(manager, 1, m.HELLO, parties=[0], process="restarted", **hello)
    assert len(sent(m.WELCOME)) == welcomes + 1 and len(sent(m.TRAIN)) == trains  # once its data are built:
    receive(manager, 1, m.READY, claims=[{"party": 0, "claim": manager.rounds.claims[0]}])
    assert len(sent(m.TRAIN)) == trains + 1
    assert "rank 1 restarted during the train phase of round 0; sent its work again" in caplog.text
    time.sleep(1.1)
    receive(manager, 1, m.HELLO, parties=[0], process="again", **hello)
    receive(manager, 1, m.READY, claims=[{"party": 0, "claim": manager.rounds.claims[0]}])
    assert len(sent(m.TRAIN)) == trains + 1  # its work of this phase goes out again once
