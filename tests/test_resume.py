"""Nothing lost: a run killed with SIGKILL at a random moment and resumed with --resume ends with the
same final model and the same metrics.jsonl (timings aside) as a run never interrupted. Checkpoints
are written atomically and read without pickle; another config is refused with its keys named, before
anything of the run is touched. (In-process stops and resumes of each algorithm:
tests/test_resume_algorithms.py; a checkpoint write dying at each step: tests/test_checkpoint.py.)"""

from __future__ import annotations

import pickle
import random
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from fedml_moon import conformance
from fedml_moon.config.load import ConfigError, load_config
from fedml_moon.core import checkpoint
from fedml_moon.core.checkpoint import CheckpointError, read_checkpoint, write_checkpoint
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from fedml_moon.engine.resume import check_config, flat_config
from tests.support.records import assert_curves_are_the_records
from tests.support.resume import assert_same_run, kill_when

ROOT = Path(__file__).resolve().parent.parent
FEDSSC = ROOT / "config" / "fashion_mnist" / "fedssc.yaml"
needs_fmnist = pytest.mark.skipif(
    not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist"
)
RUN = [
    *conformance.TINY,
    "train_args.client_num_in_total=4",
    "train_args.client_num_per_round=3",
    "train_args.comm_round=6",
    "train_args.checkpoint_every=1",
    "validation_args.frequency_of_the_test=2",
]


@needs_fmnist
@pytest.mark.slow
def test_standalone_killed_at_a_random_moment_and_resumed_is_the_same_run(tmp_path):
    ref = conformance.run_mode("standalone", FEDSSC, [*RUN, "train_args.state_store=disk"], tmp_path / "ref")
    assert ref.ok, ref.tail()
    rng = random.Random()
    out, env = tmp_path / "killed", conformance.process_env(tmp_path)
    cmd = conformance.cli_command("simulate", FEDSSC, [*RUN, "train_args.state_store=disk"], out)
    proc = conformance.spawn(cmd, tmp_path / "first.log", env, tmp_path)
    kill_when(proc, out, rng.randint(1, 4), rng.uniform(0.0, 1.5))
    resume = [
        *conformance.cli_command("simulate", FEDSSC, [*RUN, "train_args.state_store=disk"], out),
        "--resume",
        str(out),
    ]
    again = conformance.spawn(resume, tmp_path / "resume.log", env, tmp_path)
    assert conformance.wait_all([again], 300) == [0], (tmp_path / "resume.log").read_text()[-3000:]
    assert "resuming after the checkpoint of round" in (tmp_path / "resume.log").read_text()
    assert_same_run(ref.out_dir, out)


@needs_fmnist
@pytest.mark.slow
def test_mpi_simulation_killed_and_resumed_is_the_same_run(tmp_path):
    """With the memory store: the workers' party states live only in their checkpoints. TensorBoard's
    curves, written by the server in both modes, are metrics.jsonl's, the resumed one's included."""
    memory = [*RUN, "train_args.state_store=memory", "tracking_args.tensorboard=true"]
    ref = conformance.run_mode("standalone", FEDSSC, memory, tmp_path / "ref")
    assert ref.ok, ref.tail()
    out, env = tmp_path / "killed", conformance.process_env(tmp_path)
    sim = [*memory, "comm_args.backend=MPI", "comm_args.timeout_s=60"]
    cmd = conformance.mpirun_command(3, conformance.cli_command("simulate", FEDSSC, sim, out))
    proc = conformance.spawn(cmd, tmp_path / "first.log", env, tmp_path)
    kill_when(proc, out, 3, random.uniform(0.0, 1.0))
    resume = conformance.mpirun_command(
        3, [*conformance.cli_command("simulate", FEDSSC, sim, out), "--resume", str(out)]
    )
    again = conformance.spawn(resume, tmp_path / "resume.log", env, tmp_path)
    assert conformance.wait_all([again], 300) == [0], (tmp_path / "resume.log").read_text()[-3000:]
    assert_same_run(ref.out_dir, out)
    _assert_one_layout(ref.out_dir, out, 5)
    for run in (ref.out_dir, out):
        assert_curves_are_the_records(run)


