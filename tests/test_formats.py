"""Tests of the on-disk readers and load_dataset, on tiny files written in the real formats."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from fedml_moon.data import datasets, formats
from fedml_moon.data.datasets import DATASETS, DataNotFoundError, load_dataset
from fedml_moon.data.formats import DataFileError, load_cifar, load_mnist_like, load_tiny_imagenet, read_idx
from tests.support.dataset_files import RNG, write_cifar, write_idx, write_mnist, write_tiny


def _check_mnist(loaded: tuple[np.ndarray, ...], written: tuple[np.ndarray, ...]) -> None:
    x_tr, y_tr, x_te, y_te = loaded
    assert x_tr.dtype == np.uint8 and x_tr.shape == (20, 1, 28, 28)
    assert y_tr.dtype == np.int64 and x_te.shape == (10, 1, 28, 28)
    np.testing.assert_array_equal(x_tr[:, 0], written[0])
    np.testing.assert_array_equal(y_tr, written[1])
    np.testing.assert_array_equal(x_te[:, 0], written[2])
    np.testing.assert_array_equal(y_te, written[3])


@pytest.mark.parametrize("gz", [False, True])
def test_read_idx_round_trip(tmp_path: Path, gz: bool) -> None:
    arr = RNG.integers(0, 256, (3, 4, 5), dtype=np.uint8)
    path = tmp_path / "misleading-name.gz"
    write_idx(path, arr, gz)
    out = read_idx(path)
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out, arr)


def test_a_plain_big_endian_idx_file_reads_in_the_machines_byte_order(tmp_path: Path) -> None:
    values = np.array([[1, -2, 70000], [0, 2**31 - 1, -(2**31)]], dtype=np.int32)
    head = bytes([0, 0, 0x0C, 2]) + struct.pack(">2i", *values.shape)
    (tmp_path / "ints").write_bytes(head + values.astype(">i4").tobytes())
    out = read_idx(tmp_path / "ints")
    assert out.dtype == np.int32 and out.dtype.isnative and np.array_equal(out, values)


def test_read_idx_rejects_bad_files(tmp_path: Path) -> None:
    (tmp_path / "junk").write_bytes(b"\x01\x02\x03\x04\x05")
    with pytest.raises(DataFileError, match="junk: not an IDX file"):
        read_idx(tmp_path / "junk")
    write_idx(tmp_path / "short", np.zeros((2, 3), np.uint8), gz=False)
    (tmp_path / "short").write_bytes((tmp_path / "short").read_bytes()[:-1])
    with pytest.raises(DataFileError, match="short: header says"):
        read_idx(tmp_path / "short")
    (tmp_path / "long").write_bytes((tmp_path / "short").read_bytes() + b"\x00\x00")  # one byte too many
    with pytest.raises(DataFileError, match=r"long: header says \(2, 3\) x 1 bytes, found 7"):
        read_idx(tmp_path / "long")
    write_idx(tmp_path / "cut.gz", np.zeros((200, 30), np.uint8), gz=True)
    (tmp_path / "cut.gz").write_bytes((tmp_path / "cut.gz").read_bytes()[:20])
    with pytest.raises(DataFileError, match="cut.gz: the gzip stream is truncated or corrupt"):
        read_idx(tmp_path / "cut.gz")


def test_a_large_gzip_file_is_decoded_once_and_read_again_when_written_again(tmp_path, monkeypatch):
    """What `read_idx` keeps is keyed by the bytes read: the same file written again in place (same
    name, inode and size, within the same clock tick) reads as its new content; each caller's array
    is its own; a corrupt stream is refused, kept or not."""
    from fedml_moon.data import idx

    monkeypatch.setattr(idx, "_kept", {})
    path = tmp_path / "images.gz"
    first = RNG.integers(0, 256, (1500, 28, 28), dtype=np.uint8)  # random bytes: ~1.2 MB compressed
    write_idx(path, first, gz=True)
    assert path.stat().st_size >= idx.KEPT_FROM_BYTES
    a, b = read_idx(path), read_idx(path)
    assert len(idx._kept) == 1 and np.array_equal(a, first) and np.array_equal(b, first)
    a[0, 0, 0] ^= 0xFF  # a caller's change stays its own
    assert np.array_equal(read_idx(path), first) and a.flags.writeable
    second = first.copy()
    second[700, 14, 14] ^= 0xFF
    inode, size = path.stat().st_ino, path.stat().st_size
    write_idx(path, second, gz=True)
    assert (path.stat().st_ino, path.stat().st_size) == (inode, size)
    assert np.array_equal(read_idx(path), second)
    path.write_bytes(path.read_bytes()[: idx.KEPT_FROM_BYTES + 10])
    with pytest.raises(DataFileError, match="images.gz: the gzip stream is truncated or corrupt"):
        read_idx(path)
    other = tmp_path / "other.gz"  # what is kept stays within KEPT_BYTES: the oldest go first
    write_idx(other, first[:1400], gz=True)
    monkeypatch.setattr(idx, "KEPT_BYTES", first.nbytes + 10)
    assert np.array_equal(read_idx(other), first[:1400])
    assert [a.shape for a in idx._kept.values()] == [(1400, 28, 28)]
    monkeypatch.setattr(idx, "KEPT_BYTES", first.nbytes - 1)  # a file larger than that is not kept
    write_idx(path, first, gz=True)
    assert np.array_equal(read_idx(path), first) and len(idx._kept) == 1


@pytest.mark.parametrize(
    "sub,gz", [("", True), ("raw", False), ("FashionMNIST/raw", True), ("MNIST/raw", False)]
)
def test_load_mnist_like_layouts(tmp_path: Path, sub: str, gz: bool) -> None:
    written = write_mnist(tmp_path / sub if sub else tmp_path, gz)
    _check_mnist(load_mnist_like(tmp_path), written)


def test_load_mnist_like_subdir_choice_and_missing(tmp_path: Path) -> None:
    fashion = write_mnist(tmp_path / "FashionMNIST" / "raw", gz=True)
    digits = write_mnist(tmp_path / "MNIST" / "raw", gz=False)
    _check_mnist(load_mnist_like(tmp_path, ("", "MNIST/raw")), digits)
    _check_mnist(load_mnist_like(tmp_path, ("", "FashionMNIST/raw")), fashion)
    (tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(FileNotFoundError, match=r"t10k-labels-idx1-ubyte.*MNIST/raw"):
        load_mnist_like(tmp_path, ("", "MNIST/raw"))


@pytest.mark.parametrize("num_classes", [10, 100])
def test_load_cifar_round_trip(tmp_path: Path, num_classes: int) -> None:
    written = write_cifar(tmp_path, num_classes)
    sub = "cifar-10-batches-py" if num_classes == 10 else "cifar-100-python"
    for root in (tmp_path, tmp_path / sub):
        loaded = load_cifar(root, num_classes)
        assert loaded[0].shape == (20, 3, 32, 32) and loaded[1].dtype == np.int64
        for got, want in zip(loaded, written, strict=True):
            np.testing.assert_array_equal(got, want)
    with pytest.raises(FileNotFoundError, match="test_batch" if num_classes == 10 else "test"):
        load_cifar(tmp_path / "nowhere", num_classes)


def test_load_tiny_imagenet_and_cache(tmp_path: Path) -> None:
    folder = write_tiny(tmp_path)
    x_tr, y_tr, x_te, y_te = load_tiny_imagenet(tmp_path)
    assert x_tr.shape == (6, 3, 64, 64) and x_tr.dtype == np.uint8 and x_te.shape == (3, 3, 64, 64)
    np.testing.assert_array_equal(y_tr, [0, 0, 0, 1, 1, 1])
    np.testing.assert_array_equal(y_te, [1, 0, 1])
    assert np.abs(x_tr[:3].mean(axis=(0, 2, 3)) - [250, 10, 10]).max() < 4
    assert np.abs(x_te[0].astype(float) - 128).max() < 4
    assert (folder / formats.TINY_IMAGENET_CACHE).is_file()
    for jpeg in folder.rglob("*.JPEG"):
        jpeg.unlink()
    again = load_tiny_imagenet(folder)
    for got, want in zip(again, (x_tr, y_tr, x_te, y_te), strict=True):
        np.testing.assert_array_equal(got, want)


def test_tiny_imagenet_cache_dir_when_read_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = write_tiny(tmp_path / "data")
    real_access = formats.os.access
    monkeypatch.setattr(formats.os, "access", lambda p, mode: Path(p) != folder and real_access(p, mode))
    cache = tmp_path / "cache"
    first = load_tiny_imagenet(folder, cache_dir=cache)
    assert not (folder / formats.TINY_IMAGENET_CACHE).exists()
    assert (cache / formats.TINY_IMAGENET_CACHE).is_file()
    (folder / "train").rename(tmp_path / "moved")
    np.testing.assert_array_equal(load_tiny_imagenet(folder, cache_dir=cache)[0], first[0])


def test_load_dataset_from_data_dir(tmp_path: Path) -> None:
    written = write_cifar(tmp_path, 10)
    data = load_dataset("CIFAR10", str(tmp_path))
    assert data.name == "cifar10" and data.num_classes == 10 and data.augment == "cifar10"
    assert data.input_shape == (3, 32, 32) and data.x_train.dtype == torch.uint8
    assert data.y_test.dtype == torch.int64
    np.testing.assert_array_equal(data.x_test.numpy(), written[2])
    assert data.mean == pytest.approx((125.3 / 255, 123.0 / 255, 113.9 / 255))
    mnist = write_mnist(tmp_path / "MNIST" / "raw", gz=True)
    digits = load_dataset("mnist", str(tmp_path))
    assert (digits.mean, digits.std, digits.augment, digits.input_shape) == (
        (0.0,),
        (1.0,),
        "none",
        (1, 28, 28),
    )
    np.testing.assert_array_equal(digits.y_train.numpy(), mnist[1])


def test_load_dataset_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="cifar100, tiny-imagenet"):
        load_dataset("svhn", None)
    monkeypatch.setattr(datasets, "DEBIAN_FASHION_MNIST", tmp_path / "absent")
    with pytest.raises(DataNotFoundError, match="apt-get install dataset-fashion-mnist") as err:
        load_dataset("fashion-mnist", str(tmp_path))
    assert "data_args.download: true" in str(err.value) and "data_args.data_cache_dir" in str(err.value)
    with pytest.raises(DataNotFoundError, match="data_args.download: true"):
        load_dataset("mnist", None)
    with pytest.raises(DataNotFoundError, match="tiny-imagenet-200.zip"):
        load_dataset("tiny-imagenet", str(tmp_path), download=True)
    assert issubclass(DataNotFoundError, FileNotFoundError) and len(DATASETS) == 5


@pytest.mark.skipif(not datasets.DEBIAN_FASHION_MNIST.is_dir(), reason="dataset-fashion-mnist not installed")
def test_load_fashion_mnist_from_debian_package() -> None:
    data = load_dataset("fashion_mnist", None)
    assert data.x_train.shape == (60000, 1, 28, 28) and data.x_test.shape == (10000, 1, 28, 28)
    assert torch.bincount(data.y_train).tolist() == [6000] * 10
    assert torch.bincount(data.y_test).tolist() == [1000] * 10
    assert data.x_train.dtype == torch.uint8 and int(data.x_train.max()) == 255


def test_an_idx_file_written_reads_back_as_it_was(tmp_path):
    from fedml_moon.data.formats import read_idx, write_idx

    array = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    write_idx(tmp_path / "x-idx3-ubyte", array)
    back = read_idx(tmp_path / "x-idx3-ubyte")
    assert back.dtype == np.uint8 and np.array_equal(back, array)
