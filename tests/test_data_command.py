"""`fedml-moon data DIR`: what a site holds, and config lines that agree with it (a run started with
them reads the data), the channel statistics equal to numpy's over the decoded images, and every
problem named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from tests.support.cli import restored_main
from tests.support.site_data import MIXES, fashion, party_folders, write_hf, write_pngs, write_table

pytestmark = pytest.mark.skipif(
    not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist"
)
ROOT = Path(__file__).resolve().parent.parent


def _config_lines(text: str) -> dict:
    block = text.split("config lines that agree with it")[1].split("\n\nproblems")[0]
    return yaml.safe_load(block.split("\n", 1)[1])


def _inspect(folder: Path, *flags: str, capsys) -> tuple[int, str]:
    with restored_main() as main:
        rc = main(["data", str(folder), *flags])
    return rc, capsys.readouterr().out


def test_per_party_folders_are_counted_and_the_printed_lines_load_the_data(tmp_path, capsys):
    from fedml_moon.config.load import load_config
    from fedml_moon.data.federated import load_data

    root = party_folders(tmp_path / "parties", per_party=40, n_test=10)
    rc, text = _inspect(root, "--natural", capsys=capsys)
    assert rc == 0 and "problems: none" in text and "3 parties (party-a, party-b, party-c)" in text
    lines = _config_lines(text)
    assert lines["train_args"]["client_num_in_total"] == 3 and lines["data_args"]["channels"] == 1
    pixels = np.concatenate(
        [np.asarray(Image.open(p), dtype=np.float64).ravel() / 255 for p in sorted(root.rglob("*.png"))]
    )
    assert lines["data_args"]["normalize_mean"] == [round(pixels.mean(), 4)]
    assert lines["data_args"]["normalize_std"] == [round(pixels.std(), 4)]
    sets = [
        f"{s}.{k}={yaml.safe_dump(v, default_flow_style=True).strip()}"
        for s, kv in lines.items()
        for k, v in kv.items()
    ]
    cfg = load_config(ROOT / "config" / "fashion_mnist" / "moon.yaml", sets)
    data = load_data(cfg.data_args, 0)
    assert data.parties.names == tuple(sorted(MIXES)) and data.mean == tuple(
        lines["data_args"]["normalize_mean"]
    )
    row = [line for line in text.splitlines() if line.strip().startswith("boot")][0].split()
    assert row[1:] == ["0", "0", "0", "0", str(len(list((root / "party-c" / "test" / "boot").glob("*")))),
                       str(len(list((root / "party-c" / "train" / "boot").glob("*"))))]  # fmt: skip


def test_problems_are_named_and_the_command_exits_1(tmp_path, capsys):
    x, y, _, _ = fashion(30, 1)
    write_pngs(tmp_path / "site", x, y)
    (tmp_path / "site" / "bag" / "notes.txt").write_text("taken on the old scanner")
    (tmp_path / "site" / "coat" / "cut.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    Image.fromarray(np.zeros((32, 32, 3), dtype=np.uint8)).save(tmp_path / "site" / "coat" / "colour.png")
    (tmp_path / "site" / "stray.png").write_bytes(b"")
    rc, text = _inspect(tmp_path / "site", capsys=capsys)
    assert rc == 1
    for said in (
        "left out (no image extension): bag/notes.txt",
        "does not decode: coat/cut.png",
        "left out (not in a class folder): stray.png",
        "mixed channel counts {1: 30, 3: 1}",
    ):
        assert said in text, text
    assert "28x28: 30, 32x32: 1" in text


def test_tables_and_hugging_face_datasets_are_read_as_a_run_reads_them(tmp_path, capsys):
    rc, text = _inspect(write_table(tmp_path / "csv", "csv", 40, 10), capsys=capsys)
    lines = _config_lines(text)["data_args"]
    assert rc == 0 and lines["dataset"] == "table" and lines["channels"] == 49 and lines["image_size"] == 1
    assert "feature columns (49): f0, f1" in text
    rc, text = _inspect(write_hf(tmp_path / "hf", 40, 10), capsys=capsys)
    lines = _config_lines(text)["data_args"]
    assert rc == 0 and lines["dataset"] == "hf" and lines["channels"] == 1 and lines["image_size"] == 28


def test_a_missing_folder_is_refused(tmp_path, capsys):
    for flags in ([], ["--cf", str(ROOT / "config" / "site" / "folder.yaml")]):
        with restored_main() as main:
            rc = main(["data", str(tmp_path / "nowhere"), *flags])
        assert rc == 2 and "nowhere: no such folder" in capsys.readouterr().err


@pytest.mark.slow
def test_the_command_line_entry_point_checks_a_folder_against_the_run(tmp_path):
    x, y, _, _ = fashion(30, 1)
    write_pngs(tmp_path / "site" / "jacket", x[:2], y[:2])  # a class folder the run does not name
    write_pngs(tmp_path / "site", x, y)
    command = [sys.executable, "-m", "fedml_moon", "data", str(tmp_path / "site")]
    done = subprocess.run(
        [*command, "--cf", "config/site/folder.yaml"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "the run refuses it: data_args.classes: " in done.stdout and "jacket" in done.stdout
