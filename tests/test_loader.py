"""Tests of PartyLoader and build_fedml_dataset."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedml_moon.core.partition import iid_partition
from fedml_moon.data.datasets import DatasetTensors
from fedml_moon.data.loader import PartyLoader, build_fedml_dataset, materialize
from tests.support.marks import cuda_only


def _indexed(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Images whose every pixel is the sample index (n <= 256) and labels equal to the index."""
    images = torch.arange(n, dtype=torch.uint8).view(n, 1, 1, 1).expand(n, 1, 2, 2).contiguous()
    return images, torch.arange(n, dtype=torch.int64)


def _epoch(loader: PartyLoader) -> list[torch.Tensor]:
    return [y for _, y in loader]


def test_each_sample_once_per_epoch() -> None:
    images, labels = _indexed(50)
    indices = np.arange(3, 50, 2)
    loader = PartyLoader(images, labels, indices, batch_size=5, shuffle=True, seed=0, party_id=2)
    assert len(loader) == 5 and loader.num_samples == 24 and loader.party_id == 2
    for _ in range(2):
        batches = list(loader)
        assert [len(y) for _, y in batches] == [5, 5, 5, 5, 4]
        seen = torch.cat([y for _, y in batches])
        assert sorted(seen.tolist()) == indices.tolist()
        for x, y in batches:
            assert x.dtype == torch.float32 and x.shape == (len(y), 1, 2, 2)
            assert torch.allclose(x[:, 0, 0, 0] * 255, y.float())


def test_drop_last() -> None:
    images, labels = _indexed(23)
    loader = PartyLoader(images, labels, np.arange(23), batch_size=5, shuffle=True, drop_last=True, seed=1)
    assert len(loader) == 4
    sizes = [len(y) for y in _epoch(loader)]
    assert sizes == [5, 5, 5, 5]
    small = PartyLoader(images, labels, np.arange(3), batch_size=5, drop_last=True)
    assert len(small) == 1 and [len(y) for y in _epoch(small)] == [3]
    empty = PartyLoader(images, labels, np.arange(0), batch_size=5, drop_last=True)
    assert len(empty) == 0 and _epoch(empty) == []


def test_fixed_order_without_shuffle() -> None:
    images, labels = _indexed(10)
    loader = PartyLoader(images, labels, np.array([7, 2, 5]), batch_size=2)
    assert [y.tolist() for y in _epoch(loader)] == [[7, 2], [5]]
    assert loader.targets.tolist() == [7, 2, 5]


def test_reproducible_and_epochs_differ() -> None:
    images, labels = _indexed(100)
    make = lambda pid: PartyLoader(images, labels, np.arange(100), 10, shuffle=True, seed=3, party_id=pid)  # noqa: E731
    a, b, other = make(0), make(0), make(1)
    ea1, ea2 = torch.cat(_epoch(a)), torch.cat(_epoch(a))
    assert torch.equal(ea1, torch.cat(_epoch(b))) and torch.equal(ea2, torch.cat(_epoch(b)))
    assert not torch.equal(ea1, ea2)
    assert not torch.equal(ea1, torch.cat(_epoch(other)))


def test_normalisation_by_hand() -> None:
    images = torch.tensor([[[[0, 51]]]], dtype=torch.uint8)  # [1, 1, 1, 2]
    x, y = next(iter(PartyLoader(images, torch.tensor([4]), [0], 1, mean=(0.1,), std=(0.5,))))
    assert torch.allclose(x, torch.tensor([[[[-0.2, 0.2]]]]), atol=1e-6)
    assert y.tolist() == [4]
    two = torch.tensor([[[[255, 0]], [[102, 204]]]], dtype=torch.uint8)  # [1, 2, 1, 2]
    x, _ = next(iter(PartyLoader(two, torch.tensor([0]), [0], 1, mean=(0.5, 0.2), std=(0.25, 0.4))))
    assert torch.allclose(x, torch.tensor([[[[2.0, -2.0]], [[0.5, 1.5]]]]), atol=1e-6)


