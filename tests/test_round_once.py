"""A round is aggregated and recorded once, whatever fails after the aggregation: a failure at any step
that follows it (the record, the evaluation, the checkpoint, the next round's downloads) stops the run
naming the step and the checkpoint, the server algorithm's state moved once (FedAvgM's round counter
and velocity), no round is recorded twice, and the run resumed from the checkpoint ends with the model
of a run that never failed.

The server manager runs in this process on a tiny real run; the three silos are played here and
upload the model they were sent, moved by 0.01 x their rank."""

from __future__ import annotations

import pytest
import torch

from fedml_moon.distributed import managers as m
from fedml_moon.distributed.server import checkpoint as server_checkpoint
from fedml_moon.distributed.server.manager import ServerManager
from tests.support.marks import needs_fmnist
from tests.support.server import Wire, answer_moved, fedavgm_server, receive

pytestmark = needs_fmnist


def _play(manager: ServerManager, wire: Wire, rounds: int = 3) -> None:
    """The silos answer every TRAIN and CHECKPOINT of the run, then FINISH, as long as it lasts."""
    for _ in range(4 * rounds + 2):
        if manager.state.round.phase == "train":
            for rank in sorted(manager.state.round.pending):
                answer_moved(manager, wire, rank, manager.state.round.round_idx)
        elif manager.state.round.phase == "checkpoint":
            for rank in sorted(manager.state.round.pending):
                receive(manager, rank, m.CHECKPOINTED, round=manager.state.round.round_idx)
        elif manager.state.round.phase == "finish":
            for rank in sorted(manager.state.round.pending):
                receive(manager, rank, m.BYE)
        else:
            return


def _final(manager: ServerManager) -> dict:
    return {k: v.clone() for k, v in manager.rounds.aggregator.global_state.items()}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    manager, wire = fedavgm_server(tmp_path_factory.mktemp("clean"))
    _play(manager, wire)
    assert manager.status == "completed" and manager.rounds.aggregator.algorithm.round_idx == 3
    return _final(manager)


def _fail_once(original, when):
    """`original`, made to raise the first time `when(*args)` holds."""
    failed = []

    def broken(*args, **kwargs):
        if when(*args) and not failed:
            failed.append(args)
            raise RuntimeError(f"injected failure in {original.__name__}")
        return original(*args, **kwargs)

    return broken


STEPS = {  # step -> (the object to break, its member, what the server says it was doing)
    "record": (lambda mgr: mgr.rounds, "finish_round", "recording round 0"),
    "log": (lambda mgr: mgr.rounds.recorder, "log_round", "recording round 0"),
    "evaluate": (lambda mgr: mgr.rounds.aggregator, "test", "recording round 0"),
    "checkpoint": (lambda mgr: server_checkpoint, "save", "writing the checkpoint of round 0"),
    "next round": (lambda mgr: mgr.rounds, "downloads", "starting round 1"),
}


@pytest.mark.parametrize("step", sorted(STEPS))
def test_a_failure_after_aggregation_stops_the_run_without_applying_the_round_twice(
    tmp_path, monkeypatch, uninterrupted, step
):
    pick, name, doing = STEPS[step]
    manager, wire = fedavgm_server(tmp_path)
    target = pick(manager)
    when = (lambda *a: a[0] == 1) if step == "next round" else (lambda *a: True)
    monkeypatch.setattr(target, name, _fail_once(getattr(target, name), when))
    _play(manager, wire)
    algorithm = manager.rounds.aggregator.algorithm
    assert manager.status == "failed" and manager.state.round.phase == "done", step
    assert algorithm.round_idx == 1  # round 0 was aggregated once: FedAvgM stepped once
    rounds_recorded = [r["round"] for r in manager.rounds.recorder.records]
    assert rounds_recorded in ([], [0]) and len(set(rounds_recorded)) == len(rounds_recorded)
    aborts = [x.get("reason") for x in wire.sent if x.get_type() == m.ABORT]
    assert len(aborts) == 3 and f"the server failed while {doing}: RuntimeError: injected" in aborts[0]
    for _ in range(3):  # whatever comes later: ticks, the silos' answers to round 0 again
        receive(manager, 0, m.TICK)
        for rank in (1, 2, 3):
            answer_moved(manager, wire, rank, 0)
    assert algorithm.round_idx == 1 and len(manager.rounds.recorder.records) == len(rounds_recorded)
    if step == "next round":  # round 0's checkpoint is whole: resumed, the run ends as if never stopped
        resumed, again = fedavgm_server(tmp_path, resume=True)
        assert resumed.state.round.round_idx == 1
        _play(resumed, again)
        assert resumed.status == "completed"
        final = _final(resumed)
        assert all(torch.equal(final[k], uninterrupted[k]) for k in uninterrupted)
        assert [r["round"] for r in resumed.rounds.recorder.records] == [0, 1, 2]
