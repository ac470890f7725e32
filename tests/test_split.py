"""LG-FedAvg global/local state-dict split: layer grouping, presets, counts, prefixes, errors."""

import pytest
import torch

from fedml_moon.core.models import build_model
from fedml_moon.core.split import (
    PRESETS,
    SplitError,
    count_params,
    layers,
    merge_states,
    resolve_split,
    split_state,
    validate_split,
)


def wb(*modules):
    return [f"{m}.{p}" for m in modules for p in ("weight", "bias")]


@pytest.fixture(scope="module")
def mlp():
    return build_model("mlp", (1, 28, 28), 10, use_head=False).state_dict()


@pytest.fixture(scope="module")
def cnn():
    return build_model("simple-cnn", (3, 32, 32), 10, use_head=True).state_dict()


@pytest.fixture(scope="module")
def cnn_nohead():
    return build_model("simple-cnn", (3, 32, 32), 10, use_head=False).state_dict()


def test_layers_in_model_order(mlp, cnn):
    names = [n for n, _ in layers(list(mlp))]
    assert names == [
        f"encoder.{n}" for n in ("layer_input", "layer_hidden1", "layer_hidden2", "layer_hidden3")
    ] + ["classifier"]
    groups = layers(list(cnn))
    assert [n for n, _ in groups] == [
        "encoder.conv1",
        "encoder.conv2",
        "encoder.fc1",
        "encoder.fc2",
        "head.0",
        "head.2",
        "classifier",
    ]
    assert groups[0][1] == ["encoder.conv1.weight", "encoder.conv1.bias"]
    assert [k for _, ks in groups for k in ks] == list(cnn)


def test_layers_group_batchnorm_buffers_with_their_module():
    keys = list(build_model("resnet50", (3, 32, 32), 10, use_head=False).state_dict())
    groups = dict(layers(keys))
    assert list(groups)[:2] == ["encoder.net.conv1", "encoder.net.bn1"]
    assert groups["encoder.net.bn1"] == [
        f"encoder.net.bn1.{p}"
        for p in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
    ]
    assert sorted(k for ks in groups.values() for k in ks) == sorted(keys)


def test_preset_mnist_mlp(mlp):
    glob, loc = resolve_split(list(mlp), preset="mnist-mlp")
    assert glob == wb("encoder.layer_hidden2", "encoder.layer_hidden3", "classifier")
    assert loc == wb("encoder.layer_input", "encoder.layer_hidden1")
    assert count_params(mlp, glob) == 256 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10
    assert count_params(mlp, glob) + count_params(mlp, loc) == sum(t.numel() for t in mlp.values())


def test_preset_mnist_mlp_refuses_the_projection_head_and_other_models(cnn):
    """Before: with the head, 'top 3 layers' silently meant head.0, head.2 and the classifier."""
    with_head = build_model("mlp", (1, 28, 28), 10, use_head=True).state_dict()
    for state in (with_head, cnn):
        with pytest.raises(SplitError, match="needs model_args.model: mlp with use_projection_head: false"):
            resolve_split(list(state), preset="mnist-mlp")


def test_preset_cifar_cnn(cnn, cnn_nohead):
    for state in (cnn, cnn_nohead):
        glob, loc = resolve_split(list(state), preset="cifar-cnn")
        assert glob == wb("encoder.conv1", "encoder.conv2")
        assert loc == [k for k in state if k not in glob]
    assert count_params(cnn, wb("encoder.conv1", "encoder.conv2")) == 3 * 6 * 25 + 6 + 6 * 16 * 25 + 16


def test_preset_cifar_cnn_needs_conv_layers(mlp):
    with pytest.raises(SplitError, match="conv"):
        resolve_split(list(mlp), preset="cifar-cnn")


def test_preset_head(cnn, cnn_nohead, mlp):
    glob, loc = resolve_split(list(cnn), preset="head")
    assert glob == wb("head.0", "head.2", "classifier")
    assert loc == wb("encoder.conv1", "encoder.conv2", "encoder.fc1", "encoder.fc2")
    assert resolve_split(list(cnn_nohead), preset="head")[0] == wb("classifier")
    assert resolve_split(list(mlp), preset="head")[0] == wb("classifier")


