"""A site's own data: image folders, CSV / Parquet tables, a saved Hugging Face dataset and a plugin,
each written from real Fashion-MNIST images, trained for two rounds of MOON through the command line;
natural partitions (one folder per party, different class mixes); the test set of a natural partition
is the union of the parties' test splits."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from fedml_moon.data.partition_file import load_partition_file
from tests.support.cli import restored_main
from tests.support.site_data import (
    CLASSES,
    MIXES,
    fashion,
    party_folders,
    site_sets,
    write_hf,
    write_pngs,
    write_table,
)

pytestmark = pytest.mark.skipif(
    not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist"
)
ROOT = Path(__file__).resolve().parent.parent
MOON = str(ROOT / "config" / "fashion_mnist" / "moon.yaml")
TWO_ROUNDS = {
    "train_args.comm_round": "2",
    "train_args.epochs": "1",
    "train_args.batch_size": "32",
    "train_args.learning_rate": "0.05",
    "tracking_args.enable_wandb": "false",
}


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sites")
    x, y, xt, yt = fashion(600, 200)
    write_pngs(root / "folder" / "train", x, y)
    write_pngs(root / "folder" / "test", xt, yt)
    write_pngs(root / "no-test", x, y)
    return {
        "folder": root / "folder",
        "no-test": root / "no-test",
        "parties": party_folders(root / "parties"),
        "csv": write_table(root / "csv", "csv"),
        "parquet": write_table(root / "parquet", "parquet"),
        "hf": write_hf(root / "hf"),
    }


def simulate(out: Path, sets: dict[str, str]) -> dict:
    """Two rounds of MOON through `fedml-moon simulate`; the summary."""
    args = ["simulate", "--cf", MOON, "--output-dir", str(out)]
    for key, value in {**TWO_ROUNDS, **sets}.items():
        args += ["--set", f"{key}={value}"]
    with restored_main() as main:
        assert main(args) == 0
    return json.loads((out / "summary.json").read_text())


def site(kind: str, folder: Path | None, parties: int = 3, **extra: str) -> dict[str, str]:
    sets = dict(s.split("=", 1) for s in site_sets())
    sets.update({"data_args.dataset": kind, "train_args.client_num_in_total": str(parties),
                 "train_args.client_num_per_round": str(parties)})  # fmt: skip
    if folder is not None:
        sets["data_args.data_cache_dir"] = str(folder)
    if kind == "table":
        sets.update({"data_args.channels": "49", "data_args.image_size": "1", "model_args.model": "mlp"})
    sets.update(extra)
    return sets


FORMATS = {
    "image folder, train/ and test/": ("imagefolder", "folder", {}),
    "image folder, a seeded test share": ("imagefolder", "no-test", {}),
    "image folders per party": ("imagefolder", "parties", {"data_args.partition_method": "natural"}),
    "CSV table": ("table", "csv", {}),
    "Parquet table": ("table", "parquet", {}),
    "saved Hugging Face dataset": ("hf", "hf", {}),
    "plugin": ("plugin", None, {"data_args.plugin": "tests/support/site_plugin.py:load"}),
    "plugin, per party": (
        "plugin",
        None,
        {"data_args.plugin": "tests/support/site_plugin.py:parties", "data_args.partition_method": "natural"},
    ),
}


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_each_format_trains_two_rounds_of_moon(name, sites, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the plugin's path is relative to where the command runs
    kind, folder, extra = FORMATS[name]
    summary = simulate(tmp_path / "run", site(kind, folder and sites[folder], **extra))
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == [0, 1]
    assert all(np.isfinite(r["train_loss"]) for r in records)
    assert 0.0 <= summary["final_test_acc"] <= 1.0
    counts = load_partition_file(tmp_path / "run" / "partition.json").counts.tolist()
    assert len(counts) == 3 and len(counts[0]) == len(CLASSES)


def test_the_same_images_give_the_same_model_from_a_folder_and_from_a_hugging_face_dataset(sites, tmp_path):
    """The image folder and the saved dataset hold the same PNGs in the same order (class by class,
    the folder's files sorted): the same holdings, so the same final model."""
    import datasets

    ordered = tmp_path / "hf-sorted"
    names, rows = [], []
    for split in ("train", "test"):
        items = sorted((c, p) for c in CLASSES for p in sorted((sites["folder"] / split / c).glob("*.png")))
        rows.append(
            {"image": [Image.open(p) for _, p in items], "label": [CLASSES.index(c) for c, _ in items]}
        )
        names.append(split)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=CLASSES)})
    built = {n: datasets.Dataset.from_dict(r, features=features) for n, r in zip(names, rows, strict=True)}
    datasets.DatasetDict(built).save_to_disk(str(ordered))
    a = simulate(tmp_path / "folder", site("imagefolder", sites["folder"]))
    b = simulate(tmp_path / "hf", site("hf", ordered))
    assert a["final_model_sha256"] == b["final_model_sha256"]
    csv = simulate(tmp_path / "csv", site("table", sites["csv"]))
    parquet = simulate(tmp_path / "parquet", site("table", sites["parquet"]))
    assert csv["final_model_sha256"] == parquet["final_model_sha256"]