def test_attributes_counts_and_shared_storage() -> None:
    images = torch.zeros(6, 1, 2, 2, dtype=torch.uint8)
    labels = torch.tensor([0, 2, 2, 1, 2, 0])
    loader = PartyLoader(images, labels, np.array([1, 2, 4, 5]), batch_size=3, party_id=7)
    assert loader.images.data_ptr() == images.data_ptr()
    assert (loader.party_id, loader.num_samples, loader.batch_size) == (7, 4, 3)
    assert loader.class_counts(4).tolist() == [1, 0, 3, 0]
    assert loader.to("cpu") is loader
    assert next(iter(loader))[0].device.type == "cpu"


def test_augmented_batches_are_reproducible() -> None:
    images = torch.randint(0, 256, (12, 3, 32, 32), dtype=torch.uint8)
    labels = torch.zeros(12, dtype=torch.int64)
    make = lambda: PartyLoader(images, labels, np.arange(12), 4, augment="cifar10", seed=5, party_id=0)  # noqa: E731
    a, b = [x for x, _ in make()], [x for x, _ in make()]
    assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))
    plain = images[:4].float() / 255
    assert not torch.equal(a[0], plain) and a[0].shape == plain.shape


@pytest.mark.parametrize("kind", ["none", "cifar10", "cifar100", "crop-flip"])
def test_several_parties_batches_made_as_one_equal_each_made_alone(kind: str) -> None:
    """The batched path makes the step's K batches with one gather, one augmentation and one
    normalisation (`materialize`); each party's slice is its own loader's batch, bit for bit, from the
    same draws of its own generator, and the generators end where iterating each loader leaves them."""
    g = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (72, 3, 32, 32), dtype=torch.uint8, generator=g)
    labels = torch.randint(0, 100, (72,), generator=g)
    norm = {"mean": (0.5, 0.4, 0.3), "std": (0.2, 0.25, 0.3), "augment": kind, "shuffle": True, "seed": 3}

    def loaders() -> list[PartyLoader]:
        return [PartyLoader(images, labels, np.arange(p, 72, 3), 8, party_id=p, **norm) for p in range(3)]

    alone = [list(ld) for ld in loaders()]
    together = loaders()
    streams = [ld.plans() for ld in together]
    for step in range(len(alone[0])):
        x, y = materialize(together, [next(s) for s in streams])
        assert x.shape == (3, 8, 3, 32, 32) and y.shape == (3, 8)
        for k in range(3):
            assert torch.equal(x[k], alone[k][step][0]) and torch.equal(y[k], alone[k][step][1])
    fresh = loaders()
    for ld in fresh:
        list(ld)
    assert all(
        torch.equal(a.generator.get_state(), b.generator.get_state())
        for a, b in zip(fresh, together, strict=True)
    )


@cuda_only
def test_a_resident_loader_draws_on_the_device_and_never_waits_for_it() -> None:
    """On a GPU the party's generator, its sample indices and every batch live on the device: an
    epoch of augmented batches runs under CUDA's sync debug mode set to error."""
    images = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8, device="cuda")
    labels = torch.randint(0, 10, (64,), device="cuda")
    loader = PartyLoader(images, labels, np.arange(64), 16, augment="cifar100", shuffle=True, seed=1)
    assert loader.generator.device.type == "cuda" and loader.indices.is_cuda
    torch.cuda.set_sync_debug_mode("error")
    try:
        batches = list(loader)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len(batches) == 4 and all(x.is_cuda and y.is_cuda for x, y in batches)


class _DeviceIndices(torch.Tensor):
    """Indices that, like a CUDA tensor's, cannot be read through NumPy."""

    def __array__(self, dtype=None):
        raise TypeError("can't convert a device tensor to numpy")


def test_the_plain_copy_of_a_loader_takes_its_device_indices_without_the_host() -> None:
    """`plain()` (FedSSC's prototypes, SCAFFOLD's statistics) hands the new loader this loader's
    indices, on the device where the images are resident: they are taken as a tensor, never read
    through NumPy (which a CUDA tensor refuses)."""
    images, labels = _indexed(10)
    loader = PartyLoader(images, labels, np.array([7, 2, 5, 9]), batch_size=2, shuffle=True, seed=3)
    loader.indices = torch.tensor([7, 2, 5, 9]).as_subclass(_DeviceIndices)
    plain = loader.plain(batch_size=3)
    assert [y.tolist() for y in _epoch(plain)] == [[7, 2, 5], [9]]
    assert plain.indices.dtype == torch.int64