def test_unknown_preset_lists_presets(mlp):
    with pytest.raises(SplitError, match="split_preset") as err:
        resolve_split(list(mlp), preset="nope")
    assert all(name in str(err.value) for name in PRESETS)


def test_from_top_and_bottom(cnn):
    keys = list(cnn)
    assert resolve_split(keys, from_top=1)[0] == wb("classifier")
    assert resolve_split(keys, from_top=3)[0] == wb("head.0", "head.2", "classifier")
    glob, loc = resolve_split(keys, from_bottom=2)
    assert glob == wb("encoder.conv1", "encoder.conv2") and loc == keys[4:]


@pytest.mark.parametrize("kw", [{"from_top": 0}, {"from_top": 8}, {"from_bottom": -1}, {"from_bottom": 2.5}])
def test_count_out_of_range(cnn, kw):
    with pytest.raises(SplitError, match=r"\[1, 7\]"):
        resolve_split(list(cnn), **kw)


def test_all_layers_global_is_fedavg(cnn):
    with pytest.raises(SplitError, match="fedavg"):
        resolve_split(list(cnn), from_top=7)
    glob, loc = resolve_split(list(cnn), from_top=7, allow_empty_local=True)
    assert glob == list(cnn) and loc == []


def test_prefixes_match_whole_components():
    keys = wb("encoder.fc1", "encoder.fc10", "classifier")
    glob, loc = resolve_split(keys, global_prefixes=["encoder.fc1"])
    assert glob == wb("encoder.fc1") and loc == wb("encoder.fc10", "classifier")
    assert resolve_split(keys, global_prefixes=["classifier."])[0] == wb("classifier")
    with pytest.raises(SplitError, match="encoder.fc"):
        resolve_split(keys, global_prefixes=["encoder.fc"])


def test_prefixes_on_a_real_model(cnn):
    glob, _ = resolve_split(list(cnn), global_prefixes=("head", "encoder.conv2"))
    assert glob == wb("encoder.conv2", "head.0", "head.2")


def test_unknown_prefix_names_it_and_lists_layers(cnn):
    with pytest.raises(SplitError, match="encoder.conv3") as err:
        resolve_split(list(cnn), global_prefixes=["encoder.conv3", "head"])
    assert "Available layers" in str(err.value) and "encoder.fc2" in str(err.value)


def test_prefix_covering_everything(cnn):
    with pytest.raises(SplitError, match="no local layers"):
        resolve_split(list(cnn), global_prefixes=["encoder", "head", "classifier"])


def test_exactly_one_way(cnn):
    with pytest.raises(SplitError, match="no split given"):
        resolve_split(list(cnn))
    with pytest.raises(SplitError, match="split_preset.*global_layers_from_top"):
        resolve_split(list(cnn), preset="head", from_top=2)


def test_validate_split_names_bad_keys():
    keys = ["a.w", "b.w", "c.w"]
    validate_split(keys, ["a.w"], ["b.w", "c.w"])
    with pytest.raises(SplitError) as err:
        validate_split(keys, ["a.w", "b.w"], ["b.w", "z.w"])
    msg = str(err.value)
    assert "both" in msg and "'b.w'" in msg
    assert "neither" in msg and "'c.w'" in msg
    assert "unknown" in msg and "'z.w'" in msg
    with pytest.raises(SplitError, match="nothing is federated"):
        validate_split(keys, [], keys)


def test_split_merge_round_trip(cnn):
    glob, loc = resolve_split(list(cnn), preset="head")
    g, lo = split_state(cnn, glob), split_state(cnn, loc)
    assert list(g) == glob and list(lo) == loc
    merged = merge_states(g, lo)
    assert sorted(merged) == sorted(cnn)
    assert all(torch.equal(merged[k], cnn[k]) for k in cnn)
    model = build_model("simple-cnn", (3, 32, 32), 10, use_head=True)
    model.load_state_dict(merged)


def test_merge_later_parts_win():
    a = {"x": torch.zeros(2), "y": torch.zeros(1)}
    merged = merge_states(a, {"x": torch.ones(2)})
    assert list(merged) == ["x", "y"] and torch.equal(merged["x"], torch.ones(2))