def _decoded_union(root: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Every party's test PNGs, read here with PIL alone: x [N, 1, 28, 28] in [0, 1], y [N]."""
    xs, ys = [], []
    for party in sorted(MIXES):
        for c, name in enumerate(CLASSES):
            for path in sorted((root / party / "test" / name).glob("*.png")):
                xs.append(np.asarray(Image.open(path), dtype=np.float32) / 255.0)
                ys.append(c)
    return torch.from_numpy(np.stack(xs)[:, None]), torch.tensor(ys)


def test_a_natural_partitions_test_set_is_the_union_of_the_parties_test_splits(sites, tmp_path):
    """The recorded test_acc is the final model evaluated by hand on every party's test images, and
    each party trains on its own folder's images only (its class mix)."""
    from fedml_moon.core.models import build_model

    sets = site("imagefolder", sites["parties"], **{"data_args.partition_method": "natural"})
    summary = simulate(tmp_path / "run", sets)
    partition = load_partition_file(tmp_path / "run" / "partition.json")
    counts, names = partition.counts, partition.meta["parties"]
    assert names == sorted(MIXES)
    for p, (party, keep) in enumerate(sorted(MIXES.items())):
        held = [c for c in range(len(CLASSES)) if counts[p, c] > 0]
        assert held == keep, party
        assert counts[p].sum() == len(list((sites["parties"] / party / "train").rglob("*.png")))
    x, y = _decoded_union(sites["parties"])
    torch.manual_seed(0)
    model = build_model("simple-cnn", (1, 28, 28), len(CLASSES), True, 256)
    model.load_state_dict(torch.load(tmp_path / "run" / "final_model.pt", weights_only=True))
    with torch.no_grad():
        acc = (model.eval()(x).logits.argmax(1) == y).float().mean().item()
    assert summary["final_test_acc"] == pytest.approx(acc, abs=1e-6)
    assert (summary.get("test_samples") or len(y)) == len(y)


def test_a_folder_decodes_once_and_a_changed_file_decodes_anew(sites, tmp_path, monkeypatch):
    import shutil

    from fedml_moon.config.schema import DataArgs
    from fedml_moon.data import images
    from fedml_moon.data.site import load_site

    decoded = []
    real = images.decode_all
    monkeypatch.setattr(
        images, "decode_all", lambda paths, *a, **k: decoded.append(len(paths)) or real(paths, *a, **k)
    )
    folder = tmp_path / "copy"
    shutil.copytree(sites["folder"], folder)
    for cache in folder.glob(".fedml_moon-images-*.npy"):  # another test's run of the original folder
        cache.unlink()
    args = DataArgs(
        dataset="imagefolder", data_cache_dir=str(folder), classes=CLASSES, image_size=28, channels=1
    )
    args.check()
    args.check_agreement()
    first = load_site(args, 0)
    assert decoded == [800] and len(list(folder.glob(".fedml_moon-images-*.npy"))) == 1
    again = load_site(args, 0)
    assert decoded == [800]  # from the cache
    assert torch.equal(first.x_train, again.x_train) and torch.equal(first.y_test, again.y_test)
    victim = sorted((folder / "train" / "bag").glob("*.png"))[0]
    Image.fromarray(np.full((28, 28), 255, dtype=np.uint8), mode="L").save(victim)
    changed = load_site(args, 0)
    assert decoded == [800, 800]
    row = (changed.x_train != first.x_train).flatten(1).any(1).nonzero().flatten().tolist()
    assert len(row) == 1 and bool((changed.x_train[row[0]] == 255).all())
    newest = max(folder.glob(".fedml_moon-images-*.npy"), key=lambda p: p.stat().st_mtime_ns)
    newest.write_bytes(b"not an array")  # a broken cache is decoded around and written anew
    assert torch.equal(load_site(args, 0).x_train, changed.x_train)
    assert decoded == [800, 800, 800] and np.load(newest).shape == (800, 1, 28, 28)
    moved = tmp_path / "moved"
    shutil.copytree(folder, moved)  # times kept: the cache goes with the folder
    assert torch.equal(load_site(replace(args, data_cache_dir=str(moved)), 0).x_train, changed.x_train)
    assert decoded == [800, 800, 800]


def test_images_are_resized_to_the_agreed_side_and_grey_scaled_only_when_grey(tmp_path):
    from fedml_moon.config.schema import DataArgs
    from fedml_moon.data.site import load_site

    big = np.kron(fashion(30, 1)[0], np.ones((2, 2), dtype=np.uint8))  # 56x56
    for i, img in enumerate(big):
        target = tmp_path / CLASSES[i % 2] / f"{i}.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img, mode="L").save(target)
    args = DataArgs(
        dataset="imagefolder", data_cache_dir=str(tmp_path), classes=CLASSES, image_size=28, channels=1
    )
    args.check()
    args.check_agreement()
    held = load_site(args, 0)
    assert held.input_shape == (1, 28, 28) and len(held.y_train) + len(held.y_test) == 30
    assert held.y_test.numel() == 6  # test_fraction 0.2 of 30


def test_float_features_are_normalised_as_they_are_and_images_from_bytes_over_255():
    from fedml_moon.data.loader import PartyLoader

    values = torch.tensor([[[[3.5]]], [[[-2.0]]]])
    loader = PartyLoader(values, torch.tensor([0, 1]), np.arange(2), 2, mean=(1.0,), std=(2.0,))
    x, _ = next(iter(loader))
    assert x.flatten().tolist() == [1.25, -1.5]
    pixels = torch.tensor([[[[255]]], [[[51]]]], dtype=torch.uint8)
    x, _ = next(iter(PartyLoader(pixels, torch.tensor([0, 1]), np.arange(2), 2)))
    assert x.flatten().tolist() == pytest.approx([1.0, 0.2])


def test_a_party_column_makes_the_parties_of_a_table_and_of_a_hugging_face_dataset(tmp_path):
    """Rows name their party: the parties are the column's values in sorted order, each holding its
    rows (a test table needs rows of every party; without one a seeded share is kept back)."""
    import datasets
    import pandas as pd

    from fedml_moon.config.schema import DataArgs
    from fedml_moon.data.federated import load_data
    from tests.support.site_data import table_frame

    x, y, xt, yt = fashion(90, 30)
    owner = [["lyon", "oslo", "kyiv"][i % 3] for i in range(90)]
    (tmp_path / "t").mkdir()
    train = table_frame(x, y)
    train["party"] = owner
    train.to_csv(tmp_path / "t" / "train.csv", index=False)
    args = DataArgs(dataset="table", data_cache_dir=str(tmp_path / "t"), classes=CLASSES, channels=49)
    args.partition_method = "natural"
    args.check_agreement()
    held = load_data(args, 0)
    assert held.parties.names == ("kyiv", "lyon", "oslo")
    for name, train_idx, test_idx in zip(
        held.parties.names, held.parties.train, held.parties.test, strict=True
    ):
        assert len(train_idx) + len(test_idx) == owner.count(name) and len(test_idx) == 6  # 0.2 of 30
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "label": datasets.ClassLabel(names=CLASSES),
            "party": datasets.Value("string"),
        }
    )
    splits = {
        split: datasets.Dataset.from_dict(
            {
                "image": [Image.fromarray(i, mode="L") for i in xs],
                "label": [int(c) for c in ys],
                "party": who,
            },
            features=features,
        )
        for split, xs, ys, who in (("train", x, y, owner), ("test", xt, yt, owner[:30]))
    }
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "hf"))
    args = DataArgs(
        dataset="hf", data_cache_dir=str(tmp_path / "hf"), classes=CLASSES, channels=1, image_size=28
    )
    args.partition_method = "natural"
    args.check_agreement()
    held = load_data(args, 0)
    assert held.parties.names == ("kyiv", "lyon", "oslo")
    first = held.parties.train[0]  # kyiv's: rows 2, 5, 8, ... of the training split, in order
    assert torch.equal(held.x_train[first[0], 0], torch.from_numpy(x[2]))
    assert held.y_train[first].tolist() == [int(c) for c in y[2::3]]
    assert [len(t) for t in held.parties.test] == [10, 10, 10]
    pd.testing.assert_index_equal(pd.Index(held.parties.names), pd.Index(sorted(set(owner))))
