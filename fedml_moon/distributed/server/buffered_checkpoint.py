"""Checkpoints of a distributed buffered run (`server_args.aggregation: buffered`), and its resume: a
member of `BufferedFlow`.

A buffered run never stops its parties, so its checkpoint is a consistent cut rather than a round's
end. After a round that is due (`train_args.checkpoint_every`; not the last) has been applied and its
freed slots filled, the server keeps a copy of its state (`ServerRounds.state`, the buffered rounds'
included) and sends CHECKPOINT {round} to every silo that is here. A silo handles its messages in
order: it trains every task it was sent before the CHECKPOINT, answers them, saves its parties and
answers CHECKPOINTED. So the updates a silo sent before its CHECKPOINTED are those its saved parties
have trained: they join the copy as arrived, not yet taken; its tasks outstanding at the cut stay in
flight in the copy. Once every silo answered (or is gone, or silent past `comm_args.round_timeout_s`;
one restarted meanwhile is sent its tasks and the CHECKPOINT again), the copy is written as the
checkpoint of that round. The run goes on meanwhile, taking updates as they come; a checkpoint due
while another waits for its silos is taken once that one is written, at the next update taken.

`--resume` loads the copy: the silos load their checkpoint of that round (WELCOME {resume_from}), the
server sends each its outstanding tasks again, takes the arrived updates and fills the free slots.
An update that arrived before the checkpoint is kept; one that arrived after it is lost with the
server and its task is trained again. Each task is taken at most once: a result for a task no longer
outstanding at its silo is refused. A party's local round depends only on its
saved state and what it was sent, so training a task again gives the update it gave before, and the
run's records replay (`fedml-moon replay`) to its model.
"""

from __future__ import annotations

import copy
import logging
import time
from typing import Any

from fedml_moon.core.checkpoint import write_checkpoint
from fedml_moon.distributed.managers import CHECKPOINT
from fedml_moon.distributed.server.state import Cut
from fedml_moon.engine.resume import due

log = logging.getLogger(__name__)


