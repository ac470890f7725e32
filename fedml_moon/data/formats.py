"""Readers for the on-disk formats of the benchmark data sets.

Every loader returns ``(x_train, y_train, x_test, y_test)`` with images as uint8 [N, C, H, W] and
labels as int64 [N].
"""

from __future__ import annotations

import logging
import os
import pickle
import tempfile
import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from fedml_moon.data.file_error import DataFileError
from fedml_moon.data.idx import IDX_DTYPES as IDX_DTYPES
from fedml_moon.data.idx import read_idx
from fedml_moon.data.idx import write_idx as write_idx

logger = logging.getLogger(__name__)


# What the unpickler of CIFAR batches may construct: numpy arrays and the containers around them.
_ARRAY_GLOBALS = frozenset(
    {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.numeric", "_frombuffer"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),
    }
)


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles dicts, lists, bytes, numbers and numpy arrays only: no other class or function is
    looked up, so a doctored file cannot run code (CIFAR's python batches are pickles)."""

    def find_class(self, module: str, name: str) -> object:
        if (module, name) in _ARRAY_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"it asks to load {module}.{name}; a CIFAR batch holds only arrays, lists, bytes and numbers"
        )


Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]

MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
MNIST_SUBDIRS = ("", "raw", "FashionMNIST/raw", "MNIST/raw")
TINY_IMAGENET_DIR = "tiny-imagenet-200"
TINY_IMAGENET_CACHE = "tiny-imagenet-200-uint8.npz"
TINY_SIDE = 64


def _find_mnist_dir(root: Path, subdirs: Sequence[str]) -> dict[str, Path]:
    for sub in subdirs:
        folder = root / sub if sub else root
        found = {}
        for name in MNIST_FILES:
            hits = [folder / n for n in (name, name + ".gz") if (folder / n).is_file()]
            if hits:
                found[name] = hits[0]
        if len(found) == len(MNIST_FILES):
            return found
    looked = ", ".join(str(root / s) if s else str(root) for s in subdirs)
    raise FileNotFoundError(
        f"did not find all of {', '.join(MNIST_FILES)} (each optionally .gz) in any of: {looked}"
    )


def load_mnist_like(root: Path, subdirs: Sequence[str] = MNIST_SUBDIRS) -> Arrays:
    """Load MNIST / Fashion-MNIST idx files from ``root`` or its torchvision sub-folders.

    The first folder of ``root / s for s in subdirs`` holding all four files is used.

    Returns:
        x_train uint8 [N, 1, 28, 28], y_train int64 [N], x_test uint8 [M, 1, 28, 28], y_test int64 [M].
    """
    files = _find_mnist_dir(Path(root), subdirs)
    logger.info("reading idx files from %s", files[MNIST_FILES[0]].parent)
    out = []
    for img_name, lab_name in ((MNIST_FILES[0], MNIST_FILES[1]), (MNIST_FILES[2], MNIST_FILES[3])):
        x, y = read_idx(files[img_name]), read_idx(files[lab_name])
        if x.ndim != 3 or y.ndim != 1 or len(x) != len(y):
            problem = f"images {x.shape} do not match the labels {y.shape} of {files[lab_name]}"
            raise DataFileError(files[img_name], problem)
        out += [np.ascontiguousarray(x[:, None], dtype=np.uint8), y.astype(np.int64)]
    return out[0], out[1], out[2], out[3]


