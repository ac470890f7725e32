"""The privacy ledger of a DP run: every sum the server released (unmasked, or noised and applied), one
JSON line each, appended as it is released and fsynced (`privacy_ledger.jsonl` beside the records).

A checkpoint holds the accountant of its round; a run that crashed after it had released more sums,
and is resumed, computes those rounds again with fresh noise: new releases of the same rounds. The
resumed accountant is therefore the ledger's, every release before the crash included, and each
round computed again is charged again.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)
Release = tuple[float, list[int]]  # (the sum's noise multiplier, the parties in it)


class PrivacyLedger:
    """`append` each release; `read` them all (resume). A run that starts anew empties the file at its
    first release; a resumed one (`read`) appends to it."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fresh = True

    def append(self, round_idx: int | None, sigma: float, parties: list[int]) -> None:
        line = json.dumps(
            {"round": round_idx, "sigma": float(sigma), "parties": sorted(int(p) for p in parties)}
        )
        with self.path.open("w" if self._fresh else "a") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self._fresh = False

    def read(self) -> list[Release]:
        """Every release written so far (a line a crash tore is left out, with a warning)."""
        self._fresh = False
        if not self.path.is_file():
            return []
        out: list[Release] = []
        for number, line in enumerate(self.path.read_text().splitlines(), start=1):
            try:
                entry = json.loads(line)
                out.append((float(entry["sigma"]), [int(p) for p in entry["parties"]]))
            except (ValueError, KeyError, TypeError):
                log.warning("%s: line %d is not a release (torn by a crash?); left out", self.path, number)
        return out
