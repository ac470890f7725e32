"""A distributed buffered server killed at any moment and started again with --resume
(distributed/server/buffered_checkpoint.py) ends with the run never interrupted: bitwise its final model,
its records and the server algorithm's state. Updates that arrived before the checkpoint are kept;
those after it are lost with the server and trained again; no task is taken twice, even when a silo
still answers, to the new server, a task the old one sent.

The server manager runs in this process on a tiny real run (FedAvgM, K = 2 of 3 silos training at
once, a checkpoint after every round); the silos are played in order: each handles its messages
from the server as they were sent (a TRAIN answered with the model it was sent, moved by 0.01 x its
rank, its training loss 0.1 x its rank; a CHECKPOINT with CHECKPOINTED; an EVAL with its party's
local test, a figure of its rank and the round), the ranks in turn. With the parties' own tests
(`EVALUATED`: every other round and the last), an evaluation round holds the updates that arrive
until its record (distributed/server/buffered_eval.py), and the same holds. Under DP without secure
aggregation the noise is drawn afresh by each server: the resumed run takes the same updates, and
its accountant charges every sum released."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from fedml_moon.core.checkpoint import read_checkpoint
from fedml_moon.core.validate import spec_shapes
from fedml_moon.distributed import managers as m
from fedml_moon.engine.resume import checkpoint_root
from tests.support.buffered_silos import BUFFERED_FEDAVGM, CLOCK, EVALUATED, Silos, finish, outcome
from tests.support.marks import needs_fmnist
from tests.support.server import TIMING, receive, restart, same_tree, server_manager

pytestmark = needs_fmnist


def _in_order(tmp_path, updates: list[tuple[int, int]], settings: list[str]) -> tuple:
    """A run never interrupted whose silos answer the tasks in the order `updates` names them
    ([party, start version]; a silo holds one party here), CHECKPOINTs and EVALs at once."""
    manager, wire = server_manager(tmp_path, *settings)
    silos = Silos(manager, wire)
    for party, version in updates:
        silos.collect()
        for rank, queue in silos.queues.items():
            for msg in [q for q in queue if q.get_type() in (m.CHECKPOINT, m.EVAL)]:
                queue.remove(msg)
                silos.answer(rank, msg)
        silos.collect()
        rank = manager.settings.placement[party]
        task = next(q for q in silos.queues[rank] if q.get("round") == version)
        assert manager.state.buffer.tasks.get(rank, {}).get(party) == version, (party, version)
        silos.queues[rank].remove(task)
        silos.answer(rank, task)
    for rank in sorted(manager.state.round.pending):
        receive(manager, rank, m.BYE)
    return outcome(manager)


def _past_first_checkpoint(folder, settings: list[str], after: int) -> tuple:
    """A run whose silos answered until its first checkpoint was written, then `after` answers more:
    its manager, wire and silos (the server is "killed" by being dropped)."""
    manager, wire = server_manager(folder, *settings)
    silos = Silos(manager, wire)
    while manager.state.round.last_checkpoint is None:
        assert silos.step()
    for _ in range(after):
        assert silos.step()
    assert manager.state.round.phase in ("buffered", "eval")
    return manager, wire, silos


def test_a_checkpoint_waits_for_every_silo_and_holds_what_arrived_before_each_answered(tmp_path):
    """After round 0: CHECKPOINT to all three silos, each after its outstanding tasks; one not asked
    for (another round) changes nothing; a silo restarted meanwhile gets its tasks and the CHECKPOINT
    again. The checkpoint is written once the last answers, and holds, as arrived, the updates the
    silos sent before their CHECKPOINTED."""
    manager, wire = server_manager(tmp_path, *BUFFERED_FEDAVGM)
    silos = Silos(manager, wire)
    while not any(t.get_type() == m.CHECKPOINT for t in wire.sent):
        assert silos.step()
    silos.collect()
    assert sorted(r for r, q in silos.queues.items() if q and q[-1].get_type() == m.CHECKPOINT) == [1, 2, 3]
    receive(manager, 1, m.CHECKPOINTED, round=5)
    assert manager.state.buffer.cut is not None and manager.state.buffer.cut.awaiting == {1, 2, 3}
    time.sleep(1.1)  # a silo is welcomed at most once a second (server_manager.WELCOME_EVERY_S)
    restart(manager, 2, "restarted", [1])  # rank 2 restarts (HELLO, READY): asked again, after its tasks
    again = [t.get_type() for t in wire.sent[silos.seen :] if t.get_receiver_id() == 2]
    assert again[-1] == m.CHECKPOINT and m.TRAIN in again
    silos.queues[2].clear()  # what the old process had not answered is lost with it
    while manager.state.buffer.cut is not None:
        assert silos.step()
    root = checkpoint_root(tmp_path)
    assert (root / "LATEST").read_text().strip() == "0"
    held = read_checkpoint(root, 0, ("server",))["server"]["buffered"]["arrived"]
    assert sum(len(batch) for batch in held) >= 1
    assert len(finish(manager, silos)[1]) == 6


KILLS = [("plain", after) for after in (0, 1, 2, 3, 5, 8)] + [("evaluated", after) for after in (0, 3, 7)]


@pytest.mark.parametrize(("runs", "after"), KILLS)
def test_a_server_killed_and_resumed_is_a_run_never_interrupted(tmp_path, runs, after):
    """Killed `after` silo answers past its first checkpoint (wherever that falls: mid-buffer, while
    a later checkpoint waits for its silos); the tasks of the old server still queued at the silos
    are answered to the new one first (taken once, or refused as not outstanding). The resumed run
    keeps the records and the held updates of its checkpoint and is, bit for bit, the run never
    interrupted whose silos answer in the order its records name (so it takes no task twice). With
    evaluation rounds the order of the reports shapes the run as well (the updates held meanwhile):
    there, every update taken after the checkpoint was held in it or had a task of its own."""
    settings = EVALUATED if runs == "evaluated" else BUFFERED_FEDAVGM
    first, _, silos = _past_first_checkpoint(tmp_path / "run", settings, after)
    kept = [dict(r) for r in first.rounds.recorder.records[: first.state.round.last_checkpoint + 1]]
    held = read_checkpoint(checkpoint_root(tmp_path / "run"), first.state.round.last_checkpoint, ("server",))[
        "server"
    ]
    silos.collect()
    queued = [(r, msg) for r, q in silos.queues.items() for msg in q if msg.get_type() == m.TRAIN]
    again, wire_again = server_manager(tmp_path / "run", *settings, resume=True)
    assert (
        again.settings.start == first.state.round.last_checkpoint + 1
    )  # its held updates may have filled a buffer since
    for rank, msg in queued:
        Silos(again, wire_again).answer(rank, msg)
    got = finish(again, Silos(again, wire_again))
    strip = [{k: v for k, v in r.items() if k not in TIMING} for r in kept]
    assert got[1][: len(kept)] == strip
    taken = [(p, v) for r in got[1] for p, v in r["updates"]]  # (a fast party may take two of a version)
    assert len(got[1]) == 6
    jobs = held["buffered"]["inflight"]
    assert all(
        job[3] == spec_shapes(first.rounds.uploads.upload_spec(int(p))) for p, job in jobs.items()
    )  # Job.spec
    arrived = {(p, int(jobs[p][0])) for batch in held["buffered"]["arrived"] for p, _ in batch}
    assert arrived <= set(taken[sum(len(r["updates"]) for r in kept) :])
    if runs == "evaluated":  # when the reports came shapes the run too: each update had its own task
        sent = Counter(
            (t["party"], q.get("round"))
            for q in wire_again.sent
            if q.get_type() == m.TRAIN
            for t in q.get("tasks")
        )
        assert not Counter(taken[sum(len(r["updates"]) for r in kept) :]) - sent - Counter(arrived)
        assert all("local_test_acc" in r for r in got[1] if r["round"] % 2 == 0 or r["round"] == 5)
        return
    want = _in_order(tmp_path / "in-order", taken, settings)  # an update taken twice would have no task there
    assert same_tree(got[0], want[0]) and got[1] == want[1] and same_tree(got[2], want[2])


@pytest.mark.parametrize(("runs", "after"), [("plain", 0), ("plain", 2), ("plain", 5), ("evaluated", 4)])
def test_on_the_clock_a_server_killed_and_resumed_is_the_run_never_interrupted(tmp_path, runs, after):
    """The MPI simulation's server (its simulated clock orders the updates, whatever order the silos
    answer in): killed `after` answers past its first checkpoint and resumed, it ends bit for bit
    with the run never interrupted: model, records (simulated seconds and the parties' tests
    included) and server state."""
    clock = CLOCK + EVALUATED[len(BUFFERED_FEDAVGM) :] if runs == "evaluated" else CLOCK
    ref, ref_wire = server_manager(tmp_path / "reference", *clock)
    want = finish(ref, Silos(ref, ref_wire))
    _past_first_checkpoint(tmp_path / "run", clock, after)
    again, wire_again = server_manager(tmp_path / "run", *clock, resume=True)
    got = finish(again, Silos(again, wire_again))
    assert any(r["staleness_max"] > 0 for r in want[1])
    assert same_tree(got[0], want[0]) and got[1] == want[1] and same_tree(got[2], want[2])


@pytest.mark.parametrize("after", [1, 4])
def test_under_dp_a_server_killed_and_resumed_keeps_its_buffers_and_charges_every_release(tmp_path, after):
    """DP without secure aggregation (the server clips each update and noises each buffer's sum, the
    noise drawn afresh in every process): on the clock, killed `after` answers past its first
    checkpoint and resumed, the run takes the uninterrupted run's updates at the same simulated
    seconds. Its accountant keeps the checkpoint's epsilon and, from its ledger, charges the sums the
    killed server released after the checkpoint as well as their releases computed anew: beyond the
    checkpoint its epsilon is the uninterrupted run's if none was, and above it otherwise."""
    dp = [*CLOCK, "privacy_args.dp_clip_norm=1.0", "privacy_args.dp_noise_multiplier=1.0"]
    ref, ref_wire = server_manager(tmp_path / "reference", *dp)
    want = finish(ref, Silos(ref, ref_wire))[1]
    first, _, _ = _past_first_checkpoint(tmp_path / "run", dp, after)
    kept, released_after = (
        first.state.round.last_checkpoint + 1,
        len(first.rounds.recorder.records) - first.state.round.last_checkpoint - 1,
    )
    again, wire_again = server_manager(tmp_path / "run", *dp, resume=True)
    got = finish(again, Silos(again, wire_again))[1]
    assert [(r["updates"], r["sim_time_s"]) for r in got] == [(r["updates"], r["sim_time_s"]) for r in want]
    eps = [(g["dp_epsilon_release"], w["dp_epsilon_release"]) for g, w in zip(got, want, strict=True)]
    assert all(g == w for g, w in eps[:kept]) and len(got) == 6 and 0 < eps[0][1] < eps[-1][1]
    assert all((g > w) if released_after else (g == w) for g, w in eps[kept:]), (released_after, eps)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_checkpoint_holds_only_the_tasks_in_flight_at_the_cut(tmp_path, seed):
    """A fast party gets a second task of the same version after the cut; its silo answers both
    before its CHECKPOINTED (a silo restarted with its tasks sent again does; here the silos answer
    every task of that version first). Only the task in flight at the cut is held: each party once."""
    manager, wire = server_manager(tmp_path, *BUFFERED_FEDAVGM, f"common_args.random_seed={seed}")
    silos = Silos(manager, wire)
    while not any(t.get_type() == m.CHECKPOINT for t in wire.sent):
        assert silos.step()
    cut, version = manager.state.buffer.cut, manager.flow.core.version
    for _ in range(10):
        silos.collect()
        trains = [
            (r, msg)
            for r, queue in silos.queues.items()
            if r in cut.awaiting
            for msg in queue
            if msg.get_type() == m.TRAIN and msg.get("round") == version
        ]
        if not trains or manager.state.buffer.cut is not cut or manager.flow.core.version != version:
            break
        rank, msg = trains[0]
        silos.queues[rank].remove(msg)
        silos.answer(rank, msg)
    held = [p for batch in cut.held for p, _ in batch]
    assert len(held) == len(set(held)) and set(held) <= set(cut.jobs), held
