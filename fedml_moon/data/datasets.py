"""In-memory benchmark data sets: uint8 image tensors plus the normalisation and augmentation to use."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from fedml_moon.config.schema import DATASETS
from fedml_moon.data.formats import DataFileError, load_cifar, load_mnist_like, load_tiny_imagenet
from fedml_moon.data.holdings import Holdings

logger = logging.getLogger(__name__)

DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
DEFAULT_DOWNLOAD_ROOT = "./data"
TINY_IMAGENET_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"

_STATS: dict[str, tuple[int, tuple[float, ...], tuple[float, ...], str]] = {
    "fashion-mnist": (10, (0.0,), (1.0,), "none"),
    "mnist": (10, (0.0,), (1.0,), "none"),
    "cifar10": (10, (125.3 / 255, 123.0 / 255, 113.9 / 255), (63.0 / 255, 62.1 / 255, 66.7 / 255), "cifar10"),
    "cifar100": (100, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762), "cifar100"),
    "tiny-imagenet": (200, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), "none"),  # the MOON authors' code
}
_MNIST_SUBDIRS = {"fashion-mnist": ("", "raw", "FashionMNIST/raw"), "mnist": ("", "raw", "MNIST/raw")}


class DataNotFoundError(FileNotFoundError):
    """A data set is neither on disk nor downloadable with the current settings."""


DatasetTensors = Holdings  # the former name of the one type every reader produces


def _canonical(name: str) -> str:
    key = name.strip().lower().replace("_", "-")
    if key not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    return key


def _to_tensors(name: str, arrays: tuple[np.ndarray, ...]) -> Holdings:
    num_classes, mean, std, augment = _STATS[name]
    x_train, y_train, x_test, y_test = (torch.from_numpy(np.ascontiguousarray(a)) for a in arrays)
    logger.info(
        "%s: %d train / %d test images of shape %s", name, len(x_train), len(x_test), x_train.shape[1:]
    )
    return Holdings(name, x_train, y_train, x_test, y_test, num_classes, mean, std, augment)


def _download(name: str, root: str) -> tuple:
    import torchvision

    path = Path(root)
    try:
        if name in _MNIST_SUBDIRS:
            cls = torchvision.datasets.FashionMNIST if name == "fashion-mnist" else torchvision.datasets.MNIST
            cls(root=root, train=True, download=True)
        else:
            cls = torchvision.datasets.CIFAR10 if name == "cifar10" else torchvision.datasets.CIFAR100
            cls(root=root, train=True, download=True)
    except (OSError, RuntimeError) as err:  # no network, a checksum mismatch, a full disk
        raise DataNotFoundError(f"downloading {name} into {root} failed: {err}") from None
    if name in _MNIST_SUBDIRS:
        return load_mnist_like(path, _MNIST_SUBDIRS[name][-1:])
    return load_cifar(path, _STATS[name][0])


def _local_loader(name: str, folder: Path) -> Callable[[], tuple]:
    if name in _MNIST_SUBDIRS:
        return lambda: load_mnist_like(folder, _MNIST_SUBDIRS[name])
    if name == "tiny-imagenet":
        return lambda: load_tiny_imagenet(folder, cache_dir=_user_cache_dir())
    return lambda: load_cifar(folder, _STATS[name][0])


def _user_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fedml_moon"


def _hint(name: str) -> str:
    where = "point `data_args.data_cache_dir` at a folder holding"
    if name in _MNIST_SUBDIRS:
        hint = (
            f"{where} the four idx files (train-images-idx3-ubyte[.gz], ...), "
            "or set `data_args.download: true`"
        )
        if name == "fashion-mnist":
            hint = (
                f"run `apt-get install dataset-fashion-mnist` (files go to {DEBIAN_FASHION_MNIST}), or {hint}"
            )
        return hint + " (needs network)"
    if name == "tiny-imagenet":
        return (
            f"download {TINY_IMAGENET_URL}, unzip it and {where} `tiny-imagenet-200/` (wnids.txt, "
            "train/<wnid>/images/*.JPEG, val/images/*.JPEG, val/val_annotations.txt); "
            "there is no automatic download"
        )
    folder = "cifar-10-batches-py" if name == "cifar10" else "cifar-100-python"
    return f"{where} `{folder}/` (python pickles), or set `data_args.download: true` (needs network)"


def _named_source(key: str, folder: Path, download: bool) -> tuple:
    """The folder the user named: the only source. Missing files are downloaded there when
    `download` is on; a file that is there but unreadable is an error naming it, never replaced."""
    try:
        return _local_loader(key, folder)()
    except DataFileError as err:
        fix = (
            "delete it and run again to download it anew"
            if download and key != "tiny-imagenet"
            else "replace it with an intact copy"
        )
        raise DataFileError(err.path, f"{err.problem}; {fix}") from None
    except PermissionError as err:
        path = Path(err.filename) if err.filename else folder
        raise DataFileError(path, "permission denied; give the user running this read access to it") from None
    except FileNotFoundError as err:
        if not download or key == "tiny-imagenet":
            raise DataNotFoundError(
                f"{key} not found in data_args.data_cache_dir {folder} ({err}). To get it, {_hint(key)}; "
                "or leave data_cache_dir unset to use the default sources"
            ) from None
    logger.info("downloading %s into %s", key, folder)
    return _download(key, str(folder))


def _default_sources(key: str, download: bool) -> tuple:
    """No folder named: Debian's package (Fashion-MNIST), then a download into ./data if allowed."""
    failures = []
    if key == "fashion-mnist":
        try:
            return _local_loader(key, DEBIAN_FASHION_MNIST)()
        except DataFileError as err:
            logger.warning("the Debian package's copy is unreadable: %s", err)
            failures.append(f"Debian package {DEBIAN_FASHION_MNIST}: {err}")
        except FileNotFoundError as err:
            logger.info("Debian package %s: %s", DEBIAN_FASHION_MNIST, err)
            failures.append(f"Debian package {DEBIAN_FASHION_MNIST}: {err}")
    if download and key != "tiny-imagenet":
        return _download(key, DEFAULT_DOWNLOAD_ROOT)
    tried = "; ".join(failures) if failures else "no data_cache_dir given and download is off"
    raise DataNotFoundError(f"{key} not found ({tried}). To get it, {_hint(key)}.")


def load_dataset(name: str, data_dir: str | None, download: bool = False) -> Holdings:
    """Load one of ``DATASETS`` fully into memory.

    With ``data_dir`` that folder is the only source (missing files are downloaded into it when
    ``download``). Without it, the defaults in order: for Fashion-MNIST Debian's
    ``/usr/share/datasets/fashion-mnist``, then, if ``download``, torchvision's downloader into ``./data``.

    Raises:
        ValueError: unknown ``name``.
        DataNotFoundError: no source has the data; the message says how to get it.
        DataFileError: a file is there but unreadable (truncated, corrupt); the message names it.
    """
    key = _canonical(name)
    if data_dir:
        arrays = _named_source(key, Path(data_dir).expanduser(), download)
    else:
        arrays = _default_sources(key, download)
    return _to_tensors(key, arrays)
