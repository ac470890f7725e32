"""A partition as a file: every run writes each party's train and local-test indices to
partition.json, `partition_method: file` reads them, and a run on a written partition is the run that
wrote it (the same final model). A file that does not fit the run is refused naming what is wrong,
through the real command line, before anything is written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from fedml_moon import conformance
from fedml_moon.adapters.run import assemble
from fedml_moon.config.load import load_config
from fedml_moon.config.schema import ConfigError
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from fedml_moon.data.federated import load_data, partition
from fedml_moon.data.partition_file import load_partition_file, write_partition
from tests.support.cli import restored_main

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
    head = json.loads((first / "partition.json").read_text())  # what it is of; the indices are columns
    assert head["arrays"] == "partition.npz" and not {"train", "test", "counts"} & set(head)
    with np.load(first / "partition.npz", allow_pickle=False) as npz:
        assert set(npz.files) == {"train_indices", "train_offsets", "test_indices", "test_offsets", "counts"}
        assert npz["train_offsets"].tolist() == [0, *np.cumsum([len(p) for p in written["train"]]).tolist()]
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


def test_a_partition_json_of_the_earlier_form_reads_as_the_columns_it_became(tmp_path):
    """`partition_path` takes the single-JSON form of earlier versions: the same arrays as the
    columnar form of the same partition."""
    cfg = load_config(CONFIGS / "fedavg.yaml", TINY)
    data = load_data(cfg.data_args, 0)
    train, test = partition(cfg.data_args, data, 3, 0)
    counts = np.ones((3, 10), dtype=np.int64)
    write_partition(tmp_path, data, train, test, counts)
    old = {**GOOD, "train": [p.tolist() for p in train], "test": [p.tolist() for p in test]}
    (tmp_path / "old.json").write_text(json.dumps({**old, "counts": counts.tolist()}))
    for name in ("partition.json", "old.json"):
        args = load_config(
            CONFIGS / "fedavg.yaml", [*TINY, FILE, f"data_args.partition_path={tmp_path / name}"]
        )
        got_train, got_test = partition(args.data_args, data, 3, 0)
        assert [p.tolist() for p in got_train] == old["train"] and [p.tolist() for p in got_test] == old[
            "test"
        ]
        assert load_partition_file(tmp_path / name).counts.tolist() == counts.tolist()


@pytest.fixture(scope="module")
def tiny_data():
    """The TINY config's data, loaded once for the module's many in-process refusals."""
    return load_data(load_config(CONFIGS / "fedavg.yaml", TINY).data_args, 0)


def _columns(**change: object) -> dict:
    """Three parties' columns (train 0-1, 2-3, 4-5; test 0, 1, 2), with `change` applied."""
    good = {
        "train_indices": np.arange(6),
        "train_offsets": np.array([0, 2, 4, 6]),
        "test_indices": np.arange(3),
        "test_offsets": np.array([0, 1, 2, 3]),
    }
    return {k: v for k, v in {**good, **change}.items() if v is not None}


@pytest.mark.parametrize(
    ("head", "columns", "named"),
    [
        ({}, _columns(), None),  # the good one: read
        ({"arrays": "../partition.npz"}, _columns(), "arrays must name a file beside it"),
        ({"arrays": "gone.npz"}, _columns(), "which does not exist; keep the two files together"),
        ({}, b"not a zip", "is not a numpy .npz archive"),
        ({}, _columns(test_offsets=None), "lacks test_offsets"),
        ({}, _columns(train_offsets=np.array([0, 2, 4, 5])), "train_offsets: offsets must rise from 0"),
        ({}, _columns(train_offsets=np.array([0, 4, 2, 6])), "train_offsets: offsets must rise from 0"),
        ({}, _columns(train_offsets=np.array([1, 2, 4, 6])), "train_offsets: offsets must rise from 0"),
        ({}, _columns(train_indices=np.arange(6.0)), "train_indices must be a 1-D integer array"),
        ({}, _columns(train_indices=np.zeros((3, 2), int)), "train_indices must be a 1-D integer array"),
        ({}, _columns(test_indices=np.array([True, False, True])), "test_indices must be a 1-D integer"),
        ({}, _columns(train_indices=np.array([0, 1, 2, 3, 4, 400])), "party 2's train index 400 is outside"),
        ({}, _columns(test_indices=np.array([0, -1, 2])), "party 1's test index -1 is outside"),
        (
            {},
            _columns(train_indices=np.array([0, 1, 2, 2, 4, 5])),
            "party 1's train indices name a sample twice",
        ),
        ({}, _columns(train_offsets=np.array([0, 2, 2, 6])), "party 1 has no training sample"),
        ({}, _columns(test_offsets=np.array([0, 1, 3])), "holds 3 parties' train indices but 2"),
        ({}, _columns(train_offsets=np.array([0, 3, 6]), test_offsets=np.array([0, 1, 3])), "total: 2"),
        ({"n_test": 100}, _columns(), "n_test 100"),
        ({"party_ids": [1]}, _columns(), "one silo's partition"),
    ],
)
def test_a_columnar_partition_that_does_not_fit_is_refused_naming_it(
    head, columns, named, tiny_data, tmp_path
):
    """The columns are checked whole-array with the JSON form's messages: the party and index named."""
    data = tiny_data
    if isinstance(columns, bytes):
        (tmp_path / "partition.npz").write_bytes(columns)
    else:
        np.savez(tmp_path / "partition.npz", **columns)
    path = tmp_path / "partition.json"
    path.write_text(json.dumps({**GOOD, "arrays": "partition.npz", **head}))
    args = load_config(CONFIGS / "fedavg.yaml", [*TINY, FILE, f"data_args.partition_path={path}"]).data_args
    if named is None:
        train, test = partition(args, data, 3, 0)
        assert [p.tolist() for p in train] == [[0, 1], [2, 3], [4, 5]] and len(test) == 3
        return
    with pytest.raises(ConfigError, match=re.escape(named)) as refused:
        partition(args, data, 3, 0)
    said = str(refused.value)
    assert (
        said.startswith(("data_args.partition_path", "train_args.client_num_in_total")) and "\n" not in said
    )


def test_an_archive_of_objects_is_refused_without_unpickling_it(tmp_path):
    """A pickled object in the archive would run code when loaded: it is never loaded."""
    ran = tmp_path / "ran"
    np.savez(tmp_path / "partition.npz", **_columns(train_indices=np.array([_Boom(ran)] * 6, dtype=object)))
    (tmp_path / "partition.json").write_text(json.dumps({**GOOD, "arrays": "partition.npz"}))
    with pytest.raises(ConfigError, match="is not a numpy .npz archive .*allow_pickle"):
        load_partition_file(tmp_path / "partition.json")
    assert not ran.exists()


class _Boom:
    """Pickles as a call that writes `path`: what a doctored archive could run."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.write_text, (self.path, "ran"))
