"""Tiny files in the real formats of the public data sets (MNIST's IDX, CIFAR's pickled batches,
Tiny ImageNet's folders), filled from one seeded generator, for the tests of the on-disk readers."""

from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np
from PIL import Image

from fedml_moon.data import formats

RNG = np.random.default_rng(0)
"""The generator of every array written here, shared by the tests that draw more."""


def write_idx(path: Path, arr: np.ndarray, gz: bool) -> None:
    """`arr` as an IDX file (MNIST's format), gzipped with `gz`."""
    payload = bytes([0, 0, 0x08, arr.ndim]) + struct.pack(f">{arr.ndim}i", *arr.shape) + arr.tobytes()
    path.write_bytes(gzip.compress(payload) if gz else payload)


def write_mnist(folder: Path, gz: bool, n_train: int = 20, n_test: int = 10) -> tuple[np.ndarray, ...]:
    """MNIST's four IDX files of random images and labels in `folder`: the arrays written."""
    folder.mkdir(parents=True, exist_ok=True)
    arrays = (
        RNG.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        RNG.integers(0, 10, n_train).astype(np.uint8),
        RNG.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        RNG.integers(0, 10, n_test).astype(np.uint8),
    )
    for name, arr in zip(formats.MNIST_FILES, arrays, strict=True):
        write_idx(folder / (name + ".gz" if gz else name), arr, gz)
    return arrays


def write_cifar(root: Path, num_classes: int) -> tuple[np.ndarray, ...]:
    """CIFAR-10's or CIFAR-100's pickled batches of random images under `root`: the arrays written."""
    x_tr = RNG.integers(0, 256, (20, 3, 32, 32), dtype=np.uint8)
    y_tr = RNG.integers(0, num_classes, 20)
    x_te = RNG.integers(0, 256, (10, 3, 32, 32), dtype=np.uint8)
    y_te = RNG.integers(0, num_classes, 10)
    if num_classes == 10:
        folder, key = root / "cifar-10-batches-py", b"labels"
        files = {f"data_batch_{i + 1}": slice(4 * i, 4 * i + 4) for i in range(5)}
        splits = [(name, x_tr[s], y_tr[s]) for name, s in files.items()] + [("test_batch", x_te, y_te)]
    else:
        folder, key = root / "cifar-100-python", b"fine_labels"
        splits = [("train", x_tr, y_tr), ("test", x_te, y_te)]
    folder.mkdir(parents=True)
    for name, x, y in splits:
        batch = {b"data": x.reshape(len(x), 3072), key: [int(v) for v in y], b"batch_label": b"x"}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    return x_tr, y_tr, x_te, y_te


def write_tiny(root: Path) -> Path:
    """A Tiny ImageNet folder of two classes of plain-coloured JPEGs (one grey) under `root`."""
    folder = root / "tiny-imagenet-200"
    wnids = ["n01443537", "n01629819"]
    colours = {wnids[0]: (250, 10, 10), wnids[1]: (10, 10, 250)}
    folder.mkdir(parents=True)
    (folder / "wnids.txt").write_text("\n".join(wnids) + "\n")
    for w in wnids:
        (folder / "train" / w / "images").mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (64, 64), colours[w]).save(folder / "train" / w / "images" / f"{w}_{i}.JPEG")
    (folder / "val" / "images").mkdir(parents=True)
    lines = []
    for i, w in enumerate([wnids[1], wnids[0], wnids[1]]):
        img = Image.new("RGB", (64, 64), colours[w]) if i else Image.new("L", (64, 64), 128)
        img.save(folder / "val" / "images" / f"val_{i}.JPEG", format="JPEG")
        lines.append(f"val_{i}.JPEG\t{w}\t0\t0\t63\t63")
    (folder / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    return folder
