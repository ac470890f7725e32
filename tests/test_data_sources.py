"""A source the user names is the only source: an unreadable file there is an error naming it, never
silently replaced by other data. Falling back happens only among the defaults. CIFAR's pickles are
read without running code."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedml_moon.data import datasets, formats
from fedml_moon.data.datasets import DataNotFoundError, load_dataset
from fedml_moon.data.formats import DataFileError, load_cifar, load_tiny_imagenet
from tests.support.dataset_files import write_cifar, write_mnist, write_tiny
from tests.support.processes import simulate_process


@pytest.fixture
def default_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An intact Fashion-MNIST copy standing in for Debian's package (the default source)."""
    folder = tmp_path / "debian"
    write_mnist(folder, gz=True)
    monkeypatch.setattr(datasets, "DEBIAN_FASHION_MNIST", folder)
    return folder


def _truncate(path: Path, keep: int = 100) -> None:
    path.write_bytes(path.read_bytes()[:keep])


@pytest.mark.parametrize("gz", [True, False])
def test_truncated_file_in_the_named_folder_is_an_error_naming_it(tmp_path, default_copy, gz):
    named = tmp_path / "mine"
    write_mnist(named, gz=gz)
    images = named / ("train-images-idx3-ubyte" + (".gz" if gz else ""))
    _truncate(images)
    with pytest.raises(DataFileError) as err:
        load_dataset("fashion-mnist", str(named))
    assert err.value.path == images and str(images) in str(err.value)
    assert "replace it with an intact copy" in str(err.value)
    assert load_dataset("fashion-mnist", None).x_train.shape[0] == 20  # the default copy is fine


def test_named_folder_with_download_suggests_deleting_and_downloading_again(tmp_path, default_copy):
    named = tmp_path / "mine"
    write_mnist(named, gz=True)
    _truncate(named / "t10k-labels-idx1-ubyte.gz", keep=12)
    with pytest.raises(DataFileError, match="t10k-labels-idx1-ubyte.gz: .*delete it and run again"):
        load_dataset("fashion-mnist", str(named), download=True)


def test_missing_files_in_the_named_folder_do_not_fall_back(tmp_path, default_copy):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataNotFoundError, match=f"not found in data_args.data_cache_dir {empty}") as err:
        load_dataset("fashion-mnist", str(empty))
    assert "leave data_cache_dir unset to use the default sources" in str(err.value)


def test_defaults_fall_back_to_the_download_when_the_package_copy_is_broken(tmp_path, default_copy, caplog):
    _truncate(default_copy / "train-images-idx3-ubyte.gz")
    with pytest.raises(DataNotFoundError, match="train-images-idx3-ubyte.gz: the gzip stream is truncated"):
        load_dataset("fashion-mnist", None)  # download off: nothing else to try, and the reason is named
    assert "unreadable" in caplog.text


@pytest.mark.slow
def test_cli_names_the_corrupt_file_and_exits_2(tmp_path):
    named = tmp_path / "mine"
    write_mnist(named, gz=True)
    _truncate(named / "train-images-idx3-ubyte.gz")
    proc = simulate_process(
        tmp_path / "out", "config/fashion_mnist/moon.yaml", f"data_args.data_cache_dir={named}"
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"data_args.data_cache_dir: {named / 'train-images-idx3-ubyte.gz'}" in proc.stderr
    assert "Traceback" not in proc.stderr


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_cifar_pickles_cannot_run_code(tmp_path, monkeypatch):
    write_cifar(tmp_path, 10)
    batch = tmp_path / "cifar-10-batches-py" / "data_batch_3"
    batch.write_bytes(pickle.dumps({b"data": _Exploit(), b"labels": [1]}, protocol=2))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataFileError, match=r"data_batch_3: .*asks to load (posix|os)\.system"):
        load_cifar(tmp_path, 10)
    assert not (tmp_path / "pwned").exists()


def test_cifar_batch_of_the_wrong_shape_is_named(tmp_path):
    write_cifar(tmp_path, 100)
    test = tmp_path / "cifar-100-python" / "test"
    test.write_bytes(pickle.dumps({b"data": np.zeros((2, 100), np.uint8), b"fine_labels": [0, 1]}))
    with pytest.raises(DataFileError, match="test: .*expected uint8"):
        load_cifar(tmp_path, 100)


def test_tiny_imagenet_broken_image_and_unknown_class_are_named(tmp_path):
    folder = write_tiny(tmp_path)
    bad = folder / "val" / "images" / "val_1.JPEG"
    _truncate(bad, keep=50)
    with pytest.raises(DataFileError, match="val_1.JPEG: not a readable image"):
        load_tiny_imagenet(folder)
    Image.new("RGB", (64, 64)).save(bad, format="JPEG")
    notes = folder / "val" / "val_annotations.txt"
    notes.write_text(notes.read_text() + "val_0.JPEG\tn99999999\t0\t0\t1\t1\n")
    with pytest.raises(DataFileError, match="line 4 names class 'n99999999'"):
        load_tiny_imagenet(folder)


def test_unreadable_tiny_imagenet_cache_is_rebuilt(tmp_path, caplog):
    folder = write_tiny(tmp_path)
    first = load_tiny_imagenet(folder)
    _truncate(folder / formats.TINY_IMAGENET_CACHE, keep=64)
    again = load_tiny_imagenet(folder)
    assert "ignoring unreadable cache" in caplog.text
    for got, want in zip(again, first, strict=True):
        np.testing.assert_array_equal(got, want)


def test_normalisation_and_augmentation_overrides(default_copy):
    from fedml_moon.config.schema import ConfigError, DataArgs
    from fedml_moon.data.federated import load_data

    mnist_stats = DataArgs(normalize_mean=[0.1307], normalize_std=[0.3081], augmentation="crop-flip")
    data = load_data(mnist_stats, seed=0)
    assert (data.mean, data.std, data.augment) == ((0.1307,), (0.3081,), "crop-flip")
    assert load_data(DataArgs(), seed=0).mean == (0.0,)  # the default: plain x / 255
    rgb = DataArgs(normalize_mean=[0.5, 0.5, 0.5], normalize_std=[0.5, 0.5, 0.5])
    with pytest.raises(ConfigError, match="3 values for 1-channel fashion-mnist images"):
        load_data(rgb, seed=0)


def test_tiny_imagenet_is_normalised_as_the_moon_authors(tmp_path):
    write_tiny(tmp_path)
    data = load_dataset("tiny-imagenet", str(tmp_path))
    assert data.mean == (0.5, 0.5, 0.5) and data.std == (0.5, 0.5, 0.5)
