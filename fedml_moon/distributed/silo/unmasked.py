"""A silo reveals the unmasking shares of one summed value for one set of survivors only.

What a party adds to a synchronous round's secure sum is a function of what it was given: its update,
training metrics and (under `dp_buffers: average`) BatchNorm statistics of the model it was sent, the
run's settings and its data; its test counts of the model it tests. A server killed and resumed from
an earlier checkpoint (or started afresh with the same settings) has the round trained again and gets
the same values; DP noises the clipped update only. Two sums of such a value over different survivors
would differ by one party's: a curious server could crash itself to read it. So before a party
reveals its shares, its silo looks up the value's key (`update_key`: the settings, its data, the
round, the party and the model it was sent; `counts_key`: the counts themselves) in its folder's
`secure_sums.json` (kept across runs: `distributed/run_identity.py` leaves it in place), records the
survivors there (written whole, synced with its folder) before the shares leave, and, where the key
was revealed for other survivors, refuses, naming both: the round cannot be unmasked, and the server
stops it as any round that cannot be, nothing revealed. The same survivors give the same sum, which
reveals nothing more. A record it cannot read refuses every reveal until it is mended or removed. A
buffered run's held update is masked once per silo process (`SecureWorker._masked`); a silo that
lost its folder has no record.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from fedml_moon.core.codec import encode
from fedml_moon.privacy.secagg import SecAggError
from fedml_moon.run_folder import RunFolder

T = TypeVar("T")


def update_key(settings: str, data: str, round_idx: int, party: int, received: Any) -> str:
    """What determines a party's update of a round: the run's settings (their digest), its data's
    digest, the round, the party and the payload it was sent."""
    digest = hashlib.sha256(encode(received)).hexdigest()
    return hashlib.sha256(f"update|{settings}|{data}|{round_idx}|{party}|{digest}".encode()).hexdigest()


def counts_key(party: int, counts: Any) -> str:
    """A party's test counts are their own key: the same counts in two sums would tell them."""
    return hashlib.sha256(b"counts|%d|" % party + encode(counts)).hexdigest()


def _kept(path: Path) -> dict:
    """The record; SecAggError where it exists but cannot be read (never taken for an empty one)."""
    if not path.exists():
        return {}
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise SecAggError(f"{path} cannot be read ({err}): refusing to reveal; mend or remove it") from err
    if not isinstance(kept, dict):
        raise SecAggError(f"{path} is not this record (a JSON object): refusing to reveal")
    return kept


def reveal_once(folder: Path, key: str, what: str, survivors: list[int], unmask: Callable[[], T]) -> T:
    """`unmask()` (the party's shares, its checks first) where the value `key` names was revealed for
    no survivors or for these, the survivors then recorded before the shares leave; SecAggError,
    revealing nothing, where it was revealed for others. `what` names the value in the refusal."""
    path = RunFolder(folder).secure_sums
    kept, now = _kept(path), sorted(int(p) for p in survivors)
    before = kept.get(key)
    if before is not None and before != now:
        raise SecAggError(
            f"{what} was revealed for the survivors {before} (in {path.name}); a sum of other survivors "
            f"{now} would tell the difference: refusing (the same round after a restart takes the same "
            "parties)"
        )
    answer = unmask()
    if before is None:
        kept[key] = now
        _write(path, kept)
    return answer


def _write(path: Path, kept: dict) -> None:
    """Replace the record at once, synced with its folder (a power failure keeps it or the old one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as fh:
        fh.write(json.dumps(kept, sort_keys=True))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
