"""A site's data that breaks the run's agreement is refused before any round, through the real command
line: the file or column named with its fix, exit code 2, and the output folder of an earlier run left
as it was. Then the agreement's rules one by one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedml_moon.config.schema import ConfigError, DataArgs
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from fedml_moon.data.federated import load_data, partition
from tests.support.cli import restored_main
from tests.support.site_data import (
    CLASSES,
    fashion,
    grey_folder,
    party_folders,
    site_args,
    site_sets,
    write_table,
)

pytestmark = pytest.mark.skipif(
    not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist"
)
ROOT = Path(__file__).resolve().parent.parent
MOON = ROOT / "config" / "fashion_mnist" / "moon.yaml"


def _extra_class(root: Path) -> tuple[Path, str]:
    folder = grey_folder(root, 60)
    (folder / "train" / "jacket").mkdir()
    Image.fromarray(fashion(1, 1)[0][0], mode="L").save(folder / "train" / "jacket" / "0.png")
    return folder, "train/jacket"


def _rgb_file(root: Path) -> tuple[Path, str]:
    folder = grey_folder(root, 60)
    Image.fromarray(np.zeros((28, 28, 3), dtype=np.uint8), mode="RGB").save(
        folder / "test" / "bag" / "rgb.png"
    )
    return folder, "test/bag/rgb.png"


def _broken_file(root: Path) -> tuple[Path, str]:
    folder = grey_folder(root, 60)
    (folder / "train" / "coat" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n but then nothing")
    return folder, "train/coat/broken.png"


def _table_without_label(root: Path) -> tuple[Path, str]:
    folder = write_table(root, "csv", 60, 20)
    import pandas as pd

    frame = pd.read_csv(folder / "train.csv").rename(columns={"label": "kind"})
    frame.to_csv(folder / "train.csv", index=False)
    return folder, "train.csv"


BREAKS = {
    "a class the run does not name": (_extra_class, "jacket", "data_args.classes"),
    "a colour image in a grey site": (_rgb_file, "has 3 channel(s)", "data_args.channels: 1"),
    "a file that does not decode": (_broken_file, "not an image that can be decoded", "replace or remove it"),
    "a table without its label column": (_table_without_label, "no column 'label'", "data_args.label_column"),
}


def _refused(name: str, tmp_path: Path, run) -> None:
    """Break the data as BREAKS[name] says, run the command over an earlier run's folder; the
    refusal names the culprit and the fix, exit code 2, the folder as it was, no round run."""
    make, problem, fix = BREAKS[name]
    folder, culprit = make(tmp_path / "site")
    table = "table" in name
    sets = site_sets({"data_args.dataset": "table" if table else "imagefolder"})
    if table:
        sets = [s for s in sets if "image_size" not in s and "channels" not in s]
        sets += ["data_args.channels=49", "model_args.model=mlp"]
    out = tmp_path / "earlier-run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"round": 0, "test_acc": 0.5}\n')
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    args = ["simulate", "--cf", str(MOON), "--output-dir", str(out), "--overwrite"]  # even so: kept
    args += ["--set", f"data_args.data_cache_dir={folder}", "--set", "tracking_args.enable_wandb=false"]
    for s in sets:
        args += ["--set", s]
    code, said = run(args)
    assert code == 2, said[-3000:]
    error = [line for line in said.splitlines() if "config error" in line]
    assert error and culprit in error[0] and problem in error[0] and fix in error[0], said[-3000:]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert "round 0" not in said


@pytest.mark.slow
def test_broken_data_is_refused_by_the_command_as_a_process_and_nothing_is_written_over(tmp_path):
    def process(args: list[str]) -> tuple[int, str]:
        env = {**os.environ, "HOME": str(tmp_path)}
        command = [sys.executable, "-m", "fedml_moon", *args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=ROOT, env=env)
        return done.returncode, done.stdout + done.stderr

    _refused("a file that does not decode", tmp_path, process)


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_broken_data_is_refused_through_the_command_line_and_nothing_is_written_over(name, tmp_path, capsys):
    def in_process(args: list[str]) -> tuple[int, str]:
        with restored_main() as main:
            code = main(args)
        captured = capsys.readouterr()
        return code, captured.out + captured.err

    _refused(name, tmp_path, in_process)


@pytest.mark.parametrize(
    "kw, key",
    [
        ({"classes": None}, "data_args.classes"),
        ({"channels": None}, "data_args.channels"),
        ({"classes": ["a", "b", "a"]}, "named twice"),
        ({"dataset": "fashion-mnist", "partition_method": "natural"}, "natural partitions come with"),
        ({"partition_method": "natural", "max_train_samples": 100}, "keeps every party's samples"),
        ({"dataset": "plugin"}, "data_args.plugin"),
        ({"dataset": "table", "image_size": 5}, "a table row is"),
        (
            {"dataset": "table", "image_size": None, "channels": 3, "feature_columns": ["a", "b"]},
            "2 feature_col",
        ),
        ({"test_fraction": 1.0}, "data_args.test_fraction"),
    ],
)
def test_the_agreement_is_checked_with_the_config(kw, key):
    with pytest.raises(ConfigError, match=key):
        site_args(**kw)


def test_a_natural_partition_takes_exactly_its_parties(tmp_path):
    args = site_args(
        data_cache_dir=str(party_folders(tmp_path, per_party=20, n_test=10)), partition_method="natural"
    )
    data = load_data(args, 0)
    assert data.parties.names == ("party-a", "party-b", "party-c")
    with pytest.raises(
        ConfigError, match="client_num_in_total: 4, but the data hold 3 parties .*client_num_in_total: 3"
    ):
        partition(args, data, 4, 0)
    train, test = partition(args, data, 3, 0)
    assert sum(len(t) for t in test) == len(data.y_test) and sum(len(t) for t in train) == len(data.y_train)


def test_a_public_data_set_is_held_to_what_the_config_says_of_it():
    with pytest.raises(
        ConfigError, match="data_args.channels: fashion-mnist has 1 channels, the config says 3"
    ):
        load_data(DataArgs(channels=3, max_train_samples=50, max_test_samples=20), 0)
    assert load_data(DataArgs(image_size=28, channels=1, classes=CLASSES), 0).classes == tuple(CLASSES)


def test_a_tables_labels_columns_and_parties_are_checked(tmp_path):
    import pandas as pd

    folder = write_table(tmp_path / "t", "csv", 40, 20)
    base = {"dataset": "table", "data_cache_dir": str(folder), "channels": 49, "image_size": None}
    train = pd.read_csv(folder / "train.csv")
    train.loc[3, "label"] = "jacket"
    train.to_csv(folder / "train.csv", index=False)
    with pytest.raises(ConfigError, match=r"train.csv, sample 3: class 'jacket' is not one the run names"):
        load_data(site_args(**base), 0)
    train.loc[3, "label"] = "bag"
    train["f7"] = train["f7"].astype(str) + "x"
    train.to_csv(folder / "train.csv", index=False)
    with pytest.raises(ConfigError, match=r"column 'f7' holds .* not numbers"):
        load_data(site_args(**base), 0)
    train["f7"] = 0.5
    train.loc[5, "f8"] = None
    train.to_csv(folder / "train.csv", index=False)
    with pytest.raises(ConfigError, match=r"column 'f8' has no finite value in row 5"):
        load_data(site_args(**base), 0)
    train = train.dropna()
    train.to_csv(folder / "train.csv", index=False)
    with pytest.raises(ConfigError, match=r"data_args.channels: .* 49 feature columns .* agrees on 48"):
        load_data(site_args(**{**base, "channels": 48}), 0)
    chosen = load_data(site_args(**{**base, "channels": None, "feature_columns": ["f3", "f1"]}), 0)
    assert chosen.input_shape == (2, 1, 1)
    assert chosen.x_train[0, :, 0, 0].tolist() == pytest.approx(train[["f3", "f1"]].iloc[0].tolist())
    with pytest.raises(ConfigError, match="party_column: .* has no column 'party'"):
        load_data(site_args(**base, partition_method="natural"), 0)


def test_a_plugin_that_breaks_the_agreement_is_refused(monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(
        ConfigError, match=r"wrong_shape train\[0\] has shape \(1, 32, 32\), the run agrees on"
    ):
        load_data(site_args(dataset="plugin", plugin="tests/support/site_plugin.py:wrong_shape"), 0)
    with pytest.raises(ConfigError, match="returned a dict; give \\(train, test\\)"):
        load_data(site_args(dataset="plugin", plugin="tests/support/site_plugin.py:parties"), 0)
    with pytest.raises(
        ConfigError, match="data_args.plugin: 'tests/support/site_plugin.py:nothing'.* has no 'nothing'"
    ):
        load_data(site_args(dataset="plugin", plugin="tests/support/site_plugin.py:nothing"), 0)


def test_a_silo_never_takes_its_data_folder_or_data_plugin_from_the_server():
    from fedml_moon.config.load import load_config
    from fedml_moon.distributed.deploy import shared_config, with_shared

    cfg = load_config(MOON, [])
    shared = shared_config(cfg)
    assert "data_args.dataset" in shared
    for key, value in (("data_args.plugin", "evil:load"), ("data_args.data_cache_dir", "/elsewhere")):
        assert key not in shared
        with pytest.raises(ConfigError, match=f"never takes from it: \\['{key}'\\]"):
            with_shared(cfg, {**shared, key: value})
