"""A run's identity, and a site's folder kept to one run at a time.

The server makes a run's identity when the run starts (a random key, kept in its folder's
`run.json`; a resumed run keeps it, `--overwrite` or another `--output-dir` makes a new one) and
names it in every WELCOME. A site's folder (`rank-<r>/`) holds the files of one run, the one its own
`run.json` names: a WELCOME of another run moves them to `rank-<r>/earlier/<run>/` before anything
of the new run is read or written, so a new run needs nothing new on the sites' command lines, and
what a site checks within a run (its data are those it read earlier in the run) is checked against
that run's files only. A restarted site of the same run, or a resumed run, finds its files where
they were. A hierarchical silo's other processes keep their own folders (`process-<k>/`), which
the new run's first task writes over, and the record of what the site's unmasking shares revealed
(`secure_sums.json`) stays for every run. Nothing here imports PyTorch or FedML.
"""

from __future__ import annotations

import logging
import re
import secrets
import shutil
from pathlib import Path

from fedml_moon.run_folder import EARLIER, PROCESS, SECURE_SUMS, RunFolder, read_json, write_json

log = logging.getLogger(__name__)
RUN_KEY = re.compile(r"[0-9a-f]{8,32}")
KEPT = (EARLIER, PROCESS.format(""), SECURE_SUMS)  # never moved: earlier runs, a group's processes, and
# what the site's shares revealed (silo/unmasked.py: a new run with the same settings sums the same values)


def server_run(folder: Path, resume: bool) -> str:
    """The identity of the run the server starts in `folder`: a new one, or with `resume` the one
    the folder's `run.json` keeps (made now for a folder written before runs had one)."""
    path = RunFolder(folder).run
    kept = recorded_run(folder) if resume else None
    if kept is not None:
        return kept
    run = secrets.token_hex(6)
    write_json(path, {"run": run})
    return run


def recorded_run(folder: Path) -> str | None:
    """The run whose files `folder` holds, from its `run.json`; None when it has none or a bad one."""
    value = read_json(RunFolder(folder).run, None)
    run = value.get("run") if isinstance(value, dict) else None
    return run if isinstance(run, str) and RUN_KEY.fullmatch(run) else None


def enter_run(folder: Path, run: object, rank: int) -> Path | None:
    """Make the site's `folder` the folder of `run` (a WELCOME's field): where it holds another run's
    files, move them to `earlier/<that run>/`; where it holds none of a run, it is `run`'s from now.
    Returns where earlier files went, or None. A `run` that is no key is refused (ValueError)."""
    if not isinstance(run, str) or not RUN_KEY.fullmatch(run):
        raise ValueError(f"the server's WELCOME names no run this site can keep files for: {str(run)[:40]!r}")
    root, before = Path(folder), recorded_run(folder)
    if before == run:
        return None
    moved = _moved(root, before) if before is not None else None
    write_json(RunFolder(root).run, {"run": run})
    if moved is not None:
        log.info("rank %d: a new run (%s); the files of run %s are kept in %s", rank, run, before, moved)
    return moved


def _moved(root: Path, before: str) -> Path | None:
    """Move the site's files of run `before` to `earlier/<before>/` (a second of the same name gets a
    suffix). `party_state/` is made again, empty: the site's store of its parties' states keeps it."""
    entries = [e for e in root.iterdir() if not e.name.startswith(KEPT)]
    if not entries:
        return None
    folder, n = RunFolder(root), 1
    target = folder.earlier(before)
    while target.exists():
        n += 1
        target = folder.earlier(f"{before}-{n}")
    target.mkdir(parents=True)
    for entry in entries:
        shutil.move(str(entry), str(target / entry.name))
    if (target / folder.party_state.name).is_dir():
        folder.party_state.mkdir()
    return target
