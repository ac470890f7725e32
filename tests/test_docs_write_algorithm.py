"""The contributor tutorial's commands (docs/tutorials/write-algorithm.md): `fedml-moon new` then
`check` as written in a folder of their own, and the finished FedProto (examples/fedproto) checked
and run at tiny scale (tests/support/doc_runs.py)."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from tests.support import ROOT
from tests.support.doc_runs import completed, entry_point, shell_env, tiny_sets
from tests.support.doc_table import COMMANDS
from tests.support.marks import needs_fmnist


@needs_fmnist
@pytest.mark.slow
def test_the_package_fedml_moon_new_writes_passes_check_in_every_mode(tmp_path, home):
    """The tutorial's first two commands as written, in a folder of their own (its `.venv` this
    repository's): `new` writes ./fedproto, and `check` passes it without installing, every mode."""
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    commands = [c for c, kind in COMMANDS.items() if kind == "tutorial-new"]
    assert [shlex.split(c)[1] for c in commands] == ["new", "check"]
    outputs = []
    for command in commands:
        done = subprocess.run(
            shlex.split(command),
            cwd=tmp_path,
            env=shell_env(home),
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        outputs.append(done.stdout)
    assert (tmp_path / "fedproto" / "fedml_moon_fedproto" / "__init__.py").is_file()
    assert "fedproto: 22 of 22 checks passed" in outputs[1], outputs[1]


@needs_fmnist
@pytest.mark.slow
def test_the_tutorials_fedproto_runs_and_passes_check(tmp_path, root_cli, capsys):
    """The finished FedProto (examples/fedproto): its standalone checks, and a run."""
    check, run = [c for c, kind in COMMANDS.items() if kind == "tutorial"]
    assert root_cli(entry_point(check)) == 0
    out = capsys.readouterr().out
    assert "fedproto: 14 of 14 checks passed" in out, out
    assert root_cli([*entry_point(run), *tiny_sets(run), "--output-dir", str(tmp_path / "fedproto")]) == 0
    summary = completed(tmp_path / "fedproto", 2)
    assert summary["config"]["train_args"]["algorithm"] == "fedproto"
    assert summary["config"]["common_args"]["plugins"] == ["fedml_moon_fedproto:spec"]
