"""A rank's limits hold across any sequence of REFUSE, BYE, ERROR, HELLO and READY (each HELLO from a
new process, as a site restarted again and again), in every phase of a synchronous and a buffered run:
the phase's work goes out again at most once, a WELCOME at most once a second, the rank's large
frames' allowance grows by at most one message, and its "is ready" line is logged once and then
bounded (distributed/server/state.py). The server manager runs in this process on a tiny real run
(tests/support/server.py); the WELCOME's clock is the test's own, a quarter second a message."""

from __future__ import annotations

import logging
import random
from types import SimpleNamespace

import pytest

from fedml_moon.distributed import managers as m
from fedml_moon.distributed.server import ready
from fedml_moon.distributed.transport.budget import SPARE_FRAMES
from tests.support.buffered_silos import BUFFERED_FEDAVGM
from tests.support.marks import needs_fmnist
from tests.support.server import answer_train, receive, server_manager

pytestmark = needs_fmnist
STEP_S = 0.25
MESSAGES = 120
WORK = {"train": m.TRAIN, "eval": m.EVAL, "checkpoint": m.CHECKPOINT, "finish": m.FINISH, "buffered": m.TRAIN}
SETTINGS = {
    "hello": [],
    "train": [],
    "eval": ["validation_args.local_test=true"],
    "checkpoint": ["train_args.checkpoint_every=1"],
    "finish": ["train_args.comm_round=1"],
    "buffered": BUFFERED_FEDAVGM,
}


class Clock:
    """The WELCOME's clock (server/ready.py), moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def _in_phase(tmp_path, phase: str):
    manager, wire = server_manager(tmp_path, *SETTINGS[phase], ready=phase != "hello")
    if phase in ("eval", "checkpoint", "finish"):
        for rank in (1, 2, 3):
            answer_train(manager, wire, rank)
    if phase == "finish":  # the last round's checkpoint first
        for rank in (1, 2, 3):
            receive(manager, rank, m.CHECKPOINTED, round=0)
    assert manager.state.round.phase == phase, (phase, manager.state.round.phase)
    return manager, wire


def _play(manager, seed: int, clock: Clock, phase: str) -> None:
    """MESSAGES of REFUSE, BYE, ERROR, HELLO and READY from rank 1 in an order drawn from `seed` (no ERROR
    before the run: it stops the run, as the docs say)."""
    kinds = ["HELLO", "HELLO", "READY", "READY", "REFUSE", "BYE"] + ([] if phase == "hello" else ["ERROR"])
    claims = [{"party": 0, "claim": manager.rounds.claims[0]}]
    rng = random.Random(seed)
    hello = {"config": manager.settings.config, "explicit": [], "fresh_parties": [], "parties": [0]}
    for i in range(MESSAGES):
        clock.now += STEP_S
        kind = rng.choice(kinds)
        if kind == "HELLO":
            receive(manager, 1, m.HELLO, process=f"restart-{seed}-{i}", **hello)
        elif kind == "READY":
            receive(manager, 1, m.READY, claims=claims)
        elif kind == "REFUSE":
            receive(manager, 1, m.REFUSE, kind="changed", key="data_args.data_cache_dir")
        elif kind == "ERROR":
            receive(manager, 1, m.ERROR, reason="killed")
        else:
            receive(manager, 1, m.BYE)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("phase", sorted(SETTINGS))
def test_no_sequence_of_refuse_bye_error_and_hello_resets_a_ranks_limits(
    tmp_path, monkeypatch, caplog, phase, seed
):
    clock = Clock()
    monkeypatch.setattr(ready, "time", SimpleNamespace(monotonic=clock.monotonic))
    caplog.set_level(logging.INFO, logger="fedml_moon.distributed")
    manager, wire = _in_phase(tmp_path, phase)
    before = len(wire.sent)
    allowance = _allowance(wire, 1)
    _play(manager, seed, clock, phase)
    sent = [x for x in wire.sent[before:] if x.get_receiver_id() == 1]
    welcomes = sum(x.get_type() == m.WELCOME for x in sent)
    assert welcomes <= 1 + MESSAGES * STEP_S, welcomes  # at most one a second
    if phase in WORK:
        work = [x for x in sent if x.get_type() == WORK[phase]]
        versions = [x.get("round") for x in work]
        assert len(versions) == len(set(versions)) and len(work) <= 1 + (phase == "buffered"), versions
        assert work, "a restarted rank's READY brings it its work again"  # the limit is met, not avoided
    if phase != "buffered":  # a buffered run's refill grants a new task its own answer
        assert _allowance(wire, 1) <= allowance + 1 + SPARE_FRAMES, (allowance, _allowance(wire, 1))
    lines = [r for r in caplog.records if "rank 1 is ready" in r.getMessage()]
    assert len(lines) <= 1 + manager.refusals.per_source, len(lines)
    assert manager.state.round.phase != "done" or phase == "finish"  # the run goes on


def _allowance(wire, rank: int) -> int:
    """What `rank` may still send in large frames this phase: what it owes and the spare."""
    budget = wire.budget
    return (budget._owed or {}).get(rank, 0) + budget.spare - budget._used[rank]
