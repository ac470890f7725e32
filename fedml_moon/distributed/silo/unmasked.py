"""A silo reveals each of its parties' unmasking shares of a round for one set of survivors only.

Without DP a party's update of a round is a function of the model it was sent and its data: a server
killed and resumed from an earlier checkpoint has the round trained again and gets the same update.
Two sums of that round over different survivors would then differ by the updates of the parties in
one and not the other: a curious server could crash itself to read a party's update. So before a
party reveals its shares of a round's sum (its update's, or its test counts'), its silo records the
survivors in its folder (`secure_sums.json`, written whole and synced before the shares leave); asked
again for that round and that sum with other survivors, it refuses, naming both (the round cannot be
unmasked, and the server stops it as it stops any round that cannot be: nothing revealed). The same
survivors give the same sum, which reveals nothing more. Under DP each sum carries fresh noise and
the server's ledger charges each release (docs/explanation/privacy.md); a buffered run's update is
masked once anyway (`SecureWorker._masked`). The record is the run's (a new run's WELCOME moves it
aside with the rest of the site's files: `distributed/run_identity.py`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from fedml_moon.privacy.secagg import SecAggError
from fedml_moon.run_folder import RunFolder, read_json, replacing

T = TypeVar("T")


def reveal_once(
    folder: Path, party: int, what: str, round_idx: int, survivors: list[int], unmask: Callable[[], T]
) -> T:
    """`unmask()` (the party's shares, its checks first) where `party` revealed none of round
    `round_idx`'s `what` sum ("update" or "counts") or revealed them for the same `survivors`, the
    survivors then recorded before the shares leave; SecAggError, revealing nothing, where it revealed
    them for other survivors."""
    path = RunFolder(folder).secure_sums
    kept = read_json(path, {})
    kept = kept if isinstance(kept, dict) else {}
    key, now = f"{what} {round_idx} party {party}", sorted(int(p) for p in survivors)
    before = kept.get(key)
    if before is not None and before != now:
        raise SecAggError(
            f"round {round_idx}: party {party} revealed its shares of this round's {what} sum for the "
            f"survivors {before} (in {path.name}); a sum of other survivors {now} would tell the "
            "difference: refusing (the same round after a restart takes the same parties)"
        )
    answer = unmask()
    if before is None:
        kept[key] = now
        with replacing(path) as tmp:
            with tmp.open("w") as fh:
                fh.write(json.dumps(kept, sort_keys=True))
                fh.flush()
                os.fsync(fh.fileno())
    return answer