@cuda_only
def test_the_plain_copy_of_a_resident_loader_stays_on_the_device() -> None:
    images = torch.arange(10, dtype=torch.uint8, device="cuda").view(10, 1, 1, 1).expand(10, 1, 2, 2)
    loader = PartyLoader(images.contiguous(), torch.arange(10, device="cuda"), np.array([7, 2, 5]), 2)
    plain = loader.plain()
    assert plain.indices.is_cuda and [y.tolist() for y in _epoch(plain)] == [[7, 2, 5]]


@cuda_only
def test_batches_on_cuda() -> None:
    images = torch.randint(0, 256, (10, 3, 8, 8), dtype=torch.uint8)  # reflect-padding by 4: side > 4
    labels = torch.arange(10)
    loader = PartyLoader(images, labels, np.arange(10), 4, augment="cifar10", device="cuda", shuffle=True)
    x, y = next(iter(loader))
    assert x.is_cuda and y.is_cuda


def _tiny_data(n_train: int = 40, n_test: int = 20) -> DatasetTensors:
    g = torch.Generator().manual_seed(0)
    return DatasetTensors(
        name="cifar10",
        x_train=torch.randint(0, 256, (n_train, 3, 32, 32), dtype=torch.uint8, generator=g),
        y_train=torch.arange(n_train) % 10,
        x_test=torch.randint(0, 256, (n_test, 3, 32, 32), dtype=torch.uint8, generator=g),
        y_test=torch.arange(n_test) % 10,
        num_classes=10,
        mean=(0.5, 0.5, 0.5),
        std=(0.25, 0.25, 0.25),
        augment="cifar10",
    )


def test_build_fedml_dataset() -> None:
    data = _tiny_data()
    train_parts, test_parts = iid_partition(40, 4, seed=0), iid_partition(20, 4, seed=1)
    out = build_fedml_dataset(data, train_parts, test_parts, batch_size=4, seed=0, eval_batch_size=3)
    assert len(out) == 8
    n_train, n_test, train_global, test_global, num_dict, train_local, test_local, class_num = out
    assert (n_train, n_test, class_num) == (40, 20, 10)
    assert num_dict == {0: 10, 1: 10, 2: 10, 3: 10}
    assert sorted(train_local) == sorted(test_local) == [0, 1, 2, 3]
    assert train_global.party_id is None and train_global.num_samples == 40 and len(train_global) == 14
    assert sorted(torch.cat([y for _, y in test_global]).tolist()) == sorted(data.y_test.tolist())
    for pid in range(4):
        tr, te = train_local[pid], test_local[pid]
        assert (tr.party_id, te.party_id) == (pid, pid)
        assert tr.shuffle and tr.drop_last and tr.augment == "cifar10" and len(tr) == 2
        assert not te.shuffle and not te.drop_last and te.augment == "none" and te.batch_size == 3
        assert te.targets.tolist() == data.y_test[torch.as_tensor(test_parts[pid])].tolist()
    x, _ = next(iter(test_local[0]))
    expected = (data.x_test[test_parts[0][:3]].float() / 255 - 0.5) / 0.25
    assert torch.allclose(x, expected)


def test_build_fedml_dataset_global_test_and_errors() -> None:
    data = _tiny_data()
    parts = iid_partition(40, 2, seed=0)
    out = build_fedml_dataset(data, parts, None, batch_size=8, seed=0)
    assert out.test_data_local_dict[0] is out.test_data_global is out[3]  # FedML's position, named
    assert out.test_data_local_dict[1] is out.test_data_global
    with pytest.raises(ValueError, match="2 train parts but 3 test parts"):
        build_fedml_dataset(data, parts, iid_partition(20, 3, seed=0), batch_size=8, seed=0)