def _leaves(tree, prefix=""):
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in _leaves(sub, f"{prefix}/{key}").items()}
    if isinstance(tree, list):
        return {k: v for i, sub in enumerate(tree) for k, v in _leaves(sub, f"{prefix}/{i}").items()}
    return {prefix: tree}


def _same(a, b) -> bool:
    a, b = _leaves(a), _leaves(b)
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a
    )


def _assert_one_layout(standalone: Path, distributed: Path, round_idx: int) -> None:
    """One checkpoint layout in every mode: the standalone process holds every part in one folder;
    the distributed server its config and server parts, each worker its config and its own parties,
    and together they are the standalone checkpoint of the same round (timings and wire bytes aside)."""
    whole = read_checkpoint(standalone / "checkpoint", round_idx, ("config", "server", "parties"))
    server = read_checkpoint(distributed / "checkpoint", round_idx, ("config", "server"))
    parties: dict = {}
    for rank in (1, 2):
        root = distributed / f"rank-{rank}" / "checkpoint"
        assert not (root / f"round-{round_idx}" / "server.fmc").exists()
        parties.update(dict(read_checkpoint(root, round_idx, ("config", "parties"))["parties"]))
    assert not (distributed / "checkpoint" / f"round-{round_idx}" / "parties").exists()
    assert _same(dict(whole["parties"]), parties)  # one file per party: parties/<id>.fmc
    for key in ("round", "global", "algorithm", "totals", "schedule"):
        assert _same(whole["server"][key], server["server"][key]), key
    free = ("comm_args.", "device_args.", "tracking_args.")
    differ = {k for k in whole["config"] if whole["config"][k] != server["config"].get(k)}
    assert differ and all(k.startswith(free) for k in differ)  # the same run, another transport


def test_another_config_is_refused_with_the_keys_named(tmp_path):
    cfg = load_config(FEDSSC, ["train_args.learning_rate=0.05"])
    saved = flat_config(load_config(FEDSSC))
    check_config(
        saved,
        load_config(FEDSSC, ["tracking_args.enable_wandb=false", "device_args.torch_threads=1"]),
        tmp_path,
    )
    with pytest.raises(ConfigError, match=r"train_args.learning_rate \(0.01 in the checkpoint, 0.05 now\)"):
        check_config(saved, cfg, tmp_path)
    with pytest.raises(ConfigError, match="comm_args.backend"):
        check_config(saved, load_config(FEDSSC, ["comm_args.backend=MPI"]), tmp_path)
    with pytest.raises(ConfigError, match="this worker's checkpoint in .* restart the server") as refused:
        check_config(saved, cfg, tmp_path, only=["train_args.learning_rate"])  # a worker's: shared keys
    assert "--resume" not in str(refused.value)


def test_a_checkpoint_older_than_a_setting_resumes_when_the_setting_is_at_its_default(tmp_path):
    """A key added after the checkpoint was written computes what the run computed at its default;
    any other value of it is a change, named."""
    older = {
        k: v for k, v in flat_config(load_config(FEDSSC)).items() if k != "server_args.robust_aggregation"
    }
    check_config(older, load_config(FEDSSC), tmp_path)
    with pytest.raises(
        ConfigError, match=r"server_args.robust_aggregation \(None in the checkpoint, 'median' now\)"
    ):
        median = ["server_args.robust_aggregation=median", "algorithm_args.prototype_mode=mean"]
        check_config(older, load_config(FEDSSC, median), tmp_path)


