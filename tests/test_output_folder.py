"""A new run never writes over an earlier run's records: through the real command line, a second
run into the same folder (the standalone simulation, a distributed run's server) is refused naming
the folder and the ways on, with every file as it was; `--overwrite` replaces the records, `--resume`
goes on with them, and a sweep starts again only the runs that failed before a checkpoint."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from fedml_moon import conformance
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from fedml_moon.records.folder import earlier_records
from fedml_moon.results.sweep import Run
from tests.support.cli import restored_main

pytestmark = pytest.mark.skipif(
    not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist"
)
ROOT = Path(__file__).resolve().parent.parent
FEDAVG = ROOT / "config" / "fashion_mnist" / "fedavg.yaml"
TINY = [*conformance.TINY, "data_args.max_train_samples=300", "data_args.max_test_samples=100"]


def _argv(out: Path, *extra: str, rounds: int = 1) -> list[str]:
    argv = ["simulate", "--cf", str(FEDAVG), "--output-dir", str(out), *extra]
    for item in [*TINY, f"train_args.comm_round={rounds}"]:
        argv += ["--set", item]
    return argv


def _files(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_a_second_run_into_a_folder_is_refused_and_overwrite_replaces(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    out = tmp_path / "run"
    with restored_main() as main:
        assert main([*_argv(out, rounds=2), "--set", "tracking_args.plots=true"]) == 0
        assert (out / "partition.png").is_file() and (out / "accuracy.png").is_file()
        before = _files(out)
        assert earlier_records(out) == ["metrics.jsonl", "summary.json", "final_model.pt", "checkpoint/"]
        capsys.readouterr()
        assert main(_argv(out)) == 2
        said = capsys.readouterr().err
        assert f"--output-dir {out} holds an earlier run's records (metrics.jsonl, summary.json" in said
        assert f"--resume {out}" in said and "another --output-dir" in said and "--overwrite" in said
        assert _files(out) == before  # nothing of it touched
        assert main([*_argv(out), "--resume", str(out), "--overwrite"]) == 2
        assert "give one" in capsys.readouterr().err
        assert main([*_argv(out), "--overwrite"]) == 0
    records = (out / "metrics.jsonl").read_text().splitlines()
    assert len(records) == 1  # the new run's one round, not the earlier run's two
    assert not list(out.glob("*.png"))  # drawing none (tracking_args.plots: false), it left none
    assert sorted(p.name for p in (out / "checkpoint").iterdir() if p.name.startswith("round-")) == [
        "round-0"
    ]


def test_a_distributed_runs_server_refuses_the_folder_before_it_listens(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "summary.json").write_text('{"status": "failed"}')
    ipconfig = conformance.write_ipconfig(tmp_path / "ip.csv", 3, conformance.free_port())
    sets = [*TINY, "common_args.training_type=cross_silo", "comm_args.backend=GRPC"]
    sets.append(f"comm_args.grpc_ipconfig_path={ipconfig}")
    argv = ["run", "--cf", str(FEDAVG), "--rank", "0", "--output-dir", str(out)]
    with restored_main() as main:
        assert main([*argv, *(a for s in sets for a in ("--set", s))]) == 2
    assert "holds an earlier run's records (summary.json)" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["summary.json"]


def test_a_sweep_starts_again_only_a_run_that_failed_before_a_checkpoint(tmp_path):
    run = Run("a", tmp_path / "a", FEDAVG, ())
    assert "--overwrite" not in run.argv(["fedml-moon"])  # never run
    run.folder.mkdir()
    (run.folder / "summary.json").write_text('{"status": "failed"}')
    assert run.argv(["fedml-moon"])[-3:] == ["--output-dir", str(run.folder), "--overwrite"]
    (run.folder / "checkpoint").mkdir()
    (run.folder / "checkpoint" / "LATEST").write_text("3")
    assert run.argv(["fedml-moon"])[-2:] == ["--resume", str(run.folder)]


def _cli(tmp_path: Path, out: Path, sets: list[str], *extra: str) -> int:
    """The real command line: exit code (W&B's own process ends with it)."""
    import subprocess

    cmd = [*conformance.cli_command("simulate", MOON, sets, out), *extra]
    env = conformance.process_env(tmp_path)
    return subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, timeout=300).returncode


