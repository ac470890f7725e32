"""A checkpoint write that dies at any file-system step leaves LATEST naming a complete, readable
checkpoint, also when it rewrites a round that already has a folder (a resumed run checkpointing again
a round it recomputed); the next write tidies up what the dead one left."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from fedml_moon.core import checkpoint
from fedml_moon.core.checkpoint import CheckpointError, latest, read_checkpoint, rounds, write_checkpoint

NAMES = ("server", "parties")
STEPS = ("replace", "rmtree", "write", "fsync")


class Crash(BaseException):
    """The process dies here: no except clause of the code under test runs."""


def parts(round_idx: int, version: int) -> dict:
    return {
        "server": {"w": torch.full((3,), float(10 * round_idx + version)), "round": round_idx},
        "parties": {"0": {"v": version}},
    }


def content(tree: dict) -> tuple:
    return (tuple(tree["server"]["w"].tolist()), tree["server"]["round"], tree["parties"]["0"]["v"])


class FailAt:
    """Counts the file-system steps of write_checkpoint; makes step number `at` fail (with `error`),
    or only counts when `at` is None."""

    def __init__(self, monkeypatch, at: int | None, error: type[BaseException]) -> None:
        self.calls, self.at, self.error = [], at, error
        real = {
            "replace": os.replace,
            "rmtree": shutil.rmtree,
            "write": checkpoint._write_file,
            "fsync": checkpoint._fsync_dir,
        }

        def wrap(step: str):
            def call(*args, **kwargs):
                self.calls.append((step, str(args[0])))
                if len(self.calls) - 1 == self.at:
                    if step == "rmtree" and Path(args[0]).is_dir():  # dies half-way through removing
                        files = sorted(p for p in Path(args[0]).rglob("*") if p.is_file())
                        if files:
                            files[0].unlink()
                        if self.error is OSError and kwargs.get("ignore_errors"):
                            return None  # what rmtree(ignore_errors=True) does with an error
                    raise self.error(28, "No space left on device") if self.error is OSError else self.error()
                return real[step](*args, **kwargs)

            return call

        monkeypatch.setattr(checkpoint.os, "replace", wrap("replace"))
        monkeypatch.setattr(checkpoint.shutil, "rmtree", wrap("rmtree"))
        monkeypatch.setattr(checkpoint, "_write_file", wrap("write"))
        monkeypatch.setattr(checkpoint, "_fsync_dir", wrap("fsync"))


def assert_latest_is_whole(root: Path, allowed: dict[int, set], where: object) -> None:
    """LATEST names a round listed by rounds(), whose parts read back as one of its written versions."""
    r = latest(root)
    assert r is not None and r in rounds(root), f"failed at {where}: LATEST names {r}; {rounds(root)}"
    assert content(read_checkpoint(root, r, NAMES)) in allowed[r], f"failed at {where}"


SCENARIOS = {
    # name: (what is on disk before: [(round, version)], keep, the write that dies: (round, version))
    "rewrite the latest round": ([(2, 0), (3, 0)], 1, (3, 1)),
    "rewrite, keeping two": ([(2, 0), (3, 0)], 2, (3, 1)),
    "write the next round": ([(3, 0)], 1, (4, 0)),
    "write the next round, keeping two": ([(2, 0), (3, 0)], 2, (4, 0)),
}


def _setup(root: Path, before: list[tuple[int, int]], keep: int) -> None:
    for r, v in before:
        write_checkpoint(root, r, parts(r, v), keep=keep)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("error", [Crash, OSError], ids=["crash", "oserror"])
def test_a_write_that_fails_at_any_step_leaves_latest_whole(scenario, error, tmp_path, monkeypatch):
    before, keep, (r, v) = SCENARIOS[scenario]
    allowed: dict[int, set] = {}
    for rr, vv in [*before, (r, v)]:
        allowed.setdefault(rr, set()).add(content(parts(rr, vv)))
    with monkeypatch.context() as m:  # how many steps a write takes
        _setup(tmp_path / "count", before, keep)
        counter = FailAt(m, None, error)
        write_checkpoint(tmp_path / "count", r, parts(r, v), keep=keep)
    steps = len(counter.calls)
    assert {s for s, _ in counter.calls} == set(STEPS)
    for at in range(steps):
        root = tmp_path / f"at-{at}"
        _setup(root, before, keep)
        with monkeypatch.context() as m:
            failing = FailAt(m, at, error)
            try:
                write_checkpoint(root, r, parts(r, v), keep=keep)
            except (Crash, CheckpointError):
                pass
        where = failing.calls[at] if at < len(failing.calls) else None
        assert_latest_is_whole(root, allowed, where)
        # the next write (the run going on, or resumed) finds its way and leaves no debris
        write_checkpoint(root, r, parts(r, v), keep=keep)
        assert latest(root) == r and content(read_checkpoint(root, r, NAMES)) == content(parts(r, v))
        assert not [p.name for p in root.iterdir() if p.name.startswith(".") and p.is_dir()], where
        assert len(rounds(root)) <= keep


def test_an_old_folder_stands_in_for_a_missing_round(tmp_path):
    """A rewrite that died between moving the old folder aside and renaming the new one in."""
    write_checkpoint(tmp_path, 3, parts(3, 0))
    os.replace(tmp_path / "round-3", tmp_path / ".old-3")
    assert latest(tmp_path) == 3 and rounds(tmp_path) == [3]
    assert content(read_checkpoint(tmp_path, 3, NAMES)) == content(parts(3, 0))
    write_checkpoint(tmp_path, 4, parts(4, 0), keep=2)  # puts it back, keeps it as the older one
    assert rounds(tmp_path) == [3, 4] and not (tmp_path / ".old-3").exists()
    assert content(read_checkpoint(tmp_path, 3, NAMES)) == content(parts(3, 0))


def test_a_rewrite_replaces_the_round_and_keeps_the_others(tmp_path):
    for r in (1, 2, 3):
        write_checkpoint(tmp_path, r, parts(r, 0), keep=2)
    assert rounds(tmp_path) == [2, 3]
    write_checkpoint(tmp_path, 3, parts(3, 1), keep=2)
    assert rounds(tmp_path) == [2, 3] and latest(tmp_path) == 3
    assert content(read_checkpoint(tmp_path, 3, NAMES)) == content(parts(3, 1))
    write_checkpoint(tmp_path, 2, parts(2, 1), keep=2)  # a resume from round 1 went another way
    assert rounds(tmp_path) == [2], "round 3 belongs to a timeline a resume abandoned"


def test_a_part_in_pieces_is_written_one_piece_at_a_time_and_read_lazily(tmp_path):
    """Many parties' states: each piece is made, encoded and written before the next is made, and read
    back only when asked for; a damaged piece is named when it is read."""
    from fedml_moon.core.checkpoint import Pieces

    made: list[str] = []

    def piece(key: str):
        def make():
            made.append(key)
            return {"v": torch.full((3,), float(key))}

        return make

    folder = write_checkpoint(
        tmp_path, 4, {"config": {"a": 1}, "parties": Pieces({k: piece(k) for k in "0129"})}
    )
    assert made == ["0", "1", "2", "9"]
    assert sorted(p.name for p in (folder / "parties").iterdir()) == ["0.fmc", "1.fmc", "2.fmc", "9.fmc"]
    parties = read_checkpoint(tmp_path, 4, ("config", "parties"))["parties"]
    assert list(parties) == ["0", "1", "2", "9"] and torch.equal(parties["9"]["v"], torch.full((3,), 9.0))
    (folder / "parties" / "1.fmc").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match=r"parties/1.fmc is not a readable checkpoint"):
        parties["1"]