def _unpickle(path: Path) -> dict:
    """A CIFAR python batch through the restricted unpickler; DataFileError when it is not one."""
    try:
        with open(path, "rb") as f:
            batch = _ArrayUnpickler(f, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as err:
        raise DataFileError(
            path, f"not a readable CIFAR python batch ({err or type(err).__name__})"
        ) from None
    if not isinstance(batch, dict):
        raise DataFileError(path, f"holds a {type(batch).__name__}, not a CIFAR batch dict")
    return batch


def _cifar_arrays(files: list[Path], label_key: bytes) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for path in files:
        batch = _unpickle(path)
        if b"data" not in batch or label_key not in batch:
            raise DataFileError(path, f"has no {b'data'!r} / {label_key!r} entries (keys {sorted(batch)})")
        data, labels = np.asarray(batch[b"data"]), np.asarray(batch[label_key], dtype=np.int64)
        if data.dtype != np.uint8 or data.size != len(labels) * 3072:
            problem = f"{data.shape} {data.dtype} images for {len(labels)} labels (expected uint8 [N, 3072])"
            raise DataFileError(path, problem)
        xs.append(data.reshape(-1, 3, 32, 32))
        ys.append(labels)
    return np.ascontiguousarray(np.concatenate(xs)), np.concatenate(ys)


def load_cifar(root: Path, num_classes: int) -> Arrays:
    """Load CIFAR-10 (``cifar-10-batches-py``) or CIFAR-100 (``cifar-100-python``) python pickles.

    ``root`` is that folder or its parent.

    Returns:
        x_train uint8 [N, 3, 32, 32], y_train int64 [N], x_test uint8 [M, 3, 32, 32], y_test int64 [M].
    """
    root = Path(root)
    if num_classes == 10:
        folder_name, label_key = "cifar-10-batches-py", b"labels"
        train_names, test_names = [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"]
    elif num_classes == 100:
        folder_name, label_key = "cifar-100-python", b"fine_labels"
        train_names, test_names = ["train"], ["test"]
    else:
        raise ValueError(f"num_classes must be 10 or 100, got {num_classes}")
    folder = root / folder_name if (root / folder_name).is_dir() else root
    needed = train_names + test_names
    if not all((folder / n).is_file() for n in needed):
        raise FileNotFoundError(
            f"CIFAR-{num_classes} pickles {', '.join(needed)} not found in {root / folder_name} or {root}"
        )
    logger.info("reading CIFAR-%d pickles from %s", num_classes, folder)
    x_train, y_train = _cifar_arrays([folder / n for n in train_names], label_key)
    x_test, y_test = _cifar_arrays([folder / n for n in test_names], label_key)
    return x_train, y_train, x_test, y_test


def _tiny_folder(root: Path) -> Path:
    for folder in (root, root / TINY_IMAGENET_DIR):
        if (folder / "wnids.txt").is_file():
            return folder
    raise FileNotFoundError(f"no {TINY_IMAGENET_DIR}/wnids.txt in {root} or {root / TINY_IMAGENET_DIR}")


def _decode_images(paths: list[Path]) -> np.ndarray:
    """JPEG files -> uint8 [N, 3, 64, 64] (RGB; other sizes are resized)."""
    out = np.empty((len(paths), 3, TINY_SIDE, TINY_SIDE), dtype=np.uint8)
    for i, path in enumerate(paths):
        try:
            with Image.open(path) as img:
                rgb = img.convert("RGB")
        except FileNotFoundError:
            raise
        except (UnidentifiedImageError, OSError, SyntaxError) as err:
            raise DataFileError(path, f"not a readable image ({err})") from None
        if rgb.size != (TINY_SIDE, TINY_SIDE):
            logger.warning("resizing %s from %s to %dx%d", path, rgb.size, TINY_SIDE, TINY_SIDE)
            rgb = rgb.resize((TINY_SIDE, TINY_SIDE), Image.BILINEAR)
        out[i] = np.asarray(rgb, dtype=np.uint8).transpose(2, 0, 1)
    return out


def _tiny_file_lists(folder: Path, wnids: list[str]) -> tuple[list[Path], list[int], list[Path], list[int]]:
    index = {w: i for i, w in enumerate(wnids)}
    train_paths, train_labels = [], []
    for w in wnids:
        files = sorted((folder / "train" / w / "images").glob("*.JPEG"))
        train_paths += files
        train_labels += [index[w]] * len(files)
    val_paths, val_labels = [], []
    annotations = folder / "val" / "val_annotations.txt"
    for number, line in enumerate(annotations.read_text().splitlines(), start=1):
        fields = line.strip().split("\t")
        if len(fields) >= 2:
            if fields[1] not in index:
                raise DataFileError(annotations, f"line {number} names class {fields[1]!r}, not in wnids.txt")
            val_paths.append(folder / "val" / "images" / fields[0])
            val_labels.append(index[fields[1]])
    return train_paths, train_labels, val_paths, val_labels


def _read_cache(paths: list[Path], wnids: list[str]) -> Arrays | None:
    for path in paths:
        if path.is_file():
            try:
                with np.load(path) as z:
                    if list(z["wnids"]) == wnids:
                        logger.info("using decoded tiny-imagenet cache %s", path)
                        return z["x_train"], z["y_train"], z["x_test"], z["y_test"]
                logger.warning("ignoring cache %s: its class list differs from wnids.txt", path)
            except (OSError, ValueError, KeyError, EOFError, zlib.error, zipfile.BadZipFile) as err:
                logger.warning("ignoring unreadable cache %s (%s); decoding the JPEGs again", path, err)
    return None


def _write_cache(targets: list[Path], arrays: Arrays, wnids: list[str]) -> None:
    for target in targets:
        if not os.access(target.parent, os.W_OK):
            continue
        fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                names = ("x_train", "y_train", "x_test", "y_test")
                np.savez(f, wnids=np.array(wnids), **dict(zip(names, arrays, strict=True)))
            os.replace(tmp, target)
        except OSError as err:
            Path(tmp).unlink(missing_ok=True)
            logger.warning("could not write the tiny-imagenet cache %s: %s", target, err)
            continue
        logger.info("cached decoded tiny-imagenet arrays in %s", target)
        return
    logger.warning("no writable place for the tiny-imagenet cache among %s", [str(t) for t in targets])


def load_tiny_imagenet(root: Path, cache_dir: Path | None = None) -> Arrays:
    """Load Tiny-ImageNet (``tiny-imagenet-200`` layout; ``root`` is that folder or its parent).

    Class order is the line order of ``wnids.txt``; the test split is ``val/`` labelled by
    ``val/val_annotations.txt``. Decoded arrays are cached in ``tiny-imagenet-200-uint8.npz`` inside
    the data folder, or in ``cache_dir`` when the data folder is not writable, and reused later
    (delete the file to force decoding again).

    Returns:
        x_train uint8 [N, 3, 64, 64], y_train int64 [N], x_test uint8 [M, 3, 64, 64], y_test int64 [M].
    """
    folder = _tiny_folder(Path(root))
    wnids = [w.strip() for w in (folder / "wnids.txt").read_text().splitlines() if w.strip()]
    caches = [folder / TINY_IMAGENET_CACHE]
    if cache_dir is not None:
        caches.append(Path(cache_dir) / TINY_IMAGENET_CACHE)
    cached = _read_cache(caches, wnids)
    if cached is not None:
        return cached
    train_paths, train_labels, val_paths, val_labels = _tiny_file_lists(folder, wnids)
    logger.info("decoding %d + %d tiny-imagenet JPEGs", len(train_paths), len(val_paths))
    arrays = (
        _decode_images(train_paths),
        np.asarray(train_labels, dtype=np.int64),
        _decode_images(val_paths),
        np.asarray(val_labels, dtype=np.int64),
    )
    if cache_dir is not None and not os.access(folder, os.W_OK):
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
    _write_cache(caches, arrays, wnids)
    return arrays