MOON = ROOT / "config" / "fashion_mnist" / "moon.yaml"


@pytest.mark.slow
def test_overwrite_keeps_the_new_runs_wandb_files_and_none_of_the_earlier_runs_party_states(tmp_path):
    """W&B offline writes this run's files into wandb/ before its first record, when --overwrite
    removes the earlier run's: the earlier run's go, this run's stay and it exits 0. MOON's party
    states on disk from the earlier run are not this run's: it ends on a fresh folder's model."""
    import torch

    sets = [*TINY, "train_args.comm_round=2", "train_args.state_store=disk"]
    sets += ["tracking_args.enable_wandb=true", "tracking_args.wandb_mode=offline"]
    out, fresh = tmp_path / "run", tmp_path / "fresh"
    assert _cli(tmp_path, out, [*sets, "common_args.random_seed=1"]) == 0
    earlier = {p.name for p in (out / "wandb").glob("offline-run-*")}
    assert len(earlier) == 1 and list((out / "party_state").glob("party_*.pt"))
    assert _cli(tmp_path, out, sets, "--overwrite") == 0
    now = {p.name for p in (out / "wandb").glob("offline-run-*")}
    assert len(now) == 1 and not now & earlier
    assert _cli(tmp_path, fresh, sets) == 0
    a = torch.load(out / "final_model.pt", weights_only=True)
    b = torch.load(fresh / "final_model.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in b)


@pytest.mark.slow
def test_a_run_a_live_process_writes_is_not_started_again_in_its_folder(tmp_path):
    """The folder's run lock: while one process runs the run, a second one given the folder (to go
    on with it, or to replace it) is refused and changes nothing; once the first has ended (here by
    SIGKILL: the kernel lets go of the lock), the run goes on: resumed, it records the rounds after
    the checkpoint, each once (it is stopped two rounds on: the rest of its 200 rounds is the same)."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    env = {**os.environ, "HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    base = [
        sys.executable,
        "-m",
        "fedml_moon",
        *_argv(out, "--set", "train_args.checkpoint_every=1", rounds=200),
    ]
    first = subprocess.Popen(base, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    at = base.index("--output-dir")
    elsewhere = base[:at] + base[at + 2 :]  # the same run, its folder given by the option below
    try:
        deadline = time.monotonic() + 120
        while not (out / "checkpoint" / "LATEST").is_file():
            assert first.poll() is None and time.monotonic() < deadline, "the first run ended or stalled"
            time.sleep(0.2)
        for extra in (["--resume", str(out)], ["--output-dir", str(out), "--overwrite"]):
            done = subprocess.run([*elsewhere, *extra], env=env, capture_output=True, text=True, timeout=120)
            assert done.returncode == 2, done.stderr[-2000:]
            assert "another process is running this run now" in done.stderr
        assert first.poll() is None  # untouched by the refusals
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()

    def rounds() -> list[int]:  # the records written whole (a process killed may leave half a line)
        return [json.loads(line)["round"] for line in (out / "metrics.jsonl").read_text().split("\n")[:-1]]

    before = len(rounds())
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    again = subprocess.Popen([*elsewhere, "--resume", str(out)], env=env, **quiet)
    try:
        deadline = time.monotonic() + 120
        while len(rounds()) < before + 2:
            assert again.poll() is None and time.monotonic() < deadline, "the resumed run ended or stalled"
            time.sleep(0.2)
    finally:
        again.send_signal(signal.SIGKILL)
        again.wait()
    assert rounds() == list(range(len(rounds())))  # from its checkpoint on, each round once
