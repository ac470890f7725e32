"""The checkpoint of a synchronous round on the distributed server: after a round that is due
(`train_args.checkpoint_every`, and the last), every worker that is alive is asked to save its
parties (CHECKPOINT), and once each answered (CHECKPOINTED) or is given up on, the server writes its
own: its LATEST then implies theirs (engine/resume.py). Then the next round. A buffered run takes its
checkpoints as a consistent cut instead (server/buffered_checkpoint.py)."""

from __future__ import annotations

from typing import Any

from fedml_moon.distributed.managers import CHECKPOINT
from fedml_moon.engine.resume import Holding, save


class CheckpointPhase:
    """The checkpoint phase of a synchronous run (module docstring)."""

    def __init__(self, server: Any) -> None:
        self.server, self.state, self.settings, self.rounds = (
            server,
            server.state,
            server.settings,
            server.rounds,
        )

    def start(self, round_idx: int) -> None:
        """Ask the workers alive to save their parties for `round_idx`; with none, write at once."""
        alive = [rank for rank in self.settings.workers if not self.server.is_dead(rank)]
        self.server.enter("checkpoint", set(alive))
        for rank in alive:  # the workers first: the server's LATEST then implies theirs
            self.server.assign(rank, CHECKPOINT, round=round_idx)
        if not alive:
            self.write()

    def on_checkpointed(self, msg: Any) -> None:
        r = self.state.round
        if not self.server.expected(msg, "checkpoint"):
            return
        r.pending.discard(msg.get_sender_id())
        if not r.pending:
            self.server.advance(self.write)

    def write(self) -> None:
        r = self.state.round
        r.doing = f"writing the checkpoint of round {r.round_idx}"
        save(
            self.rounds.recorder.out_dir, r.round_idx, self.settings.full_config, Holding(server=self.rounds)
        )
        r.last_checkpoint = r.round_idx
        self.server.flow.next_round(r.round_idx + 1)
