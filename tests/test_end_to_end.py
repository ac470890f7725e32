"""Two-round runs of every algorithm through the real command line, on real Fashion-MNIST data. A run
is a process of its own, forked from the preloaded server as `fedml-moon check` forks its runs
(`conformance.spawn`; what a run's start-up does is tested where it is the subject); the command
line's refusals (a config mistake, missing data) run as fresh processes, their stderr their own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fedml_moon import conformance
from fedml_moon.core.schedule import sample_schedule
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from tests.support.processes import simulate_process

ROOT = Path(__file__).resolve().parent.parent
SMALL = [
    "data_args.max_train_samples=3000",
    "data_args.max_test_samples=500",
    "train_args.comm_round=2",
    "train_args.epochs=1",
    "tracking_args.enable_wandb=false",
]
needs_fmnist = pytest.mark.skipif(
    not Path(DEBIAN_FASHION_MNIST).is_dir(), reason="apt-get install dataset-fashion-mnist"
)


def forked(out: Path, config: str, *overrides: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`simulate_process`'s run forked from the preloaded server; its stdout and stderr together in
    `stderr`."""
    cmd = [sys.executable, "-m", "fedml_moon", "simulate", "--cf", str(ROOT / config)]
    cmd += ["--output-dir", str(out), *(a for item in overrides for a in ("--set", item))]
    log = out.parent / f"{out.name}.log"
    full_env = {**conformance.process_env(out.parent / "home"), **(env or {})}
    (code,) = conformance.wait_all([conformance.spawn(cmd, log, full_env, out.parent)], 300)
    return subprocess.CompletedProcess(cmd, code, "", log.read_text(errors="replace"))


def read_run(out: Path) -> tuple[list[dict], dict]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return records, json.loads((out / "summary.json").read_text())


@needs_fmnist
@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["moon", "fedavg", "fedprox", "solo", "fedssc", "scaffold"])
def test_two_rounds_through_the_cli(tmp_path, algorithm):
    out = tmp_path / "run"
    plots = algorithm != "solo"  # one run without its pictures (tracking_args.plots: false)
    proc = forked(out, f"config/fashion_mnist/{algorithm}.yaml", *SMALL, f"tracking_args.plots={plots}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    records, summary = read_run(out)
    assert [r["round"] for r in records] == [0, 1]
    for r in records:
        for key in ("test_acc", "test_loss", "train_loss", "round_time_s", "bytes_up", "bytes_down"):
            assert isinstance(r[key], float | int), key
        assert 0.0 <= r["test_acc"] <= 1.0 and r["bytes_up"] > 0
    if algorithm in ("moon", "fedavg", "fedprox", "solo"):  # cumulative; the same payload every round
        assert records[1]["bytes_down"] == 2 * records[0]["bytes_down"]
    else:  # round 1 also carries what the server built in round 0 (prototypes, control variate)
        assert records[1]["bytes_down"] > 2 * records[0]["bytes_down"]
    assert summary["status"] == "completed" and summary["final_test_acc"] == records[-1]["test_acc"]
    assert summary["best_test_acc"] == max(r["test_acc"] for r in records)
    assert summary["config"]["train_args"]["algorithm"] == algorithm
    pictures = (out / "accuracy.png", out / "partition.png")
    drawn = [p.is_file() and p.stat().st_size > 0 for p in pictures]
    assert drawn == [plots, plots] and (out / "partition.json").is_file()
    if algorithm == "moon":
        assert records[0]["l_con"] == 0.0 and records[1]["l_con"] > 0.0
    if algorithm == "solo":
        assert records[1]["models_evaluated"] == 10 and "final_test_acc_std" in summary
    if algorithm == "fedssc":
        assert records[0]["l_glob"] == 0.0 and records[1]["l_glob"] > 0.0
    if algorithm == "scaffold":  # the control variates travel beside the model, both ways
        assert records[0]["bytes_up"] == pytest.approx(2 * records[0]["bytes_down"], rel=0.01)
    assert not (tmp_path / "home" / ".fedml").exists()


@needs_fmnist
@pytest.mark.slow
def test_lg_two_rounds_warmup_then_local_layers(tmp_path):
    out = tmp_path / "run"
    overrides = [*SMALL, "algorithm_args.warmup_rounds=1", "data_args.max_test_samples=2000"]
    proc = forked(out, "config/fashion_mnist/lg.yaml", *overrides)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records, summary = read_run(out)
    full, global_part = 633226, 256 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10  # MLP; top 3 layers
    assert records[0]["params_up"] == 10 * full  # warm-up round: FedAvg, the whole model
    assert records[1]["params_up"] - records[0]["params_up"] == 10 * global_part
    assert (
        records[1]["params_down"] - records[0]["params_down"] == 10 * full
    )  # first contact: local init once
    for r in records:
        assert 0.0 <= r["local_test_acc"] <= 1.0 and 0.0 <= r["new_test_acc"] <= 1.0
    assert (out / "final_model.pt").is_file() and summary["status"] == "completed"


@needs_fmnist
@pytest.mark.slow
def test_sampling_momentum_disk_state_and_wandb_offline(tmp_path):
    out = tmp_path / "run"
    overrides = [*SMALL[:-1], "train_args.client_num_per_round=3", "train_args.state_store=disk"]
    overrides += ["server_args.server_momentum=0.5", "tracking_args.wandb_mode=offline"]
    key = {"WANDB_API_KEY": "secret-not-logged"}
    proc = forked(out, "config/fashion_mnist/moon.yaml", *overrides, env=key)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records, summary = read_run(out)
    assert [r["parties"] for r in records] == [3, 3]
    sampled = sorted({p for r in sample_schedule(10, 3, 2, seed=0) for p in r})
    assert sorted(int(p.stem.split("_")[1]) for p in (out / "party_state").glob("party_*.pt")) == sampled
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    records_file = next(runs[0].glob("run-*.wandb")).read_bytes()  # offline runs keep config and logs here
    assert b"server_momentum" in records_file and b"test_acc" in records_file
    assert b"secret-not-logged" not in records_file


@pytest.mark.slow
def test_config_mistake_gives_one_clear_line_and_exit_2(tmp_path):
    out = tmp_path / "run"
    proc = simulate_process(out, "config/fashion_mnist/moon.yaml", "algorithm_args.temperature=0")
    assert proc.returncode == 2
    assert "config error: algorithm_args.temperature" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_missing_data_says_how_to_get_it(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = simulate_process(
        tmp_path / "run", "config/paper/cifar10_moon.yaml", f"data_args.data_cache_dir={empty}"
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert (
        f"config error: data_args.data_cache_dir: cifar10 not found in data_args.data_cache_dir {empty}"
        in (proc.stderr)
    )
    assert "cifar-10-batches-py" in proc.stderr and "data_args.download: true" in proc.stderr