@needs_fmnist
def test_a_refused_resume_changes_nothing_in_the_run_folder(tmp_path, monkeypatch):
    """Another config is refused (exit 2, the key named) before anything is built: the finished run's
    records, summary and partition stay byte for byte, and no W&B run starts."""
    from fedml_moon import cli

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    out = tmp_path / "run"
    tiny = [*conformance.TINY, "train_args.comm_round=2", "train_args.checkpoint_every=1"]
    sets = [x for o in tiny for x in ("--set", o)]
    assert cli.main(["simulate", "--cf", str(FEDSSC), *sets, "--output-dir", str(out)]) == 0
    files = ("metrics.jsonl", "summary.json", "partition.json", "final_model.pt")
    before = {name: (out / name).read_bytes() for name in files}
    assert before["metrics.jsonl"].count(b"\n") == 2
    started = []
    monkeypatch.setattr("fedml_moon.adapters.run.WandbRun", lambda *a, **k: started.append(a))
    other = [*sets, "--set", "train_args.learning_rate=0.1", "--set", "tracking_args.enable_wandb=true"]
    assert cli.main(["simulate", "--cf", str(FEDSSC), *other, "--resume", str(out)]) == 2
    assert {name: (out / name).read_bytes() for name in files} == before
    assert not started and not list(out.glob("model_at_*.pt"))


@needs_fmnist
def test_a_run_without_a_checkpoint_is_refused_naming_the_setting(tmp_path, monkeypatch, capfd):
    """A run killed before its first checkpoint (its first rounds recorded) has nothing to resume:
    --resume exits 2 naming LATEST and train_args.checkpoint_every, and leaves the run's folder as
    it was."""
    from fedml_moon import cli

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    out = tmp_path / "run"
    sets = [x for o in [*conformance.TINY, "train_args.comm_round=1"] for x in ("--set", o)]
    assert cli.main(["simulate", "--cf", str(FEDSSC), *sets, "--output-dir", str(out)]) == 0
    shutil.rmtree(out / "checkpoint")  # what a SIGKILL before the first checkpoint leaves
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert "metrics.jsonl" in before
    capfd.readouterr()
    assert cli.main(["simulate", "--cf", str(FEDSSC), *sets, "--resume", str(out)]) == 2
    said = capfd.readouterr().err
    assert "LATEST is missing" in said and "train_args.checkpoint_every" in said, said
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_a_write_that_dies_midway_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    write_checkpoint(tmp_path, 3, {"server": {"w": torch.ones(2)}, "parties": {"p": 1}})
    real = checkpoint._write_file
    calls = []

    def dies_on_second_file(path, data):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real(path, data)

    monkeypatch.setattr(checkpoint, "_write_file", dies_on_second_file)
    with pytest.raises(CheckpointError, match="round 4 .* the disk is full; free space, then resume"):
        write_checkpoint(tmp_path, 4, {"server": {"w": torch.zeros(2)}, "parties": {"p": 2}})
    assert checkpoint.latest(tmp_path) == 3 and checkpoint.rounds(tmp_path) == [3]
    assert torch.equal(read_checkpoint(tmp_path, 3, ("server",))["server"]["w"], torch.ones(2))


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 256 KiB file system (tmpfs; needs the right to mount, as root in CI's container)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], capture_output=True
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {made.stderr.decode().strip()}")
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


@pytest.mark.slow
def test_a_full_disk_is_named_and_the_previous_checkpoint_stays(tiny_disk):
    write_checkpoint(tiny_disk, 1, {"server": {"w": torch.ones(1000)}})  # 4 kB: fits
    with pytest.raises(CheckpointError, match="round 2 .* the disk is full; free space, then resume"):
        write_checkpoint(tiny_disk, 2, {"server": {"w": torch.zeros(200_000)}})  # 800 kB: does not
    assert checkpoint.rounds(tiny_disk) == [1] and checkpoint.latest(tiny_disk) == 1
    assert torch.equal(read_checkpoint(tiny_disk, 1, ("server",))["server"]["w"], torch.ones(1000))
    assert not list(tiny_disk.glob(".tmp-*")), "the partial write is cleaned up"


def test_checkpoints_are_read_without_pickle(tmp_path):
    folder = write_checkpoint(tmp_path, 0, {"server": {"x": 1}})
    (folder / "server.fmc").write_bytes(pickle.dumps({"x": 1}))
    with pytest.raises(CheckpointError, match="server.fmc is not a readable checkpoint"):
        read_checkpoint(tmp_path, 0, ("server",))
