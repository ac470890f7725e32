"""Standalone runs in the test's own process, a few hundred Fashion-MNIST images each, for the tests
of buffered aggregation (FedBuff) and of what a buffered run records; their data read once per module."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from fedml_moon import conformance
from fedml_moon.adapters.run import assemble
from fedml_moon.config.load import load_config
from tests.support import ROOT

CONFIGS = ROOT / "config" / "fashion_mnist"
SMALL = [
    "data_args.max_train_samples=150",
    "data_args.max_test_samples=40",
    "validation_args.local_test=false",
]
TINY = [*conformance.TINY, *SMALL, "train_args.comm_round=2"]
BUFFERED = ["server_args.aggregation=buffered"]
SECURE = ["privacy_args.secure_aggregation=true", "validation_args.local_test=false"]


@pytest.fixture(scope="module", autouse=True)
def read_once() -> Iterator[None]:
    """Fashion-MNIST's gzipped files decompressed once for this module's runs (each gets copies); a
    module that imports this fixture has it for each of its tests."""
    from fedml_moon.data import datasets

    read = functools.cache(datasets.load_mnist_like)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(datasets, "load_mnist_like", lambda *a: tuple(x.copy() for x in read(*a)))
        yield


def run_standalone(
    tmp_path: Path, name: str, sets: list[str], monkeypatch: pytest.MonkeyPatch, spy: list | None = None
) -> tuple[dict, list[dict]]:
    """The tiny standalone run of config/fashion_mnist/`name`.yaml with `sets` (no pictures drawn):
    its final model and records. With `spy`, every local round is appended to it, in training order:
    (party, what it was sent, its upload)."""
    monkeypatch.setattr("fedml_moon.data.federated.save_partition_heatmap", lambda *a: None)
    monkeypatch.setattr("fedml_moon.records.recorder.RunRecorder.plot", lambda *a: None)
    run = assemble(load_config(CONFIGS / f"{name}.yaml", [*TINY, *sets]), tmp_path)
    if spy is not None:
        train_many = run.loop.runner.train_many

        def spied(tasks, round_idx):
            out = train_many(tasks, round_idx)
            spy.extend((p, sent, upload) for (p, sent), (_, upload) in zip(tasks, out, strict=True))
            return out

        monkeypatch.setattr(run.loop.runner, "train_many", spied)
    run.loop.run()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return torch.load(tmp_path / "final_model.pt", weights_only=True), records


def max_distance(a: dict, b: dict) -> float:
    """The largest absolute difference between two models' entries (in float64)."""
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def standalone_and_mpi(config: Path, sets: list[str], tmp_path: Path) -> tuple[list[dict], list[dict]]:
    """`config` with `sets` run standalone (in this process: a start-up saved) and in the MPI
    simulation (mpirun: the modes' equality is what is tested); both ended, with the same final model
    (<= 1e-5: parties trained together or one by one) and metrics. (standalone's, MPI's) records."""
    from fedml_moon.conformance.checks import run_differences
    from fedml_moon.conformance.inprocess import quiet_run

    ref = conformance.RunResult("standalone", tmp_path / "standalone", [0], [])
    with quiet_run(config, sets, ref.out_dir) as run:
        run.loop.run()
    mpi = conformance.run_mode("mpi-simulation", config, sets, tmp_path, timeout_s=180)
    assert mpi.ok, mpi.tail()
    assert run_differences(ref, mpi, 1e-5, ("standalone", "mpi-simulation")) == []
    return run_records(ref.out_dir), run_records(mpi.out_dir)


def run_records(out: Path) -> list[dict]:
    """A run folder's records (metrics.jsonl), one dict per round."""
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def algorithm_1_sets(tmp_path: Path) -> list[str]:
    """The hand-checked buffered run's settings: two parties both training, K = 2, party 0 taking
    1 s a local round and party 1 1.5 s (a speeds file written in `tmp_path`)."""
    speeds = tmp_path / "speeds.csv"
    speeds.write_text("0,1.0\n1,1.5\n")
    sets = [*BUFFERED, "train_args.client_num_in_total=2", "train_args.client_num_per_round=2"]
    return [
        *sets,
        "server_args.buffer_size=2",
        "train_args.party_speed=file",
        f"train_args.party_speed_file={speeds}",
    ]
