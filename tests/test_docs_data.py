"""The data how-to's and the network how-to's commands (docs/how-to/data.md,
docs/how-to/your-network.md) as a user types them, from a folder holding the repository's config/
and examples/, one tiny round each (tests/support/doc_runs.py)."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from tests.support import ROOT
from tests.support.cli import restored_main
from tests.support.doc_commands import (
    NETWORK_RUNS,
    NETWORK_WRITE,
    SITE_INSPECT,
    SITE_RUNS,
    SITE_TABLES,
    SITE_WRITE,
)
from tests.support.doc_runs import completed, entry_point
from tests.support.marks import needs_fmnist


@needs_fmnist
@pytest.mark.slow
def test_site_data_commands(tmp_path, home, capsys, monkeypatch):
    """The data how-to as a user types it, from a folder with the repository's config/ and examples/:
    the example data written, inspected and each shipped site config run (one tiny round; the
    folders' own parties and sizes kept)."""
    for name in ("config", "examples", ".venv"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(home))
    words = shlex.split(SITE_WRITE)
    subprocess.run(words, cwd=tmp_path, check=True, timeout=300, capture_output=True)
    assert {p.name for p in (tmp_path / "data" / "site").iterdir()} >= {"folder", "parties", "csv", "hf"}
    tiny = ["train_args.comm_round=1", "train_args.epochs=1", "device_args.torch_threads=1"]
    with restored_main() as main:
        for command in SITE_INSPECT:
            capsys.readouterr()
            assert main(entry_point(command)) == 0, capsys.readouterr().out
            said = capsys.readouterr().out
            assert "problems: none" in said and ("--cf" not in command or "\n  passed\n" in said), said
        for i, command in enumerate([*SITE_RUNS, *SITE_TABLES]):
            out = tmp_path / f"run-{i}"
            sets = [a for s in tiny for a in ("--set", s)]
            assert main([*entry_point(command), *sets, "--output-dir", str(out)]) == 0, command
            completed(out, 1)


@needs_fmnist
@pytest.mark.slow
def test_network_commands(tmp_path, home, capsys, monkeypatch):
    """The network how-to as a user types it, from a folder with the repository's config/ and
    examples/: the RGB folders written, then each run (one tiny round), in order: the last starts
    from the model the one before it wrote, and says so."""
    pytest.importorskip("timm")
    for name in ("config", "examples", ".venv"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(home))
    subprocess.run(shlex.split(NETWORK_WRITE), cwd=tmp_path, check=True, timeout=300, capture_output=True)
    assert len(list((tmp_path / "data" / "site" / "rgb").iterdir())) == 3
    tiny = ["train_args.comm_round=1", "train_args.epochs=1", "device_args.torch_threads=1"]
    with restored_main() as main:
        for i, command in enumerate(NETWORK_RUNS):
            out = tmp_path / ("outputs/resnet18" if "--output-dir" in command else f"run-{i}")
            own = [] if "--output-dir" in command else ["--output-dir", str(out)]
            capsys.readouterr()
            args = [*entry_point(command), *(a for t in tiny for a in ("--set", t)), *own]
            assert main(args) == 0, command
            completed(out, 1)
    said = capsys.readouterr()
    loaded = "model_args.pretrained: 126 of 126 tensors loaded from outputs/resnet18/final_model.pt"
    assert loaded in said.err + said.out
