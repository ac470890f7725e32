"""`fedml-moon data [DIR] --cf CONFIG`: the folder read by the run's own start-up code. Invariant: for
every kind of bad site data the run refuses, the command exits 1 and prints the run's own refusal
(the very line the run's start-up reading raises), naming the file, column or party; good data pass.
A cross-silo server that reads a site's folder (no natural partition) names the switch that makes
it read nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from fedml_moon.config.schema import ConfigError
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from tests.support.cli import restored_main
from tests.support.site_data import (
    CLASSES,
    fashion,
    grey_folder,
    party_folders,
    write_hf,
    write_table,
)

pytestmark = pytest.mark.skipif(
    not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist"
)
ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "config" / "site"
FOLDER, TABLE, PARTIES, SILOS, HF = (
    SITE / f"{n}.yaml" for n in ("folder", "table", "parties", "cross_silo", "hf")
)


def _truncated(root: Path):
    grey_folder(root)
    png = next((root / "train" / "bag").glob("*.png"))
    png.write_bytes(png.read_bytes()[:40])
    return FOLDER, [], png.name


def _unnamed_class(root: Path):
    grey_folder(root)
    Image.fromarray(fashion(1, 1)[0][0], mode="L").save(root / "test" / "jacket.png")
    (root / "test" / "jacket").mkdir()
    (root / "test" / "jacket.png").rename(root / "test" / "jacket" / "0.png")
    return FOLDER, [], "jacket"


def _empty(root: Path):
    root.mkdir(parents=True)
    return FOLDER, [], "has no class folders"


def _missing_split(root: Path):
    grey_folder(root)
    (root / "train").rename(root / "training")
    return FOLDER, [], "has test/ but no train/"


def _colour(root: Path):
    grey_folder(root)
    Image.fromarray(np.zeros((28, 28, 3), dtype=np.uint8), mode="RGB").save(root / "train" / "coat" / "c.png")
    return FOLDER, [], "has 3 channel(s)"


def _broken_link(root: Path):
    grey_folder(root)
    (root / "train" / "coat" / "gone.png").symlink_to(root / "nowhere.png")
    return FOLDER, [], "gone.png"


def _table(root: Path, edit, kind: str = "csv") -> None:
    write_table(root, kind, 40, 20)
    path = root / f"train.{kind}"
    frame = edit(pd.read_csv(path) if kind == "csv" else pd.read_parquet(path))
    frame.to_csv(path, index=False) if kind == "csv" else frame.to_parquet(path, index=False)


def _unreadable_csv(root: Path):
    write_table(root, "csv", 40, 20)
    (root / "train.csv").write_bytes(b"\x00\xff\xfe garbage \x00" * 20)
    return TABLE, [], "train.csv"


def _unreadable_parquet(root: Path):
    write_table(root, "parquet", 40, 20)
    (root / "train.parquet").write_bytes(b"PAR1 cut short")
    return TABLE, [], "not a readable Parquet table"


def _text_feature(root: Path):
    _table(root, lambda f: f.assign(f3=f["f3"].astype(str) + "cm"))
    return TABLE, [], "column 'f3' holds"


def _text_labels(root: Path):
    _table(root, lambda f: f.assign(label=["a jacket" if i == 4 else c for i, c in enumerate(f["label"])]))
    return TABLE, [], "class 'a jacket' is not one the run names"


def _labels_out_of_range(root: Path):
    _table(
        root, lambda t: t.assign(label=[12 if i == 2 else CLASSES.index(v) for i, v in enumerate(t.label)])
    )
    digits = "data_args.classes=[" + ",".join(f'"{d}"' for d in range(10)) + "]"
    return TABLE, [digits], "class 12 is not one the run names"


def _no_label_column(root: Path):
    _table(root, lambda f: f.rename(columns={"label": "kind"}), "parquet")
    return TABLE, [], "has no column 'label'"


def _unlabelled_row(root: Path):
    _table(root, lambda f: f.assign(label=[None if i == 6 else c for i, c in enumerate(f["label"])]))
    return TABLE, [], "row 6 has no 'label'"


def _gap(root: Path):
    _table(root, lambda f: f.assign(f8=[np.nan if i == 5 else v for i, v in enumerate(f["f8"])]))
    return TABLE, [], "column 'f8' has no finite value in row 5"


def _feature_count(root: Path):
    _table(root, lambda f: f.drop(columns=["f48"]))
    return TABLE, [], "48 feature columns"


def _two_tables(root: Path):
    write_table(root, "csv", 40, 20)
    write_table(root, "parquet", 40, 20)
    return TABLE, [], "train.csv, train.parquet; keep one"


def _party_in_one_split(root: Path):
    write_table(root, "csv", 40, 20)
    for split, parties in (("train", ["x", "y"]), ("test", ["x", "z"])):
        frame = pd.read_csv(root / f"{split}.csv")
        frame.assign(party=[parties[i % 2] for i in range(len(frame))]).to_csv(
            root / f"{split}.csv", index=False
        )
    return TABLE, ["data_args.partition_method=natural", "train_args.client_num_in_total=2",
                   "train_args.client_num_per_round=2"], "parties ['y', 'z'] are in one split"  # fmt: skip


def _party_count(root: Path):
    party_folders(root, per_party=20, n_test=10)
    return PARTIES, ["train_args.client_num_in_total=4"], "but the data hold 3 parties"


def _no_party_folders(root: Path):
    grey_folder(root, split=False)
    for c in CLASSES:
        for p in (root / c).glob("*.png"):
            p.rename(root / f"{c}-{p.name}")
        (root / c).rmdir()
    return PARTIES, [], "which has none"


def _party_without_training(root: Path):
    party_folders(root, per_party=20, n_test=10)
    for p in (root / "party-b" / "train").rglob("*.png"):
        p.unlink()
    return PARTIES, [], "party 'party-b' holds no training samples"


def _more_parties_than_samples(root: Path):
    grey_folder(root)
    return (
        FOLDER,
        ["train_args.client_num_in_total=50", "train_args.client_num_per_round=5"],
        "50 parties but only 40",
    )


def _silo_beyond_the_folder(root: Path):
    party_folders(root, per_party=20, n_test=10)
    return SILOS, ["train_args.client_num_in_total=4"], "holds 3 parties (party-a, party-b, party-c)"


def _silo_unnamed_class(root: Path):
    _unnamed_class(root)
    return SILOS, [], "jacket"


def _hf_without_the_image_column(root: Path):
    write_hf(root, 20, 10)
    return HF, ["data_args.image_column=picture"], "has no column 'picture'"


def _plugin_of_another_shape(root: Path):
    root.mkdir(parents=True)
    return (
        FOLDER,
        ["data_args.dataset=plugin", "data_args.plugin=tests/support/site_plugin.py:wrong_shape"],
        "(1, 32, 32)",
    )


def _plugin_label_out_of_range(root: Path):
    root.mkdir(parents=True)
    (root / "plug.py").write_text(
        "import torch\n"
        "def load(args):\n"
        "    labels = torch.tensor([0, 1, 2, 12] * 2)\n"
        "    ds = torch.utils.data.TensorDataset(torch.zeros(8, 1, 28, 28), labels)\n"
        "    return ds, ds\n"
    )
    sets = ["data_args.dataset=plugin", f"data_args.plugin={root / 'plug.py'}:load"]
    return FOLDER, sets, "label 12 is no index into the run's 10 classes"


BREAKS = {
    "a truncated image": _truncated,
    "a class folder the run does not name": _unnamed_class,
    "an empty folder": _empty,
    "a missing training split": _missing_split,
    "an image of other channels": _colour,
    "a broken link": _broken_link,
    "an unreadable CSV table": _unreadable_csv,
    "an unreadable Parquet table": _unreadable_parquet,
    "a text feature column": _text_feature,
    "a text label the run does not name": _text_labels,
    "a label out of range": _labels_out_of_range,
    "no label column": _no_label_column,
    "an unlabelled row": _unlabelled_row,
    "a gap in a feature": _gap,
    "a feature column too few": _feature_count,
    "two training tables": _two_tables,
    "a party in one split only": _party_in_one_split,
    "more parties than the folder holds": _party_count,
    "a seeded partition that cannot be drawn": _more_parties_than_samples,
    "no party folders": _no_party_folders,
    "a party without training samples": _party_without_training,
    "a silo beyond a per-party folder": _silo_beyond_the_folder,
    "a silo's class the run does not name": _silo_unnamed_class,
    "a Hugging Face dataset without its image column": _hf_without_the_image_column,
    "a plugin's samples of another shape": _plugin_of_another_shape,
    "a plugin's label out of range": _plugin_label_out_of_range,
}


def _runs_refusal(config: Path, sets: list[str], folder: Path) -> str:
    """What the run's start-up reading (`load_partition`, as `build_base` calls it) raises: the
    simulation's one reading, or each silo's in turn."""
    from fedml_moon.adapters.run import load_partition
    from fedml_moon.config.load import load_config, own_data

    cfg = load_config(config, [*sets, f"data_args.data_cache_dir={folder}"])
    ranks = range(1, cfg.train_args.client_num_in_total + 1) if own_data(cfg) else [0]
    for rank in ranks:
        try:
            load_partition(cfg, rank, "silo" if own_data(cfg) else "all")
        except ConfigError as err:
            return str(err)
    raise AssertionError("the run reads this data")


def _data(args: list[str], capsys) -> tuple[int, str]:
    with restored_main() as main:
        rc = main(["data", *args])
    captured = capsys.readouterr()
    return rc, captured.out + captured.err


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_every_refusal_of_the_run_is_found_by_the_data_command_first(name, tmp_path, capsys):
    folder = tmp_path / "site"
    config, sets, named = BREAKS[name](folder)
    refusal = _runs_refusal(config, sets, folder)
    assert named in refusal
    flags = [a for s in sets for a in ("--set", s)]
    rc, said = _data([str(folder), "--cf", str(config), *flags], capsys)
    assert rc == 1, said[-2000:]
    assert "problems (" in said and f"\n  the run refuses it: {refusal}\n" in said, said[-2000:]
    assert "  refused: the first problem below" in said
    problems = said[said.index("problems (") :].splitlines()[1:]
    assert sum(named in line for line in problems) == 1, problems  # said once, in the run's words


def test_a_good_site_passes_and_is_shown_in_the_runs_class_order(tmp_path, capsys):
    folder = party_folders(tmp_path / "parties", per_party=20, n_test=10)
    rc, said = _data([str(folder / "party-c"), "--cf", str(SILOS)], capsys)
    assert rc == 0 and "problems: none" in said and "\n  passed\n" in said, said[-2000:]
    assert f"classes: {str(CLASSES).replace(chr(39), chr(34))}" in said  # the run's order, not sorted
    assert "silo rank" not in said and "the silo whose folder it is (party-c; --rank R reads" in said
    assert said.count("fedml_moon.data.silo: party ") == 1  # one site's folder: read once, as any rank's
    rc, said = _data([str(folder / "party-c"), "--cf", str(SILOS), "--rank", "3"], capsys)
    assert rc == 0 and "silo rank 3 (party 2, party-c)" in said  # the rank it is, once named
    rc, said = _data([str(folder), "--cf", str(SILOS)], capsys)  # a per-party folder: every silo's party
    assert rc == 0 and all(
        f"silo rank {r} (party {r - 1}, party-{p})" in said for r, p in zip((1, 2, 3), "abc", strict=True)
    )
    rc, said = _data(["--cf", str(PARTIES), "--set", f"data_args.data_cache_dir={folder}"], capsys)
    assert rc == 0 and "the whole data set, 3 parties" in said and "party-a train" in said


def test_the_survey_alone_names_an_empty_folder_and_a_text_column(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    rc, said = _data([str(tmp_path / "empty")], capsys)
    assert rc == 1 and "no samples: lay the images out as <class>/<file>" in said
    _text_feature(tmp_path / "t")
    rc, said = _data([str(tmp_path / "t")], capsys)
    assert rc == 1 and "train.csv: column 'f3' is not numeric" in said
    rc, said = _data([str(tmp_path / "t"), "--cf", str(TABLE), "--rank", "2"], capsys)
    assert rc == 1 and "column 'f3' holds" in said and "as silo rank 2 reads" in said


def test_a_cross_silo_server_reading_a_site_folder_names_the_natural_switch(tmp_path, capsys):
    from fedml_moon.adapters.run import load_partition
    from fedml_moon.config.load import load_config

    (tmp_path / "empty").mkdir()
    sets = ["data_args.partition_method=hetero", f"data_args.data_cache_dir={tmp_path / 'empty'}"]
    cfg = load_config(SILOS, sets)
    with pytest.raises(ConfigError, match="has no class folders.*with partition_method: natural each silo"):
        load_partition(cfg, 0, "server")
    with pytest.raises(ConfigError) as silo:
        load_partition(cfg, 1, "silo")
    assert "partition_method: natural" not in str(silo.value)
    rc, said = _data(["--cf", str(SILOS), "--rank", "0", *[a for s in sets for a in ("--set", s)]], capsys)
    assert rc == 1 and "the server reads nothing" in said
    rc, said = _data(["--cf", str(SILOS), "--rank", "0"], capsys)  # natural: the server reads nothing
    assert rc == 0 and "the server: reads no data" in said


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--cf", str(FOLDER), "--natural"], "--natural: the --cf config says these"),
        (["--cf", str(TABLE), "--dataset", "table", "--label-column", "y"], "--dataset, --label-column"),
        (["--rank", "1"], "--set and --rank go with --cf"),
        (["--set", "data_args.channels=3"], "--set and --rank go with --cf"),
        (["--cf", str(SILOS), "--rank", "-1"], "--rank -1: give 0 (the server) or a silo's rank"),
        ([], "name the site's folder, or the run's config with --cf"),
    ],
)
def test_flags_the_config_decides_or_that_need_it_are_refused(flags, named, tmp_path, capsys):
    args = [str(tmp_path)] if flags else []
    rc, said = _data([*args, *flags], capsys)
    assert rc == 2 and named in said, said