class BufferedCheckpoints:
    """The checkpoint and resume of a buffered distributed run (module docstring)."""

    def __init__(self, server: Any, flow: Any, core: Any) -> None:
        self.server, self.state, self.settings, self.rounds = (
            server,
            server.state,
            server.settings,
            server.rounds,
        )
        self.flow, self.core = flow, core  # the buffered flow it is part of, its BufferedRounds

    def mark_due(self, round_idx: int) -> None:
        """Round `round_idx` was applied: a checkpoint follows once its slots are filled, if it is due."""
        if round_idx < self.rounds.rounds - 1 and due(
            self.settings.checkpoint_every, round_idx, self.rounds.rounds
        ):
            self.state.buffer.cut_due = True

    def take_cut(self) -> None:
        """Start the checkpoint that is due (module docstring), unless one still waits for its silos."""
        b, core = self.state.buffer, self.core
        if not b.cut_due or self.flow.finished() or core.held:
            return  # a resumed run's held updates are taken first: a cut now would lose them
        if b.cut is not None:
            log.debug(
                "version %d: a checkpoint is due, but round %d's still waits for its silos",
                core.version,
                b.cut.round,
            )
            return
        b.cut_due = False
        round_idx = core.version - 1
        self.state.round.doing = f"taking the checkpoint of round {round_idx}"
        here = {rank for rank in self.settings.workers if not self.server.away(rank)}
        state = copy.deepcopy(self.rounds.state(round_idx))
        b.cut = Cut(round_idx, state, dict(core.inflight), here)
        for rank in sorted(here):
            self.server.send(CHECKPOINT, rank, round=round_idx)
        self.write_cut()

    def hold(self, rank: int, items: list[dict]) -> None:
        """Updates from `rank` before it answered CHECKPOINTED, each for the task its party had in
        flight at the cut (still in flight here: the update is about to be taken): its saved parties
        trained them. An update for a task sent after the cut (a restarted silo answers its tasks
        sent again before the CHECKPOINT sent again) is the resumed run's to train."""
        cut = self.state.buffer.cut
        if cut is None or rank not in cut.awaiting:
            return
        inflight = self.core.inflight
        batch = [
            [item["party"], item["upload"]]
            for item in items
            if cut.jobs.get(item["party"]) is not None
            and inflight.get(item["party"]) is cut.jobs[item["party"]]
        ]
        if batch:
            cut.held.append(batch)

    def ask_again(self, rank: int) -> None:
        """A restarted silo lost the CHECKPOINT it owes an answer to: it is sent again, once a cut."""
        cut = self.state.buffer.cut
        if cut is not None and rank in cut.awaiting and rank not in cut.asked_again:
            cut.asked_again.add(rank)
            self.server.send(CHECKPOINT, rank, round=cut.round)

    def on_checkpointed(self, msg: Any) -> None:
        """A silo saved its parties for the checkpoint being taken; once all have, it is written."""
        rank, round_idx, cut = msg.get_sender_id(), msg.get("round"), self.state.buffer.cut
        if cut is None or rank not in cut.awaiting or round_idx != cut.round:
            self.server.refused(
                rank, f"dropped a CHECKPOINTED from rank {rank} for round {round_idx}: not asked for"
            )
            return
        cut.awaiting.discard(rank)
        self.server.advance(self.write_cut)

    def cut_gone(self, ranks: set[int], why: str) -> None:
        """Silos gone or silent do not hold the checkpoint up: it is written without theirs."""
        cut = self.state.buffer.cut
        if cut is None or not ranks & cut.awaiting:
            return
        log.warning(
            "checkpoint of round %d written without rank(s) %s: %s",
            cut.round,
            sorted(ranks & cut.awaiting),
            why,
        )
        cut.awaiting -= ranks
        self.server.advance(self.write_cut)

    def write_cut(self) -> None:
        """Write the checkpoint once no silo owes its CHECKPOINTED."""
        b = self.state.buffer
        cut = b.cut
        if cut is None or cut.awaiting:
            return
        self.state.round.doing = f"writing the checkpoint of round {cut.round}"
        cut.state["buffered"]["arrived"] += cut.held
        parts = {"config": self.settings.full_config, "server": cut.state}
        write_checkpoint(self.rounds.recorder.folder.checkpoints, cut.round, parts)
        self.state.round.last_checkpoint, b.cut = cut.round, None
        held = sum(len(batch) for batch in cut.state["buffered"]["arrived"])
        log.info("checkpoint of round %d written (%d updates arrived, not yet taken)", cut.round, held)

    def overdue(self) -> None:
        """At a tick: silos that owe their CHECKPOINTED past `comm_args.round_timeout_s` are left out."""
        cut, deadline = self.state.buffer.cut, self.settings.deadline_s
        if cut is not None:
            late = time.monotonic() - cut.started > deadline
            away = {rank for rank in cut.awaiting if late or self.server.away(rank)}
            if away:
                self.cut_gone(away, "gone or silent" if not late else f"no answer in {deadline:g} s")

    # --- resume ---------------------------------------------------------------------------------------
    def resume(self) -> None:
        """A resumed run: each silo gets again its tasks in flight at the checkpoint; the updates that
        had arrived are taken, message by message, as they were when they came."""
        core, tasks, r = self.core, self.state.buffer.tasks, self.state.round
        arrived = {p for batch in core.held for p in batch}
        for party, job in sorted(core.inflight.items()):
            if party not in arrived:
                tasks.setdefault(self.settings.placement[party], {})[party] = job.start
        for rank, mine in sorted(tasks.items()):
            for version in sorted(set(mine.values())):
                r.pending.add(rank)
                self.flow.send_tasks(rank, version, [p for p, v in mine.items() if v == version])
        log.info(
            "resumed at version %d: %d tasks sent again, %d updates arrived before the checkpoint",
            core.version,
            sum(len(t) for t in tasks.values()),
            len(arrived),
        )
        while core.held and r.phase == "buffered":
            core.arrived.update(core.held.pop(0))
            self.server.advance(self.flow.take_arrived)
