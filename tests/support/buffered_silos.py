"""A distributed buffered server in the test's own process (tests/support/server.py) and its three
silos played in order: each handles its messages from the server as they were sent (a TRAIN answered
with the model it was sent, moved by 0.01 x its rank, its training loss 0.1 x its rank; a CHECKPOINT
with CHECKPOINTED; an EVAL with its party's local test, a figure of its rank and the round), the
ranks in turn."""

from __future__ import annotations

from fedml_moon.distributed import managers as m
from fedml_moon.distributed.server.manager import ServerManager
from tests.support.server import TIMING, Wire, receive

BUFFERED_FEDAVGM = [
    "server_args.aggregation=buffered",
    "server_args.buffer_size=2",
    "train_args.comm_round=6",
    "train_args.checkpoint_every=1",
    "server_args.server_momentum=0.9",
    "server_args.server_momentum_style=fedavgm",
]
"""FedAvgM, K = 2 of 3 silos training at once, a checkpoint after every round."""
EVALUATED = [*BUFFERED_FEDAVGM, "validation_args.local_test=true", "validation_args.frequency_of_the_test=2"]
CLOCK = [
    *BUFFERED_FEDAVGM,
    "common_args.training_type=simulation",
    "comm_args.backend=MPI",
    "train_args.party_speed=lognormal",
]
"""The MPI simulation's server: its simulated clock orders the updates."""


class Silos:
    """The three silos: each answers the server's messages to it in the order they were sent."""

    def __init__(self, manager: ServerManager, wire: Wire) -> None:
        self.manager, self.wire, self.seen, self.last = manager, wire, 0, 0
        self.queues: dict[int, list] = {1: [], 2: [], 3: []}

    def collect(self) -> None:
        for msg in self.wire.sent[self.seen :]:
            if msg.get_type() in (m.TRAIN, m.CHECKPOINT, m.EVAL):
                self.queues[msg.get_receiver_id()].append(msg)
        self.seen = len(self.wire.sent)

    def step(self) -> bool:
        """The next rank with a message, in turn, answers its oldest one; False when none has one."""
        self.collect()
        ranks = sorted(self.queues)
        turn = ranks[self.last % len(ranks) :] + ranks[: self.last % len(ranks)]
        rank = next((r for r in turn if self.queues[r]), None)
        if rank is None:
            return False
        self.last = rank
        self.answer(rank, self.queues[rank].pop(0))
        return True

    def answer(self, rank: int, msg, to=None) -> None:
        to = to or self.manager
        if msg.get_type() == m.CHECKPOINT:
            receive(to, rank, m.CHECKPOINTED, round=msg.get("round"))
            return
        if msg.get_type() == m.EVAL:
            acc = 0.1 * rank + 0.01 * msg.get("round")
            receive(
                to,
                rank,
                m.REPORT,
                round=msg.get("round"),
                reports=[{"party_id": rank - 1, "local_test_acc": acc}],
            )
            return
        items = []
        for task in msg.get("tasks"):
            party, model = task["party"], task["payload"]["model"]
            moved = {k: v + 0.01 * rank if v.is_floating_point() else v for k, v in model.items()}
            upload = {"model": moved, "party_id": party, "metrics": {"ce": 0.1 * rank, "loss": 0.1 * rank}}
            items.append({"party": party, "n": to.rounds.samples[party], "upload": upload})
        receive(to, rank, m.RESULT, round=msg.get("round"), results=items)


def outcome(manager: ServerManager) -> tuple:
    """A completed run's final model, records (timings aside) and server algorithm state."""
    assert manager.status == "completed", manager.status
    records = [{k: v for k, v in r.items() if k not in TIMING} for r in manager.rounds.recorder.records]
    return dict(manager.rounds.aggregator.global_state), records, manager.rounds.aggregator.algorithm.state()


def finish(manager: ServerManager, silos: Silos) -> tuple:
    """The silos answer until the run finishes, then say BYE: the run's `outcome`."""
    while manager.state.round.phase != "finish" and silos.step():
        pass
    for rank in sorted(manager.state.round.pending):
        receive(manager, rank, m.BYE)
    return outcome(manager)
