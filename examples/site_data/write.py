"""Write Fashion-MNIST the ways a site holds its own data, to try every reader of `fedml-moon`:

    OUT/folder/{train,test}/<class>/*.png   one site's image folder (torchvision's ImageFolder layout)
    OUT/parties/<party>/{train,test}/<class>/*.png
                                            three parties' folders, each its own class mix
    OUT/rgb/<party>/...                     the same in RGB, the grey in 3 channels (with --rgb)
    OUT/csv/{train,test}.csv, OUT/parquet/{train,test}.parquet
                                            tables: 49 features (the images pooled to 7x7), a label
    OUT/hf/                                 a Hugging Face DatasetDict saved with save_to_disk
    OUT/npz/images.npz                      arrays, for the dataset plugin beside this file

    .venv/bin/python examples/site_data/write.py data/site

It reads Debian's dataset-fashion-mnist (`apt-get install dataset-fashion-mnist`).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np
from PIL import Image

from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from fedml_moon.data.formats import load_mnist_like

log = logging.getLogger("write_site_data")
CLASSES = ["tshirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "boot"]
MIXES = {  # party -> the classes it holds: party-a lacks "bag", party-c alone holds "boot"
    "party-a": [0, 1, 2, 3, 4, 5, 6, 7],
    "party-b": [0, 2, 4, 6, 7, 8],
    "party-c": [1, 3, 5, 8, 9],
}


def fashion(n_train: int, n_test: int, offset: int = 0, test_offset: int = 0) -> tuple[np.ndarray, ...]:
    """Fashion-MNIST's training images from `offset` and test images from `test_offset`:
    x uint8 [N, 28, 28], y int64 [N], for train and test."""
    x_train, y_train, x_test, y_test = load_mnist_like(DEBIAN_FASHION_MNIST)
    tr, te = slice(offset, offset + n_train), slice(test_offset, test_offset + n_test)
    return x_train[tr, 0], y_train[tr], x_test[te, 0], y_test[te]


def write_pngs(
    folder: Path, x: np.ndarray, y: np.ndarray, keep: list[int] | None = None, mode: str = "L"
) -> int:
    """``folder/<class>/<i>.png`` for every image whose class is in `keep` (all by default), grey
    (`mode` "L") or with the grey repeated in three channels ("RGB")."""
    n = 0
    for i, (img, label) in enumerate(zip(x, y, strict=True)):
        if keep is None or int(label) in keep:
            target = folder / CLASSES[int(label)] / f"{i:05d}.png"
            target.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(img, mode="L").convert(mode).save(target)
            n += 1
    return n


def party_folders(
    root: Path, per_party: int = 300, n_test: int = 100, split: bool = True, mode: str = "L"
) -> Path:
    """``root/<party>/{train,test}/<class>/*.png`` (``root/<party>/<class>/`` without `split`), each
    party other images and its own class mix (`MIXES`), about `per_party` training images, in PIL
    `mode` (`write_pngs`)."""
    for k, (party, keep) in enumerate(MIXES.items()):
        x, y, xt, yt = fashion(per_party * 2, n_test * 2, k * per_party * 2, k * n_test * 2)
        write_pngs(root / party / ("train" if split else ""), x, y, keep, mode)
        if split:
            write_pngs(root / party / "test", xt, yt, keep, mode)
    return root


def table_frame(x: np.ndarray, y: np.ndarray, side: int = 7):
    """Images pooled to `side` x `side` as features f0.. (values in [0, 1]), the class name in `label`."""
    import pandas as pd

    k = 28 // side
    pooled = x.reshape(len(x), side, k, side, k).mean(axis=(2, 4)) / 255.0
    frame = pd.DataFrame(pooled.reshape(len(x), -1), columns=[f"f{i}" for i in range(side * side)])
    frame["label"] = [CLASSES[int(c)] for c in y]
    return frame


def write_table(root: Path, kind: str = "csv", n_train: int = 600, n_test: int = 200) -> Path:
    """``root/train.<kind>`` and ``root/test.<kind>`` (csv or parquet): 49 features and a label."""
    x, y, xt, yt = fashion(n_train, n_test)
    root.mkdir(parents=True, exist_ok=True)
    for name, frame in (("train", table_frame(x, y)), ("test", table_frame(xt, yt))):
        path = root / f"{name}.{kind}"
        frame.to_csv(path, index=False) if kind == "csv" else frame.to_parquet(path, index=False)
    return root


def write_hf(root: Path, n_train: int = 600, n_test: int = 200) -> Path:
    """A DatasetDict (train, test) saved with `save_to_disk`: an Image column and a ClassLabel."""
    import datasets

    x, y, xt, yt = fashion(n_train, n_test)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=CLASSES)})

    def split(xs: np.ndarray, ys: np.ndarray) -> datasets.Dataset:
        images = [Image.fromarray(img, mode="L") for img in xs]
        return datasets.Dataset.from_dict({"image": images, "label": [int(c) for c in ys]}, features=features)

    datasets.DatasetDict(train=split(x, y), test=split(xt, yt)).save_to_disk(str(root))
    return root


def write_npz(root: Path, n_train: int = 600, n_test: int = 200) -> Path:
    """``root/images.npz``: x_train, y_train, x_test, y_test (what plugin.py reads)."""
    x, y, xt, yt = fashion(n_train, n_test)
    root.mkdir(parents=True, exist_ok=True)
    np.savez(root / "images.npz", x_train=x, y_train=y, x_test=xt, y_test=yt)
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the folder to write into (made if missing)")
    parser.add_argument("--train", type=int, default=6000, help="training images of a site (default 6000)")
    parser.add_argument("--test", type=int, default=1000, help="test images of a site (default 1000)")
    parser.add_argument("--rgb", action="store_true", help="also rgb/: the parties' folders in 3 channels")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    n, t = args.train, args.test
    x, y, xt, yt = fashion(n, t)
    write_pngs(args.out / "folder" / "train", x, y)
    write_pngs(args.out / "folder" / "test", xt, yt)
    party_folders(args.out / "parties", n // 2, t // 2)
    if args.rgb:
        party_folders(args.out / "rgb", n // 2, t // 2, mode="RGB")
    write_table(args.out / "csv", "csv", n, t)
    write_table(args.out / "parquet", "parquet", n, t)
    write_npz(args.out / "npz", n, t)
    try:
        write_hf(args.out / "hf", n, t)
    except ImportError:
        log.info("hf/ left out: Hugging Face datasets is not installed (pip install 'fedml_moon[hf]')")
    log.info("wrote %s: folder/, parties/, csv/, parquet/, npz/, hf/", args.out)


if __name__ == "__main__":
    main()
