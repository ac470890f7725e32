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
