"""A partition as a file: every run writes each party's train and local-test indices to
partition.json, `partition_method: file` reads them, and a run on a written partition is the run that
wrote it (the same final model). A file that does not fit the run is refused naming what is wrong,
through the real command line, before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fedml_moon import conformance
from fedml_moon.adapters.run import assemble
from fedml_moon.config import load_config
from fedml_moon.config_schema import ConfigError
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from fedml_moon.data.federated import load_data, partition
from fedml_moon.data.partition_file import load_partition_file
from tests.helpers import restored_main

pytestmark = pytest.mark.skipif(
    not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist"
)
CONFIGS = Path(__file__).resolve().parent.parent / "config" / "fashion_mnist"
TINY = [*conformance.TINY, "data_args.max_train_samples=400", "data_args.max_test_samples=200"]
FILE = "data_args.partition_method=file"


def _run(tmp_path: Path, name: str, config: str, overrides: list[str]) -> Path:
    out = tmp_path / name
    assemble(load_config(CONFIGS / f"{config}.yaml", [*TINY, *overrides]), out).loop.run()
    return out


def _partition(out: Path) -> dict:
    """The run's partition as lists: what it wrote in partition.json and partition.npz."""
    read = load_partition_file(out / "partition.json")
    lists = {split: [p.tolist() for p in getattr(read, split)] for split in ("train", "test")}
    return {**read.meta, **lists, "counts": read.counts.tolist()}


@pytest.mark.parametrize(
    ("config", "overrides"),
    [
        ("fedavg", ["data_args.partition_alpha=0.1"]),  # the config says hetero with alpha 0.5
        ("lg", ["data_args.partition_method=homo"]),  # the config says shards
    ],
)
def test_a_run_on_a_written_partition_ends_with_the_same_model(config, overrides, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    first = _run(tmp_path, "first", config, overrides)
    written = _partition(first)
    assert written["n_train"] == 400 and written["n_test"] == 200 and len(written["train"]) == 3
    assert sorted(i for part in written["train"] for i in part) == list(range(400))  # disjoint, whole
    valid = ["data_args.shards_per_client=10"] if config == "lg" else []  # 3 parties cut 10 classes
    cfg = load_config(CONFIGS / f"{config}.yaml", [*TINY, *valid])  # what the second run would draw
    drawn, _ = partition(cfg.data_args, load_data(cfg.data_args, 0), 3, 0)
    assert [p.tolist() for p in drawn] != written["train"]
    again = _run(tmp_path, "again", config, [FILE, f"data_args.partition_path={first / 'partition.json'}"])
    assert _partition(again) == written  # the same partition, written again
    ours, theirs = (torch.load(o / "final_model.pt", weights_only=True) for o in (again, first))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in theirs)


def test_another_codes_split_with_shared_test_samples_is_taken_as_it_is(tmp_path):
    """A split written by hand (as another code's might be): training indices in the file's order,
    local test splits that overlap, as the LG-FedAvg authors' class-matched test splits can."""
    cfg = load_config(CONFIGS / "fedavg.yaml", TINY)
    data = load_data(cfg.data_args, 0)
    train = [list(range(0, 400, 3))[::-1], list(range(1, 400, 3)), list(range(2, 400, 3))]
    test = [list(range(0, 100)), list(range(50, 150)), list(range(100, 200))]
    path = tmp_path / "split.json"
    path.write_text(json.dumps({"train": train, "test": test}))
    args = load_config(CONFIGS / "fedavg.yaml", [*TINY, FILE, f"data_args.partition_path={path}"]).data_args
    got_train, got_test = partition(args, data, 3, 0)
    assert [p.tolist() for p in got_train] == train and [p.tolist() for p in got_test] == test


