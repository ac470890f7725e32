"""What the server checks of a party's upload before it is used: its shape (the server algorithm's
`upload_spec`), its training metrics (the algorithm's declared `terms`), its buffers by meaning
(`core.validate.buffer_problem`: BatchNorm variances, counters within the round's local steps) and
what the server algorithm knows of the party (`ServerAlgorithm.upload_problem`: FedSSC's `present`
against the party's labels). A member of `engine.rounds.ServerRounds`; pure PyTorch.

Two moments: at receipt (a silo's RESULT, `upload_problem(..., finite=False)`), where a mismatch is
refused as if the message never came, and before aggregation (`check_uploads`), where an upload that
holds NaN, Inf or a metric beyond range (a diverged party) is left out of the round and named.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from fedml_moon.core.validate import BadUpload, buffer_problem, report_problem, upload_problem

log = logging.getLogger(__name__)
COUNTER_SLACK = 4  # train-mode forward passes allowed per local step (a counter's range, `counter_cap`)


def local_steps(samples: int, epochs: int, batch_size: int) -> int:
    """The most local steps a party of `samples` takes in a round: epochs x ceil(samples / batch)."""
    return int(epochs) * max(1, math.ceil(int(samples) / int(batch_size)))


class UploadChecks:
    """What the server checks of uploads and reports: a member of `ServerRounds` (`server`), whose
    aggregator, samples, downloads and options it reads."""

    def __init__(self, server: Any) -> None:
        self.server = server  # the ServerRounds this is part of

    def upload_spec(self, party: int) -> dict:
        """What `party`'s upload must hold this round (the server algorithm's `upload_spec`)."""
        return self.server.aggregator.algorithm.upload_spec(self.server.aggregator.global_state, party)

    def counter_cap(self, party: int) -> int:
        """How far a BatchNorm counter may move in `party`'s round: COUNTER_SLACK x its local steps."""
        return COUNTER_SLACK * local_steps(self.server.samples.get(party, 1), *self.server.steps)

    def upload_problem(
        self, party: int, upload: Any, finite: bool = True, spec: dict | None = None
    ) -> str | None:
        """Why `party`'s upload cannot be used this round, or None (module docstring); `finite`: also
        refuse NaN / Inf tensors and metrics beyond range; `spec`: what it must hold, if not this
        round's `upload_spec` (a buffered task's, from when it was sent)."""
        problem = upload_problem(upload, spec or self.upload_spec(party), finite, self.server.terms)
        if problem is not None:
            return problem
        sent = self.server.sent.get(party, {}).get("model")
        if isinstance(sent, Mapping):
            problem = buffer_problem(upload["model"], sent, self.counter_cap(party))
            if problem is not None:
                return f"upload.{problem}"
        privacy = self.server.privacy
        missing = [] if privacy is None else sorted(set(privacy.metrics) - set(upload.get("metrics") or {}))
        if missing:  # each is an entry of the private sum: a party without it cannot add to the sum
            return f"upload.metrics lacks {missing}, which under privacy_args every party adds to the sum"
        return self.server.aggregator.algorithm.upload_problem(upload, party)

    def check_uploads(self, round_idx: int, results: dict) -> tuple[list[int], dict[int, str]]:
        """The parties of `results` whose uploads are usable, in the schedule's order, and why each other
        one is not (NaN / Inf, a misshapen tensor: logged); with `on_bad_upload: stop` a bad one stops
        the run."""
        reporters = [p for p in self.server.parties(round_idx) if p in results]
        rejected = {p: why for p in reporters if (why := self.upload_problem(p, results[p][1])) is not None}
        for party, why in rejected.items():
            log.error("round %d: party %d's upload is left out: %s", round_idx, party, why)
        if rejected and self.server.on_bad_upload == "stop":
            raise BadUpload(f"round {round_idx}: {rejected} (train_args.on_bad_upload: stop)")
        return [p for p in reporters if p not in rejected], rejected

    def report_problem(self, party: int, report: Any) -> str | None:
        """Why `party`'s evaluation report cannot be used this round, or None (`core.validate`): what
        the server asked for (local test, federated counts of its claimed test samples) and nothing else."""
        tests = self.server.evaluation.test_names() if self.server.federated else None
        seen = self.server.test_samples.get(party)
        return report_problem(report, party, self.personal_spec(), self.server.party_eval, tests, seen)

    def new_report_problem(self, party: int, report: Any) -> str | None:
        """Why `party`'s report of the new test (federated) cannot be used, or None: its counts only."""
        return report_problem(report, party, None, False, ["new"], self.server.test_samples.get(party))

    def personal_spec(self) -> dict | None:
        """The personal state a party's report may carry (personalised algorithms), or None."""
        if not self.server.personalized:
            return None
        return self.server.aggregator.algorithm.personal_spec(self.server.aggregator.global_state)
