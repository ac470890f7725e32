"""Your network (`model_args.model`): torchvision's and timm's encoders by name, a model plugin and
starting weights from a file, as a user names them; networks the data cannot feed are refused
naming both. Runs of the modes and of the safeguards are in tests/test_network_runs.py."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
import torchvision
from safetensors.torch import save_file
from torch import nn

from fedml_moon.config.load import ConfigError, load_config
from fedml_moon.config.schema import TrainArgs
from fedml_moon.core.batched import stacking_error
from fedml_moon.core.models import MoonNet, build_model
from fedml_moon.core.networks import make_encoder
from fedml_moon.core.pretrained import load_pretrained
from fedml_moon.core.split import resolve_split
from fedml_moon.engine.pace import resolve_pace

timm = pytest.importorskip("timm")
RGB = (3, 32, 32)
CPU = torch.device("cpu")
MOON = "config/fashion_mnist/moon.yaml"


def test_a_torchvision_network_loses_its_classifier_and_gives_the_width_it_says():
    model = build_model("torchvision:resnet18", RGB, 10)
    assert model.encoder.out_features == 512  # resnet18's fc.in_features
    assert not any(isinstance(m, nn.Linear) and m.out_features == 1000 for m in model.modules())
    out = model(torch.randn(4, *RGB))
    assert out.h.shape == (4, 512) and out.z.shape == (4, 256) and out.logits.shape == (4, 10)
    net = torchvision.models.resnet18()
    assert {f"encoder.net.{k}" for k in net.state_dict() if not k.startswith("fc.")} == {
        k for k in model.state_dict() if k.startswith("encoder.")
    }


@pytest.mark.parametrize("shape", [RGB, (1, 32, 32)])
def test_a_timm_network_is_built_for_the_datas_channels(shape):
    model = build_model("timm:convnext_atto", shape, 10)  # LayerNorm, no BatchNorm
    assert any(isinstance(m, nn.LayerNorm) for m in model.modules())
    assert model(torch.randn(2, *shape)).h.shape == (2, model.encoder.out_features) == (2, 320)


@pytest.mark.parametrize(
    "name, shape", [("timm:vit_tiny_patch16_224", (1, 48, 48)), ("torchvision:vit_b_32", RGB)]
)
def test_a_vit_is_built_for_the_datas_size(name, shape):
    model = build_model(name, shape, 10)
    assert model(torch.randn(2, *shape)).h.shape == (2, model.encoder.out_features)


@pytest.mark.parametrize(
    "name, shape, said",
    [
        ("torchvision:resnet18", (1, 28, 28), "to have 3 channels"),
        ("torchvision:vit_b_16", (3, 32, 40), "Expected 224"),  # a ViT is built for a square side
        ("timm:convnext_atto", (3, 8, 8), "Kernel size can't be greater than actual input size"),
    ],
)
def test_a_network_the_data_cannot_feed_is_refused_naming_both(name, shape, said):
    with pytest.raises(ValueError, match="cannot take the data's") as err:
        build_model(name, shape, 10)
    assert name in str(err.value) and "x".join(map(str, shape)) in str(err.value) and said in str(err.value)


def test_the_run_refuses_it_naming_the_key_the_network_and_the_datas_shape(tmp_path):
    from fedml_moon.adapters.run import build_base

    cfg = load_config(MOON, ["model_args.model=torchvision:resnet18", "data_args.max_train_samples=200"])
    with pytest.raises(ConfigError, match=r"model_args.model: torchvision:resnet18 cannot take") as err:
        build_base(cfg, tmp_path / "out")
    assert "1x28x28" in str(err.value)


@pytest.mark.parametrize(
    "name, key, said",
    [
        ("torchvision:resnet19", "model_args.model", "torchvision has no classification network 'resnet19'"),
        ("timm:no_such_net", "model_args.model", "timm has no network 'no_such_net'"),
        ("resnet-50", "model_args.model", "unknown model 'resnet-50'"),
        ("no_such_module:encoder", "model_args.model", "no module 'no_such_module'"),
        ("examples/networks/groupnorm_cnn.py:nothing", "model_args.model", "has no 'nothing'"),
    ],
)
def test_a_network_that_does_not_exist_is_refused_when_the_config_is_read(name, key, said):
    with pytest.raises(ConfigError, match=key) as err:
        load_config(MOON, [f"model_args.model={name}"])
    assert said in str(err.value)


def test_squeezenet_has_no_linear_classifier_to_remove_and_is_refused():
    with pytest.raises(ValueError, match="squeezenet1_0 does not end in a Linear classifier"):
        make_encoder("torchvision:squeezenet1_0", RGB)


def test_a_model_plugin_is_found_beside_the_config_and_built_for_the_data(tmp_path):
    (tmp_path / "my_nets.py").write_text(
        "from torch import nn\n"
        "def encoder(shape):\n"
        "    c, h, w = shape\n"
        "    net = nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, 32), nn.Tanh())\n"
        "    return net, 32\n"
        "def wrong_width(shape):\n"
        "    net = nn.Sequential(nn.Flatten(), nn.Linear(784, 16))\n"
        "    net.out_features = 64\n"
        "    return net\n"
        "def not_a_module(shape):\n"
        "    return 'resnet'\n"
    )
    config = tmp_path / "run.yaml"
    config.write_text(open(MOON).read())
    cfg = load_config(config, ["model_args.model=my_nets:encoder"])
    model = build_model(cfg.model_args.model, (1, 28, 28), 10)
    assert model.encoder.out_features == 32 and model(torch.randn(3, 1, 28, 28)).h.shape == (3, 32)
    load_config(config, ["model_args.model=my_nets:wrong_width"])
    with pytest.raises(ValueError, match=r"returns \[2, 16\] for 2 inputs of 1x28x28.*\[2, 64\]"):
        build_model("my_nets:wrong_width", (1, 28, 28), 10)
    load_config(config, ["model_args.model=my_nets:not_a_module"])
    with pytest.raises(ValueError, match="returned str; it must return an nn.Module"):
        build_model("my_nets:not_a_module", (1, 28, 28), 10)


def _imagenet_file(tmp_path, kind: str):
    """torchvision's ResNet-18 as a user holds it: the whole network's state dict, fc included."""
    state = torchvision.models.resnet18().state_dict()
    path = tmp_path / f"resnet18.{kind}"
    if kind == "safetensors":
        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    else:
        torch.save(state, path)
    return state, path


@pytest.mark.parametrize("kind", ["pt", "safetensors"])
def test_starting_weights_load_the_keys_they_match_and_name_the_rest(tmp_path, kind):
    state, path = _imagenet_file(tmp_path, kind)
    torch.manual_seed(0)
    model = build_model("torchvision:resnet18", RGB, 10)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    done = load_pretrained(model, path)
    after = model.state_dict()
    assert len(done.loaded) == len(state) - 2  # all but fc.weight and fc.bias
    for key in done.loaded:
        assert torch.equal(after[key], state[key.removeprefix("encoder.net.")])
    heads = ["head.0.weight", "head.0.bias", "head.2.weight", "head.2.bias", "classifier.weight"]
    assert done.missing == [*heads, "classifier.bias"]
    assert all(torch.equal(after[k], before[k]) for k in done.missing)  # left as initialised
    assert sorted(done.unused) == ["fc.bias", "fc.weight"] and not done.mismatched


def test_a_key_whose_shape_differs_is_not_loaded_and_named(tmp_path):
    state = torchvision.models.resnet18().state_dict()
    state["conv1.weight"] = torch.randn(64, 1, 7, 7)  # a grey stem
    torch.save({"model": state}, tmp_path / "grey.pt")  # under "model", as a run's checkpoint
    model = build_model("torchvision:resnet18", RGB, 10)
    first = model.state_dict()["encoder.net.conv1.weight"].clone()
    done = load_pretrained(model, tmp_path / "grey.pt")
    assert done.mismatched == {"encoder.net.conv1.weight": ([64, 1, 7, 7], [64, 3, 7, 7])}
    assert torch.equal(model.state_dict()["encoder.net.conv1.weight"], first)


class Payload:
    """Un-pickled, it would write the file `marker` names."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_file_that_needs_unpickling_or_matches_nothing_is_refused_naming_it(tmp_path):
    bad = tmp_path / "weights.pt"
    marker = tmp_path / "ran"
    bad.write_bytes(pickle.dumps({"conv1.weight": Payload(marker)}))
    model = build_model("torchvision:resnet18", RGB, 10)
    with pytest.raises(ValueError, match=r"model_args.pretrained: .*weights.pt is neither a safetensors"):
        load_pretrained(model, bad)
    assert not marker.exists()  # nothing of the file ran
    torch.save({"layer.weight": torch.zeros(3)}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="no tensor of .*other.pt matches the model by name and shape"):
        load_pretrained(model, tmp_path / "other.pt")
    with pytest.raises(ConfigError, match="model_args.pretrained: no file"):
        load_config(MOON, [f"model_args.pretrained={tmp_path / 'missing.pt'}"])


