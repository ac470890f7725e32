"""Subcommands through the real entry point, `fedml_moon.cli.main`: every one takes -v, `certs` writes
its files, `sweep --set` reaches every run of a sweep; `run/mpirun.sh` adds the flags mpirun needs
and counts a cross-silo run's ranks."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedml_moon.cli import build_parser
from fedml_moon.cli.train import mpi_ranks
from fedml_moon.config.load import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def test_help_imports_no_commands_module_and_a_commands_help_its_own(monkeypatch, capsys):
    from fedml_moon.cli import main

    def commands() -> list[str]:
        return sorted(
            m for m in sys.modules if m.startswith("fedml_moon.cli.") and m != "fedml_moon.cli.common"
        )

    for name in commands():
        monkeypatch.delitem(sys.modules, name)  # put back after the test
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "replay" in capsys.readouterr().out and commands() == []  # every command listed, none imported
    with pytest.raises(SystemExit):
        main(["status", "--help"])
    assert "--watch" in capsys.readouterr().out and commands() == ["fedml_moon.cli.status"]


def test_every_subcommand_takes_verbose():
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(sub.choices) == {
        "simulate",
        "run",
        "certs",
        "check",
        "new",
        "config",
        "data",
        "sweep",
        "status",
        "report",
        "replay",
        "tsne",
    }
    for name, command in sub.choices.items():
        assert any(a.option_strings == ["-v", "--verbose"] for a in command._actions), name


def test_certs_through_main(cli, tmp_path):
    folder = tmp_path / "certs"
    assert cli(["certs", str(folder), "--silos", "2", "--host", "127.0.0.1", "-v"]) == 0
    names = {p.name for p in folder.iterdir()}
    assert {"ca.pem", "server.pem", "server.key", "silo-1.pem", "silo-2.key", "silo-2.token"} <= names
    assert "server-tokens.json" in names


def test_certs_refuses_a_folder_that_holds_credentials_unless_forced(cli, tmp_path, capsys):
    """Following the tutorials in order writes `certs` twice: the second call names what the folder
    holds and changes nothing of it; with --force it replaces the CA (the old one's files differ)."""
    folder = tmp_path / "certs"
    assert cli(["certs", str(folder), "--silos", "2"]) == 0
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    capsys.readouterr()
    assert cli(["certs", str(folder), "--silos", "3"]) == 2
    said = capsys.readouterr().err
    assert "holds credentials already (ca.key, ca.pem, mosquitto.acl, operator.token" in said
    assert "--force to replace them" in said
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # not a file touched
    assert cli(["certs", str(folder), "--silos", "3", "--force"]) == 0
    after = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert after["ca.pem"] != before["ca.pem"] and "silo-3.token" in after
    assert cli(["certs", str(tmp_path / "empty-before"), "--silos", "1"]) == 0  # a new folder is fine
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "README").write_text("not credentials\n")
    assert cli(["certs", str(tmp_path / "notes"), "--silos", "1"]) == 0  # nor one without credentials