def _refused(tmp_path: Path, record: object) -> tuple[list[str], Path]:
    """The file `record` (JSON, or raw text) read through the command line by a run told to replace
    the earlier run's records in its folder (`--overwrite`): a refused run replaces nothing."""
    path = tmp_path / "partition.json"
    path.write_text(record if isinstance(record, str) else json.dumps(record))
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    (out / "metrics.jsonl").write_text('{"round": 0}\n')
    argv = ["simulate", "--cf", str(CONFIGS / "fedavg.yaml"), "--output-dir", str(out), "--overwrite"]
    for item in [*TINY, FILE, f"data_args.partition_path={path}"]:
        argv += ["--set", item]
    return argv, out


GOOD = {"dataset": "fashion-mnist", "n_train": 400, "n_test": 200}
PARTS = {"train": [[0, 1], [2, 3], [4, 5]], "test": [[0], [1], [2]]}


@pytest.mark.parametrize(
    ("record", "named"),
    [
        ("not json {", "is not JSON"),
        ({"counts": [[1, 2]]}, "has no train or test indices"),
        ({**GOOD, "train": PARTS["train"]}, "has no test indices"),
        ({**GOOD, "train": [[0], [1]], "test": [[0], [1]]}, "set client_num_in_total: 2"),
        ({**GOOD, "n_train": 60000, **PARTS}, "n_train 60000"),
        ({**GOOD, "dataset": "cifar10", **PARTS}, "dataset 'cifar10'"),
        ({**GOOD, **PARTS, "train": [[0, 400], [2], [3]]}, "party 0's train index 400 is outside"),
        ({**GOOD, **PARTS, "train": [[0], [-1], [3]]}, "party 1's train index -1 is outside"),
        ({**GOOD, **PARTS, "test": [[0], [1], [200]]}, "party 2's test index 200"),
        ({**GOOD, **PARTS, "train": [[0], [1, 1], [3]]}, "party 1's train indices name a sample twice"),
        ({**GOOD, **PARTS, "train": [[0], [1.0], [3]]}, "party 1's train indices must be a list of integers"),
        ({**GOOD, **PARTS, "train": [[0], [True], [3]]}, "must be a list of integers"),
        ({**GOOD, **PARTS, "train": [[0], "1", [3]]}, "must be a list of integers"),
        ({**GOOD, **PARTS, "train": [[0], [], [3]]}, "party 1 has no training sample"),
        ({**GOOD, **PARTS, "party_ids": [2]}, "one silo's partition"),
        ({**GOOD, "train": {"0": [1]}, "test": {"0": [1]}}, "must be lists"),
    ],
)
def test_a_partition_file_that_does_not_fit_is_refused_naming_it(record, named, tmp_path, capsys):
    argv, out = _refused(tmp_path, record)
    with restored_main() as main:
        code = main(argv)
    said = capsys.readouterr().err
    assert code == 2 and named in said and "partition" in said, said[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl"]  # the earlier run's, untouched
    assert (out / "metrics.jsonl").read_text() == '{"round": 0}\n'


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ([FILE], "data_args.partition_path"),
        (["data_args.partition_path=p.json"], "data_args.partition_path"),
        ([FILE, "data_args.partition_path=no/such/partition.json"], "does not exist"),
    ],
)
def test_partition_method_file_and_its_path_go_together(overrides, named, tmp_path):
    cfg = None
    with pytest.raises(ConfigError, match=named):
        cfg = load_config(CONFIGS / "fedavg.yaml", [*TINY, *overrides])
        partition(cfg.data_args, load_data(cfg.data_args, 0), 3, 0)
    assert cfg is None or cfg.data_args.partition_method == "file"


def test_overlapping_training_samples_are_named_in_the_log(tmp_path, caplog):
    cfg = load_config(CONFIGS / "fedavg.yaml", TINY)
    data = load_data(cfg.data_args, 0)
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"train": [[0, 1], [1, 2], [2, 3]], "test": [[], [], []]}))
    args = load_config(CONFIGS / "fedavg.yaml", [*TINY, FILE, f"data_args.partition_path={path}"]).data_args
    train, _ = partition(args, data, 3, 0)
    assert [len(p) for p in train] == [2, 2, 2] and np.concatenate(train).tolist() == [0, 1, 1, 2, 2, 3]
    assert "2 training samples are held by more than one party" in caplog.text
