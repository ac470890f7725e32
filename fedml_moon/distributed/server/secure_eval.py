"""Federated evaluation under secure aggregation, on the server: the secure sum of the parties' test
counts (a job of `server/secure.py`'s `SecureSum`).

On an evaluation round the server sends every worker EVAL with `secure: true`; each of its parties
tests the global model on its own split and, instead of reporting its counts, opens a secure session
for them (`privacy.secure_counts`): keys, shares, masked counts, unmasking, the same messages and
crowd rules as the training round's. The server learns the sum of the surviving parties' counts
only, checks that its samples are what those parties claimed, that its correct count lies in
[0, samples] and its loss sum is >= 0 (`privacy.secure_counts.counts_problem`), and records the
totals; a REPORT (counts in the clear) is refused (`RoundPhases.on_report`). A sum that cannot be
formed (too few parties left, a secret that does not rebuild) or fails a check leaves the round
without test figures, logged; the run goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fedml_moon.privacy.secagg import SecAggError, ServerSession
from fedml_moon.privacy.secure_counts import counts_of, counts_params

log = logging.getLogger(__name__)


class CountsSum:
    """The secure sum of the parties' test counts (module docstring): every party of a live rank
    takes part; the sum is the round's test figures."""

    keys_phase = "eval"

    def __init__(self, server: Any) -> None:
        self.server, self.state, self.settings, self.rounds = (
            server,
            server.state,
            server.settings,
            server.rounds,
        )

    def members(self) -> list[int]:
        return sorted(self.settings.placement)

    def plan_for(self, party: int) -> None:
        """Counts are added as they are: no plan."""
        return None

    def holds(self, rank: int) -> set[int]:
        """Every party a rank holds tests."""
        return {p for p, at in self.settings.placement.items() if at == rank}

    def keys_taken(self, party: int) -> None:
        """A party's keys count for nothing more."""

    def keys_in(self) -> Callable[[], None]:
        return self.server.secure.after_keys

    def ready_for_roster(self) -> bool:
        return True

    def ready_for_mask(self) -> bool:
        return True

    def session(self) -> ServerSession:
        """The secure session of the round's counts (three per model evaluated)."""
        params = counts_params(self.rounds.privacy.options, len(self.state.secure.keys))
        return ServerSession(self.state.round.round_idx, params, 3 * len(self.rounds.evaluation.test_names()))

    def count(self, vector: Any) -> None:
        """The masked counts are what evaluation carried."""
        self.rounds.eval_totals["eval_bytes_up"] += vector.numel() * vector.element_size()

    def summed(self, total: Any, survivors: list[int]) -> None:
        """The round's counts are summed: record them."""
        counts = counts_of(total, self.rounds.evaluation.test_names())
        self.server.secure.end()
        self.server.flow.close_round(None, None, {"counts": counts, "parties": survivors})

    def guarded(self, step: Callable[[], None]) -> Callable[[], None]:
        """`step` of the counts' secure session; one that cannot go on ends the evaluation, not the run."""

        def run() -> None:
            try:
                step()
            except SecAggError as err:
                log.warning("round %d is recorded without test figures: %s", self.state.round.round_idx, err)
                self.server.secure.end()
                self.server.flow.close_round(None)

        return run