@pytest.mark.slow
def test_certs_are_never_added_to_a_repository(cli, tmp_path):
    """`git add -A` in a repository holding the command's folder (anywhere in it) adds no key."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "README").write_text("a project\n")
    assert cli(["certs", str(tmp_path / "deploy" / "keys"), "--silos", "2"]) == 0
    subprocess.run(["git", "-C", str(tmp_path), "add", "-A"], check=True)
    staged = subprocess.run(
        ["git", "-C", str(tmp_path), "diff", "--cached", "--name-only"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert staged == ["README"]
    assert (tmp_path / "deploy" / "keys" / "silo-2.key").is_file()


def test_sweep_set_applies_to_every_run(cli, tmp_path, capsys):
    sweep = str(ROOT / "config/sweeps/fashion_mnist_lg.yaml")
    argv = ["sweep", sweep, "--list", "--output", str(tmp_path), "--set", "train_args.comm_round=2"]
    assert cli([*argv, "--set", "data_args.max_train_samples=1000"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 6
    for line in lines:  # after the file's own `set`, so they win
        assert "--set train_args.comm_round=2 --set data_args.max_train_samples=1000" in line
        assert line.index("tracking_args.enable_wandb=false") < line.index("train_args.comm_round=2")
    # a key of the grid cannot be set for every run
    assert cli([*argv, "--set", "common_args.random_seed=4"]) == 2
    assert "the sweep's grid sets it" in capsys.readouterr().err


def _mpirun_sh(tmp_path: Path, *args: str) -> list[str]:
    """What run/mpirun.sh hands mpirun (a stand-in mpirun that prints its arguments)."""
    fake = tmp_path / "bin" / "mpirun"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text('#!/bin/sh\necho "$@"\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    proc = subprocess.run(
        ["bash", "run/mpirun.sh", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


@pytest.mark.slow
def test_mpirun_script_adds_root_and_oversubscribe_flags(tmp_path):
    program = str(ROOT / ".venv/bin/fedml-moon")
    few = _mpirun_sh(tmp_path, "1", "simulate", "--cf", "x.yaml")
    assert ("--allow-run-as-root" in few) == (os.geteuid() == 0)
    assert "--oversubscribe" not in few  # 1 rank fits any machine
    assert few[few.index("-np") :] == ["-np", "1", program, "simulate", "--cf", "x.yaml"]
    many = _mpirun_sh(tmp_path, "1000", "run", "--cf", "x.yaml", "--set", "a.b=c")
    assert "--oversubscribe" in many
    assert many[many.index("-np") :] == ["-np", "1000", program, "run", "--cf", "x.yaml", "--set", "a.b=c"]
    hosts = "config/modes/mpi_hostfile"
    spread = _mpirun_sh(tmp_path, "--hostfile", hosts, "3", "simulate", "--cf", "x.yaml")
    assert spread[spread.index("--hostfile") :] == ["--hostfile", hosts, "-np", "3", program, "simulate",
                                                    "--cf", "x.yaml"]  # fmt: skip
    missing = subprocess.run(["bash", "run/mpirun.sh", "--hostfile", "no-such-file", "run"], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert missing.returncode == 2 and "--hostfile needs an existing file" in missing.stderr


def test_mpi_ranks_of_a_cross_silo_run():
    config = str(ROOT / "config/modes/moon_cross_silo_mpi.yaml")
    assert mpi_ranks(["run", "--cf", config]) == 11
    sets = ["--set", "train_args.client_num_in_total=4", "--set", "train_args.client_num_per_round=2"]
    assert mpi_ranks(["run", "--cf", config, *sets]) == 5
    with pytest.raises(ConfigError, match="give the number of ranks"):
        mpi_ranks(["simulate", "--cf", str(ROOT / "config/modes/moon_mpi_simulation.yaml")])
    with pytest.raises(ConfigError, match="does not run under mpirun"):
        mpi_ranks(["run", "--cf", str(ROOT / "config/modes/moon_cross_silo_grpc.yaml")])


def test_the_command_ends_a_silo_groups_process_at_once(monkeypatch):
    """The installed `fedml-moon` and `python -m fedml_moon` go through `cli.entry`: a process that was
    part of a silo's group ends with os._exit(main's code), before the interpreter's exit can meet
    gloo's threads; any other process exits as usual, with main's code."""
    from importlib.metadata import entry_points

    from fedml_moon import cli
    from fedml_moon.distributed.silo import group as silo_group

    (command,) = [e for e in entry_points(group="console_scripts") if e.name == "fedml-moon"]
    assert command.value == "fedml_moon.cli:entry"
    assert "entry()" in (ROOT / "fedml_moon" / "__main__.py").read_text()
    exits: list[int] = []

    def _exit(code: int) -> None:
        exits.append(code)
        raise SystemExit(code)

    monkeypatch.setattr(cli, "main", lambda argv=None: 3)
    monkeypatch.setattr(silo_group.os, "_exit", _exit)
    with pytest.raises(SystemExit) as ended:
        cli.entry()
    assert ended.value.code == 3 and exits == []
    monkeypatch.setattr(silo_group, "_left", True)
    with pytest.raises(SystemExit):
        cli.entry()
    assert exits == [3]
