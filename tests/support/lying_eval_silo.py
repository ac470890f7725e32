"""A real silo with valid credentials that attacks federated evaluation under secure aggregation, and
is otherwise the plugin's own silo (tests/test_own_data.py):

- round 0: it sends its parties' test counts in a clear REPORT as soon as it has them, and again a
  second later (after the honest silos' keys), then its keys for the counts' secure sum;
- every later round: it adds 10^6 to each correct count inside its masked vector, which the server
  cannot see, so the sum's correct count exceeds the test samples.

    python tests/support/lying_eval_silo.py run --cf CONFIG --set KEY=VALUE ... --rank R
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fedml_moon.cli import main  # noqa: E402
from fedml_moon.distributed.protocol import REPORT  # noqa: E402
from fedml_moon.distributed.silo.secure import SecureWorker  # noqa: E402

LIE = 10**6
_honest_eval = SecureWorker.secure_eval


def lying_eval(self: SecureWorker, round_idx: int, reports: list[dict], names: list[str]) -> None:
    """Round 0: its counts in the clear first; later rounds: its correct counts inflated in the sum."""
    if round_idx == 0:
        self.send(REPORT, 0, round=round_idx, reports=reports)
        time.sleep(1.0)  # the honest silos' keys are in: the server waits for this silo alone
        self.send(REPORT, 0, round=round_idx, reports=reports)
    else:
        reports = [
            {**r, "test": {n: [c + LIE, s, loss] for n, (c, s, loss) in r["test"].items()}} for r in reports
        ]
    _honest_eval(self, round_idx, reports, names)


SecureWorker.secure_eval = lying_eval
sys.exit(main())