class Branching(nn.Module):
    """An encoder that branches on a tensor's value, which vmap cannot run."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3 * 32 * 32, 8)
        self.out_features = 8

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x.flatten(1))
        return h if float(h.sum()) > 0 else -h


def test_networks_that_cannot_be_stacked_train_one_party_at_a_time():
    effnet = build_model("torchvision:efficientnet_b0", RGB, 10)  # dropout and stochastic depth
    state = torch.random.get_rng_state()
    assert stacking_error(effnet, RGB, CPU).startswith("this network draws random numbers")
    assert torch.equal(torch.random.get_rng_state(), state)
    branching = MoonNet(Branching(), 10)
    assert "calling .item() on a Tensor" in stacking_error(branching, RGB, CPU)
    assert stacking_error(build_model("torchvision:resnet18", RGB, 10), RGB, CPU) is None
    for net, said in ((effnet, "draws random numbers"), (branching, "together: streams on a CUDA device")):
        with pytest.raises(
            ConfigError, match=r"train_args.parties_in_parallel: 2 parties trained together"
        ) as e:
            resolve_pace(TrainArgs(parties_in_parallel=2), CPU, net, RGB)
        assert said in str(e.value)
    assert resolve_pace(TrainArgs(parties_in_parallel=2), CPU, build_model("mlp", RGB, 10), RGB).parallel == 2


def test_a_partys_dropout_draws_are_its_own_whatever_trained_before_it():
    from fedml_moon.core.seeds import own_random

    net = nn.Dropout(0.5)
    draws = []
    for noise in (0, 1):
        torch.manual_seed(noise)  # what drew before: another party, another process
        with own_random(7, 3, 2, CPU):
            draws.append(net(torch.ones(1000)))
        after = torch.rand(1)
        torch.manual_seed(noise)
        assert torch.equal(after, torch.rand(1))  # the run's own state, as it was
    assert torch.equal(draws[0], draws[1])
    with own_random(7, 3, 1, CPU):  # another party
        assert not torch.equal(net(torch.ones(1000)), draws[0])


def test_auto_says_why_a_network_that_cannot_stack_trains_one_party_at_a_time():
    from fedml_moon.engine.pace import _stackable

    effnet = build_model("torchvision:efficientnet_b0", RGB, 10)
    parallel, why = _stackable(TrainArgs(parties_in_parallel="auto"), CPU, effnet, RGB, (4, "fits"))
    assert parallel == 1 and why.startswith("auto: one after another: this network draws random numbers")
    mlp = build_model("mlp", RGB, 10)
    assert _stackable(TrainArgs(parties_in_parallel="auto"), CPU, mlp, RGB, (4, "fits")) == (4, "fits")


def test_lg_fedavg_splits_a_torchvision_network_at_its_last_block():
    keys = list(build_model("torchvision:resnet18", RGB, 10).state_dict())
    glob, local = resolve_split(keys, global_prefixes=["encoder.net.layer4", "head", "classifier"])
    assert glob == [k for k in keys if k.startswith(("encoder.net.layer4.", "head.", "classifier."))]
    assert "encoder.net.layer4.1.bn2.running_mean" in glob and "encoder.net.conv1.weight" in local


def test_no_network_is_downloaded_when_a_library_network_is_built(monkeypatch):
    import socket

    def refuse(*args, **kwargs):
        raise AssertionError(f"a connection was opened: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    for name in ("torchvision:resnet18", "timm:resnet18", "timm:vit_tiny_patch16_224"):
        assert build_model(name, RGB, 10)(torch.zeros(2, *RGB)).logits.shape == (2, 10)


def test_a_silo_takes_the_servers_starting_weights_and_stops_naming_a_file_it_lacks(tmp_path):
    from fedml_moon.distributed.deploy import shared_config, with_shared

    weights = tmp_path / "start.pt"
    torch.save(torchvision.models.resnet18().state_dict(), weights)
    server = load_config(MOON, ["model_args.model=torchvision:resnet18", f"model_args.pretrained={weights}"])
    silo = load_config(MOON)
    assert with_shared(silo, shared_config(server)).model_args.pretrained == str(weights)
    weights.unlink()  # this site holds no copy at the path the server names
    with pytest.raises(ConfigError, match=f"model_args.pretrained: no file '{weights}'"):
        with_shared(silo, shared_config(server))
