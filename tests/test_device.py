"""The training device reaches the data in one place: loaders are built for it, and everything an
algorithm iterates (training batches, FedSSC's prototype pass) comes from those loaders.

No GPU here, so the plumbing is checked with devices the CPU has: `meta` tensors (shapes only) for
"a loader built for a device yields tensors on it", and the distinct device object `cpu:0` for "every
algorithm's code iterates loaders built for the trainer's device" (a loader built without the device
reports plain `cpu`).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fedml_moon.core.partition import iid_partition
from fedml_moon.core.state import PartyStore
from fedml_moon.data.datasets import DatasetTensors
from fedml_moon.data.loader import PartyLoader, build_fedml_dataset
from fedml_moon.registry import ALGORITHMS
from tests.support.tiny import tiny_factory, train_args

OPTIONS = {"lg": {"split_preset": "head"}, "fedssc": {"min_class_samples": 0}}


def _tiny(augment: str = "none", side: int = 4) -> DatasetTensors:
    g = torch.Generator().manual_seed(0)
    return DatasetTensors(
        name="tiny",
        x_train=torch.randint(0, 256, (48, 1, side, side), dtype=torch.uint8, generator=g),
        y_train=torch.arange(48) % 3,
        x_test=torch.randint(0, 256, (12, 1, side, side), dtype=torch.uint8, generator=g),
        y_test=torch.arange(12) % 3,
        num_classes=3,
        mean=(0.5,),
        std=(0.25,),
        augment=augment,
    )


def _dataset(device: str | torch.device, augment: str = "none", side: int = 4) -> list:
    parts, tests = iid_partition(48, 3, seed=0), iid_partition(12, 3, seed=1)
    return build_fedml_dataset(_tiny(augment, side), parts, tests, batch_size=8, seed=0, device=device)


@pytest.mark.parametrize("augment", ["none", "cifar10", "cifar100"])
def test_every_loader_yields_on_the_device_it_was_built_for(augment):
    out = _dataset("meta", augment, side=8)  # the crops pad by 4: images of side > 4
    loaders = [out[2], out[3], *out[5].values(), *out[6].values()]
    for loader in loaders + [loader.plain() for loader in loaders]:
        assert loader.device == torch.device("meta")
        for x, y in loader:
            assert x.device.type == "meta" and y.device.type == "meta"


def test_resident_data_lives_on_the_device_and_gives_the_same_batches():
    parts, tests = iid_partition(48, 3, seed=0), iid_partition(12, 3, seed=1)
    kwargs = dict(batch_size=8, seed=0, device="cpu:0")
    host = build_fedml_dataset(_tiny("cifar10", 8), parts, tests, **kwargs)
    resident = build_fedml_dataset(_tiny("cifar10", 8), parts, tests, resident=True, **kwargs)
    for a, b in zip(host[5][1], resident[5][1], strict=True):  # same stream: same samples, same crops
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    meta = build_fedml_dataset(_tiny("cifar10", 8), parts, tests, 8, 0, device="meta", resident=True)
    assert meta[5][2].images.device.type == "meta" and next(iter(meta[5][2]))[0].device.type == "meta"


def _trainer(name: str, device: torch.device):
    from fedml_moon.adapters.trainer import PluginClientTrainer

    spec = ALGORITHMS[name]
    options = spec.options(**OPTIONS.get(name, {}))
    algo = spec.client(options, train_args(), tiny_factory(), 0)
    args = SimpleNamespace(round_idx=1)
    return PluginClientTrainer(tiny_factory()().to(device), args, algo, PartyStore())


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_iterates_only_loaders_built_for_the_trainer_device(name, monkeypatch):
    device = torch.device("cpu", 0)  # not equal to torch.device("cpu"), the default of a loader
    seen: list[tuple[torch.device, bool]] = []
    real_iter = PartyLoader.__iter__

    def spy(self):
        seen.append((self.device, self.shuffle))
        return real_iter(self)

    monkeypatch.setattr(PartyLoader, "__iter__", spy)
    trainer = _trainer(name, device)
    loader = _dataset(device)[5][1]
    trainer.train(loader, device, trainer.args)
    assert seen and all(d == device for d, _ in seen), seen
    if name == "fedssc":  # the prototype pass after training: the un-augmented, fixed-order loader
        assert any(not shuffled for _, shuffled in seen)
    assert trainer.get_model_params()["party_id"] == 1


def test_trainer_refuses_a_loader_built_for_another_device():
    trainer = _trainer("fedavg", torch.device("cpu"))
    loader = _dataset("meta")[5][0]
    with pytest.raises(ValueError, match="yields batches on meta but the trainer runs on cpu"):
        trainer.train(loader, torch.device("cpu"), trainer.args)


def test_plain_loader_keeps_the_device_and_the_samples():
    loader = _dataset("cpu")[5][2].to("meta")
    plain = loader.plain()
    assert plain.device == torch.device("meta") and not plain.shuffle and plain.augment == "none"
    assert np.array_equal(plain.indices.numpy(), loader.indices.numpy())
