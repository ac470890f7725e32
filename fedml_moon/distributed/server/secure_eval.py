"""Federated evaluation under secure aggregation, on the server (a mixin of `PluginServerManager`).

On an evaluation round the server sends every worker EVAL with `secure: true`; each of its parties
tests the global model on its own split and, instead of reporting its counts, opens a secure session
for them (`privacy.secure_counts`): keys, shares, masked counts, unmasking, the same messages and
crowd rules as the training round's (distributed/server/secure.py). The server learns the sum of the
surviving parties' counts only, checks that its samples are what those parties claimed, that its
correct count lies in [0, samples] and its loss sum is >= 0 (`privacy.secure_counts.counts_problem`),
and records the totals; a REPORT (counts in the clear) is refused (`RoundPhases.on_report`). A sum
that cannot be formed (too few parties left, a secret that does not rebuild) or fails a check leaves
the round without test figures, logged; the run goes on.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from fedml_moon.distributed.managers import EVAL
from fedml_moon.privacy.secagg import SecAggError, ServerSession
from fedml_moon.privacy.secure_counts import counts_of, counts_params

log = logging.getLogger(__name__)


class SecureEvaluation:
    """For `PluginServerManager` (with `SecureServer` and `RoundPhases`)."""

    rounds: Any
    round_idx: int
    sa_keys: dict

    def start_secure_eval(self, alive: list[int], download: dict) -> None:
        """Ask every live worker for its parties' counts in a secure sum."""
        self.secure_reset()
        self.sa_purpose = "eval"
        self._phase("eval", set(alive))
        for rank in alive:
            self.assign(rank, EVAL, round=self.round_idx, payload=download)

    def eval_session(self) -> ServerSession:
        """The secure session of the round's counts (three per model evaluated)."""
        params = counts_params(self.rounds.privacy.options, len(self.sa_keys))
        return ServerSession(self.round_idx, params, 3 * len(self.rounds.test_names()))

    def eval_summed(self, total: torch.Tensor, survivors: list[int]) -> None:
        """The round's counts are summed: record them."""
        counts = counts_of(total, self.rounds.test_names())
        self.sa_purpose = "train"
        self.close_round(None, None, {"counts": counts, "parties": survivors})

    def eval_guarded(self, step: Any) -> Any:
        """`step` of the counts' secure session; one that cannot go on ends the evaluation, not the run."""

        def run() -> None:
            try:
                step()
            except SecAggError as err:
                log.warning("round %d is recorded without test figures: %s", self.round_idx, err)
                self.sa_purpose = "train"
                self.close_round(None)

        return run
