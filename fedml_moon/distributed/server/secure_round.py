"""A synchronous round's secure sum on the server (a job of `server/secure.py`'s `SecureSum`): the
round's sampled parties' uploads, summed under SecAgg / SecAgg+ (and DP, `privacy_args`), never seen
one by one. Its parties' keys come in the round's train phase and count for its quorum
(`comm_args.min_reports`); the survivors' sum is the round's aggregate."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fedml_moon.privacy.secagg import ServerSession


class TrainSum:
    """A synchronous round's secure sum: its sampled parties' uploads. Its keys come in the train
    phase and count for the round's quorum; the survivors' sum is the round's aggregate."""

    keys_phase = "train"

    def __init__(self, server: Any) -> None:
        self.server, self.state, self.rounds = server, server.state, server.rounds

    def members(self) -> list[int]:
        """The parties whose vectors this sum is of: the round's sampled parties."""
        return self.rounds.parties(self.state.round.round_idx)

    def plan_for(self, party: int) -> Any:
        """What `party` adds to this training sum (`PrivateAggregation.plan`)."""
        return self.rounds.privacy.plan(party)

    def holds(self, rank: int) -> set[int]:
        """The parties `rank` may send keys for: those of its TRAIN tasks."""
        work = self.state.sites[rank].work
        return {t["party"] for t in work[1]["tasks"]} if work is not None else set()

    def keys_taken(self, party: int) -> None:
        self.state.round.results[party] = (float(self.rounds.samples[party]), {})  # counts for the quorum

    def keys_in(self) -> Callable[[], None]:
        return self.server.round_phases.after_train

    def ready_for_roster(self) -> bool:
        return True

    def ready_for_mask(self) -> bool:
        return True

    def session(self) -> ServerSession:
        return self.server.secure.upload_session()

    def count(self, vector: Any) -> None:
        totals = self.rounds.totals
        totals["bytes_up"] += vector.numel() * vector.element_size()
        totals["params_up"] += vector.numel()

    def guarded(self, step: Callable[[], None]) -> Callable[[], None]:
        return step

    def summed(self, total: Any, survivors: list[int]) -> None:
        r = self.state.round
        r.ordered = self.rounds.summing.apply_sums(self.server.secure.sums(total, survivors))
        self.server.round_phases.after_aggregate()
