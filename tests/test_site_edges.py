"""What real sites' folders hold besides their data, and the readers' answer to each: hidden files and
folders left out, `val/` as the test split, 16-bit grey scaled to 8 bits, a broken link or a failing
plugin named, unlabelled rows refused, a party column that is never a feature, and the inspection's
config lines that keep every class name a name."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from fedml_moon.config.load import load_config
from fedml_moon.config.schema import ConfigError
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from fedml_moon.data.federated import load_data
from tests.support.cli import restored_main
from tests.support.site_data import CLASSES, fashion, grey_folder, site_args, table_frame

pytestmark = pytest.mark.skipif(
    not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist"
)
ROOT = Path(__file__).resolve().parent.parent


def test_hidden_files_and_folders_are_left_out_and_val_is_the_test_split(tmp_path):
    site = tmp_path / "site"
    grey_folder(site / "train", split=False)
    grey_folder(site / "val", 10, split=False)
    (site / "train" / ".ipynb_checkpoints").mkdir()
    (site / "train" / "__MACOSX" / "bag").mkdir(parents=True)
    (site / "train" / "bag" / "._00001.png").write_bytes(b"\x00\x05\x16\x07 AppleDouble")
    (site / "train" / "bag" / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    held = load_data(site_args(data_cache_dir=str(site)), 0)
    assert len(held.y_train) == 40 and len(held.y_test) == 10  # val/ is the test split
    (site / "test").mkdir()
    grey_folder(site / "only-test" / "test", 5, split=False)
    with pytest.raises(ConfigError, match="has test/ but no train/"):
        load_data(site_args(data_cache_dir=str(site / "only-test")), 0)


def test_sixteen_bit_grey_is_scaled_to_eight_bits_not_clipped(tmp_path):
    wide = (np.arange(28 * 28, dtype=np.uint16).reshape(28, 28) * 83).astype(np.uint16)
    for c in CLASSES[:2]:
        (tmp_path / c).mkdir(parents=True)
        for i in range(5):
            Image.fromarray(wide).save(tmp_path / c / f"{i}.png")  # a 16-bit grey PNG
    held = load_data(site_args(data_cache_dir=str(tmp_path)), 0)
    expected = np.round(wide.astype(np.float64) / 257).astype(np.uint8)
    assert np.array_equal(held.x_train[0, 0].numpy(), expected)


def test_a_broken_link_and_a_failing_plugin_are_named(tmp_path, monkeypatch):
    site = grey_folder(tmp_path / "site", split=False)
    os.symlink(tmp_path / "gone.png", site / "bag" / "link.png")
    with pytest.raises(ConfigError, match=r"link.png: cannot be read"):
        load_data(site_args(data_cache_dir=str(site)), 0)
    plugin = tmp_path / "failing.py"
    plugin.write_text(
        "import torch\n"
        "def load(args):\n    raise RuntimeError('the archive is locked')\n"
        "def wide(args):\n"
        "    x = torch.zeros(4, 1, 28, 28, dtype=torch.int64)\n"
        "    ds = torch.utils.data.TensorDataset(x, torch.zeros(4))\n"
        "    return ds, ds\n"
    )
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"failing.py:load raised RuntimeError\('the archive is locked'\)"):
        load_data(site_args(dataset="plugin", plugin="failing.py:load"), 0)
    with pytest.raises(ConfigError, match=r"is a torch.int64 tensor; give uint8 pixels"):
        load_data(site_args(dataset="plugin", plugin="failing.py:wide"), 0)


def test_unlabelled_rows_are_refused_and_a_party_column_is_never_a_feature(tmp_path):
    import datasets

    x, y, _, _ = fashion(30, 1)
    frame = table_frame(x, y)
    frame["label"] = [float(CLASSES.index(c)) for c in frame["label"]]  # 0.0 .. 9.0, as a CSV reads back
    frame["party"] = [i % 3 for i in range(30)]
    (tmp_path / "t").mkdir()
    frame.to_csv(tmp_path / "t" / "train.csv", index=False)
    numbered = {
        "dataset": "table",
        "data_cache_dir": str(tmp_path / "t"),
        "classes": [str(i) for i in range(10)],
    }
    held = load_data(site_args(**numbered, channels=49, image_size=None), 0)
    assert held.input_shape == (49, 1, 1)  # the party column is left out of the features
    assert sorted(set(held.y_train.tolist()) | set(held.y_test.tolist())) == sorted(set(int(c) for c in y))
    frame.loc[4, "label"] = None
    frame.to_csv(tmp_path / "t" / "train.csv", index=False)
    with pytest.raises(ConfigError, match="row 4 has no 'label'"):
        load_data(site_args(**numbered, channels=49, image_size=None), 0)
    frame.loc[4, "label"], frame.loc[7, "f3"] = 1.0, float("inf")
    frame.to_csv(tmp_path / "t" / "train.csv", index=False)
    with pytest.raises(ConfigError, match="column 'f3' has no finite value in row 7"):
        load_data(site_args(**numbered, channels=49, image_size=None), 0)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=CLASSES)})
    rows = {"image": [Image.fromarray(i, mode="L") for i in x[:6]], "label": [0, 1, -1, 2, 3, 4]}
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(tmp_path / "hf"))
    with pytest.raises(ConfigError, match=r"row 2 has no label \(label -1\)"):
        load_data(site_args(dataset="hf", data_cache_dir=str(tmp_path / "hf")), 0)


def test_a_cnn_that_cannot_take_the_agreed_side_is_refused_with_the_config(tmp_path):
    sets = [f"data_args.data_cache_dir={tmp_path}", "data_args.dataset=imagefolder", "data_args.channels=1"]
    sets += [f"data_args.classes=[{','.join(CLASSES)}]", "data_args.image_size=64"]
    with pytest.raises(ConfigError, match="simple-cnn takes 28x28 or 32x32 images, not 64x64"):
        load_config(ROOT / "config" / "fashion_mnist" / "moon.yaml", sets)
    assert load_config(ROOT / "config" / "fashion_mnist" / "moon.yaml", [*sets, "model_args.model=resnet50"])


def test_the_inspections_config_lines_keep_every_class_name_a_name(tmp_path, capsys):
    for name in ("no", "yes", "01", "010"):
        (tmp_path / name).mkdir()
        Image.fromarray(fashion(1, 1)[0][0], mode="L").save(tmp_path / name / "a.png")
    with restored_main() as main:
        assert main(["data", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    block = text.split("config lines that agree with it")[1].split("\n\nproblems")[0].split("\n", 1)[1]
    assert yaml.safe_load(block)["data_args"]["classes"] == ["01", "010", "no", "yes"]
    table = tmp_path / "t"
    table.mkdir()
    table_frame(*fashion(10, 1)[:2]).to_csv(table / "train.csv", index=False)
    with restored_main() as main:
        assert main(["data", str(table), "--natural"]) == 1
    assert "no party column 'party'" in capsys.readouterr().out
