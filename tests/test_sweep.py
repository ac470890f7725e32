"""Sweeps through the command line: a 2 x 2 grid of tiny Fashion-MNIST runs stopped mid-way and run
again ends with exactly 4 completed runs, none run twice (the stopped one continues from its
checkpoint); `--list` prints commands that, run by hand, give the same results; bad sweep files are
refused before anything runs."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from tests.support.sweeps import TINY_GRID

ROOT = Path(__file__).resolve().parent.parent
FEDML_MOON = [sys.executable, "-m", "fedml_moon"]
needs_fmnist = pytest.mark.skipif(
    not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist"
)


def _sweep_file(tmp_path: Path, rounds: int = 4) -> tuple[Path, Path]:
    out = tmp_path / "out"
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_GRID.format(root=ROOT, out=out, rounds=rounds))
    return path, out


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}


def _status(folder: Path) -> str | None:
    path = folder / "summary.json"
    return json.loads(path.read_text())["status"] if path.is_file() else None


def _results(folder: Path) -> list[dict]:
    timing = ("round_time_s",)
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in timing} for line in lines]


@pytest.mark.slow
def test_a_bad_sweep_file_is_refused_naming_the_run_and_key(tmp_path):
    path, out = _sweep_file(tmp_path)
    path.write_text(path.read_text().replace("train_args.epochs: 1", "train_args.epochs: two"))
    done = subprocess.run(
        [*FEDML_MOON, "sweep", str(path)], capture_output=True, text=True, env=_env(tmp_path)
    )
    assert done.returncode == 2
    assert "sweep run algorithm=moon,random_seed=0: train_args.epochs: must be an integer" in done.stderr
    assert not out.exists()


@needs_fmnist
@pytest.mark.slow
def test_a_stopped_sweep_run_again_completes_each_run_exactly_once_and_its_list_reproduces(tmp_path):
    path, out = _sweep_file(tmp_path)
    listed = subprocess.run(
        [*FEDML_MOON, "sweep", str(path), "--list"], env=_env(tmp_path), capture_output=True, text=True
    ).stdout.splitlines()
    assert len(listed) == 4 and all(line.startswith("fedml-moon simulate --cf ") for line in listed)
    assert not out.exists()  # --list runs nothing
    sweep = subprocess.Popen(
        [*FEDML_MOON, "sweep", str(path)], env=_env(tmp_path), stderr=subprocess.PIPE, start_new_session=True
    )
    first, second = out / "algorithm=moon,random_seed=0", out / "algorithm=moon,random_seed=1"
    deadline = time.monotonic() + 240
    try:  # stop it while the second run is between checkpoints 1 and the end
        while not ((second / "checkpoint" / "LATEST").is_file() and _status(first) == "completed"):
            assert sweep.poll() is None and time.monotonic() < deadline, "the sweep ended or stalled"
            time.sleep(0.2)
        sweep.send_signal(signal.SIGTERM)
        assert sweep.wait(timeout=60) == 143
    finally:
        if sweep.poll() is None:
            os.killpg(sweep.pid, signal.SIGKILL)
    assert _status(second) != "completed"
    again = subprocess.run(
        [*FEDML_MOON, "sweep", str(path)], env=_env(tmp_path), capture_output=True, text=True
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert "4 runs, 1 complete before, 3 completed now, 0 failed" in again.stderr
    folders = sorted(p for p in out.iterdir() if p.is_dir())
    assert [p.name for p in folders] == sorted(
        f"algorithm={a},random_seed={s}" for a in ("moon", "fedavg") for s in (0, 1)
    )
    for folder in folders:
        assert _status(folder) == "completed"
        starts = sum(line.startswith("$ ") for line in (folder / "run.log").read_text().splitlines())
        assert starts == (2 if folder == second else 1), folder.name  # the stopped run continued once
        assert [r["round"] for r in _results(folder)] == list(range(4))  # every round exactly once
    assert "--resume" in (second / "run.log").read_text()
    argv = shlex.split(listed[2])  # fedavg, seed 0, run by hand elsewhere: the sweep's results
    by_hand = tmp_path / "by_hand"
    argv[argv.index("--output-dir") + 1] = str(by_hand)
    assert subprocess.run([*FEDML_MOON, *argv[1:]], env=_env(tmp_path), capture_output=True).returncode == 0
    assert _results(by_hand) == _results(out / "algorithm=fedavg,random_seed=0")


SHIPPED = {
    "fashion_mnist": 36,
    "fashion_mnist_lg": 6,
    "fashion_mnist_dp": 18,
    "fashion_mnist_precision": 12,
    "fashion_mnist_stragglers": 15,
    "moon_table1": 45,
    "moon_local_epochs": 60,
    "moon_parties_50": 15,
    "moon_parties_100": 15,
    "moon_beta": 45,
    "moon_loss": 72,
    "moon_mu": 45,
    "moon_pool": 48,
    "fedssc_table1": 9,
    "lg_table1": 6,
}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_shipped_sweep_loads_with_every_run_config_valid(name):
    from fedml_moon.results.sweep import load_sweep

    runs = load_sweep(ROOT / "config" / "sweeps" / f"{name}.yaml")
    assert len(runs) == SHIPPED[name]
    assert sorted(p.stem for p in (ROOT / "config" / "sweeps").glob("*.yaml")) == sorted(SHIPPED)


def test_a_method_sets_several_keys_and_a_bare_key_only_names_the_config():
    from fedml_moon.results.sweep import load_sweep

    runs = load_sweep(ROOT / "config" / "sweeps" / "moon_loss.yaml")
    run = runs[3]  # cifar10, l2 with mu 0.001, seed 0
    assert run.name == "dataset=cifar10,method=algorithm-moon_representation_loss-l2_mu-0.001,random_seed=0"
    assert run.config == ROOT / "config" / "paper" / "cifar10_moon.yaml"
    assert run.overrides == (
        "train_args.algorithm=moon",
        "algorithm_args.representation_loss=l2",
        "algorithm_args.mu=0.001",
        "common_args.random_seed=0",
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("slurm", "words", "on"),
    [
        ("{time: soon}", "slurm.time: write minutes, HH:MM:SS or D-HH:MM:SS; got 'soon'", "slurm"),
        ("{sbatch: [-C a100]}", "slurm.sbatch: write each option in its long form", "local"),
        ("{gpu_per_run: 1}", "slurm.gpu_per_run: unknown key; did you mean 'gpus_per_run'?", None),
        ("{cpus_per_run: 0}", "slurm.cpus_per_run: must be >= 1", "slurm"),
        ("{sbatch: [--job-name=mine]}", "--job-name=mine': the sweep sets it", "slurm"),
        ("{sbatch: [--time=5]}", "give it as slurm.time (or --time)", "slurm"),
        ("{time: 1}", "slurm.signal_delay_s: 120 s is more than half the time limit", "slurm"),
    ],
)
def test_a_wrong_slurm_resource_is_refused_before_anything_runs(tmp_path, slurm, words, on):
    path, out = _sweep_file(tmp_path)
    path.write_text(path.read_text() + f"slurm: {slurm}\n")
    for extra in [["--on", on] if on else []]:
        done = subprocess.run(
            [*FEDML_MOON, "sweep", str(path), *extra], capture_output=True, text=True, env=_env(tmp_path)
        )
        assert done.returncode == 2 and words in done.stderr, done.stderr[-1000:]
    assert not out.exists()


@pytest.mark.slow
def test_slurm_asked_where_it_is_not_installed_says_so_and_submits_nothing(tmp_path):
    path, out = _sweep_file(tmp_path)
    env = {**_env(tmp_path), "PATH": str(Path(sys.executable).parent)}  # python, no sbatch, no srun
    done = subprocess.run(
        [*FEDML_MOON, "sweep", str(path), "--on", "slurm"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 2 and "sbatch and srun must be on PATH" in done.stderr, done.stderr[-1000:]
    assert not (out / "jobs.json").exists() and not list(out.glob("*/run.log"))


@pytest.mark.slow
def test_wait_without_a_scheduler_is_refused(tmp_path):
    path, out = _sweep_file(tmp_path)
    done = subprocess.run(
        [*FEDML_MOON, "sweep", str(path), "--wait"], capture_output=True, text=True, env=_env(tmp_path)
    )
    assert done.returncode == 2 and "--wait follows the jobs of --on slurm" in done.stderr
    assert not out.exists()


@pytest.mark.parametrize("scheduler_says", [None, ("ended", "COMPLETED")])
def test_a_job_between_its_two_starts_is_queued_until_submitit_writes_its_result(tmp_path, scheduler_says):
    """A job that stopped its run to requeue is queued while the scheduler passes it from one start
    to the next (out of its queue for a moment, or in an ended state): a sweep waiting on it must
    not call it failed. Once submitit writes its result (no requeue: out of requeues), or
    REQUEUE_S after it stopped the run, it is failed, saying why."""
    from fedml_moon.results import jobs
    from fedml_moon.results.sweep import Run

    run = Run("algorithm=moon", tmp_path / "algorithm=moon", tmp_path / "moon.yaml", ())
    run.folder.mkdir()
    submitted = tmp_path / ".submitit" / "b1"
    submitted.mkdir(parents=True)
    record = {"batches": {}, "runs": {}}
    jobs.begin(record, "b1", "slurm", [run], "sweep", submitted)
    jobs.assign(record, "b1", ["7_0"])
    (run.folder / "job.json").write_text(json.dumps({"batch": "b1", "job": "7_0", "state": "requeued"}))
    known = {} if scheduler_says is None else {"7_0": ("sweep", jobs.Job(*scheduler_says))}

    assert jobs.state_of(run, record, known) == jobs.RunState("queued", "7_0", "being requeued")
    (submitted / "7_0_0_result.pkl").write_bytes(b"")
    failed = jobs.state_of(run, record, known)
    assert failed.state == "failed" and failed.detail.startswith("out of time more often than")
    (submitted / "7_0_0_result.pkl").unlink()
    old = time.time() - jobs.REQUEUE_S - 1
    os.utime(run.folder / "job.json", (old, old))
    assert jobs.state_of(run, record, known).state == "failed"


def test_a_job_id_listed_twice_by_squeue_counts_as_its_live_entry():
    """squeue may list a requeued array task's id twice (the ended start and the waiting one): the
    job is queued, in either order; an id listed once keeps its own state."""
    from fedml_moon.results import jobs

    lines = ["7_0|sweep|CANCELLED|None", "7_0|sweep|PENDING|BeginTime", "7_1|sweep|COMPLETED|None"]
    for order in (lines, lines[::-1]):
        known = jobs.parse_squeue("\n".join(order) + "\n")
        assert known["7_0"] == ("sweep", jobs.Job("queued", "PENDING (BeginTime)"))
        assert known["7_1"][1].phase == "ended"
