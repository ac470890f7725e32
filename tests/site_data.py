"""A site's own data, written in the formats people hold from real Fashion-MNIST images: PNG folders
(per party, with different class mixes), CSV / Parquet tables, a saved Hugging Face dataset."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from fedml_moon.data.formats import load_mnist_like

CLASSES = ["tshirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "boot"]
# party -> the classes it holds: party-a lacks "bag", party-c alone holds "boot"
MIXES = {
    "party-a": [0, 1, 2, 3, 4, 5, 6, 7],
    "party-b": [0, 2, 4, 6, 7, 8],
    "party-c": [1, 3, 5, 8, 9],
}
SITE = {  # the config lines a site's Fashion-MNIST folders agree to
    "data_args.classes": "[" + ",".join(CLASSES) + "]",
    "data_args.image_size": "28",
    "data_args.channels": "1",
}


def site_sets(extra: dict[str, str] | None = None) -> list[str]:
    """`--set` overrides for the agreement (and `extra`)."""
    return [f"{k}={v}" for k, v in {**SITE, **(extra or {})}.items()]


def fashion(n_train: int = 600, n_test: int = 200, offset: int = 0) -> tuple[np.ndarray, ...]:
    """The first Fashion-MNIST images after `offset`: x uint8 [N, 28, 28], y int64 [N]."""
    x_train, y_train, x_test, y_test = load_mnist_like(DEBIAN_FASHION_MNIST)
    tr, te = slice(offset, offset + n_train), slice(offset, offset + n_test)
    return x_train[tr, 0], y_train[tr], x_test[te, 0], y_test[te]


def write_pngs(folder: Path, x: np.ndarray, y: np.ndarray, keep: list[int] | None = None) -> int:
    """``folder/<class>/<i>.png`` for every image whose class is in `keep` (all by default)."""
    n = 0
    for i, (img, label) in enumerate(zip(x, y, strict=True)):
        if keep is not None and int(label) not in keep:
            continue
        target = folder / CLASSES[int(label)] / f"{i:05d}.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img, mode="L").save(target)
        n += 1
    return n


def party_folders(root: Path, per_party: int = 300, n_test: int = 100, split: bool = True) -> Path:
    """``root/<party>/{train,test}/<class>/*.png`` (or ``root/<party>/<class>/`` without `split`),
    each party its own images and class mix (`MIXES`)."""
    for k, (party, keep) in enumerate(MIXES.items()):
        x, y, xt, yt = fashion(per_party * 2, n_test * 2, offset=k * per_party * 2)
        if split:
            write_pngs(root / party / "train", x, y, keep)
            write_pngs(root / party / "test", xt, yt, keep)
        else:
            write_pngs(root / party, x, y, keep)
    return root


def table_frame(x: np.ndarray, y: np.ndarray, side: int = 7, party: list[str] | None = None):
    """Images pooled to `side` x `side` as feature columns f0.., the class name in `label`."""
    import pandas as pd

    k = 28 // side
    pooled = x.reshape(len(x), side, k, side, k).mean(axis=(2, 4)) / 255.0
    df = pd.DataFrame(pooled.reshape(len(x), -1), columns=[f"f{i}" for i in range(side * side)])
    df["label"] = [CLASSES[int(c)] for c in y]
    if party is not None:
        df["party"] = party
    return df


def write_table(root: Path, kind: str = "csv", n_train: int = 600, n_test: int = 200) -> Path:
    """``root/train.<kind>`` and ``root/test.<kind>``: 49 features, a label column."""
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
