"""The MOON model family: shapes of (h, z, logits), head removal, encoders."""

import pytest
import torch

from fedml_moon.core.models import build_model


@pytest.mark.parametrize(
    "name, shape, d",
    [("simple-cnn", (3, 32, 32), 84), ("simple-cnn", (1, 28, 28), 84), ("mlp", (1, 28, 28), 128)],
)
def test_forward_shapes_with_and_without_head(name, shape, d):
    x = torch.randn(5, *shape)
    h, z, logits = build_model(name, shape, 10, use_head=True, out_dim=256)(x)
    assert h.shape == (5, d) and z.shape == (5, 256) and logits.shape == (5, 10)
    h, z, logits = build_model(name, shape, 10, use_head=False)(x)
    assert torch.equal(h, z) and logits.shape == (5, 10)


def test_simple_cnn_layer_sizes_follow_the_paper():
    cifar = build_model("simple-cnn", (3, 32, 32), 10)
    fmnist = build_model("simple-cnn", (1, 28, 28), 10)
    assert cifar.encoder.fc1.in_features == 16 * 5 * 5 and fmnist.encoder.fc1.in_features == 16 * 4 * 4
    assert (cifar.encoder.conv1.out_channels, cifar.encoder.conv2.out_channels) == (6, 16)
    head = [m for m in cifar.head if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in head] == [(84, 84), (84, 256)]
    assert cifar.classifier.in_features == 256


def test_mlp_is_lg_fedavgs_784_512_256_256_128_10():
    model = build_model("mlp", (1, 28, 28), 10, use_head=False)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [
        (784, 512),
        (512, 256),
        (256, 256),
        (256, 128),
        (128, 10),
    ]


def test_resnet50_has_a_cifar_stem():
    model = build_model("resnet50", (3, 32, 32), 100)
    net = model.encoder.net
    assert net.conv1.kernel_size == (3, 3) and net.conv1.stride == (1, 1)
    assert isinstance(net.maxpool, torch.nn.Identity)
    model.eval()
    h, z, logits = model(torch.randn(2, 3, 32, 32))
    assert h.shape == (2, 2048) and z.shape == (2, 256) and logits.shape == (2, 100)


def test_unknown_model_lists_choices():
    with pytest.raises(ValueError, match="simple-cnn, lg-cnn, resnet50, mlp"):
        build_model("vgg", (3, 32, 32), 10)


def test_lg_cnn_is_the_authors_cifar_cnn():
    """LG-FedAvg's CNNCifar: conv 6 and 16 channels, fc 400-120-100, output 100 -> 10."""
    net = build_model("lg-cnn", (3, 32, 32), 10, use_head=False)
    enc = net.encoder
    assert (enc.conv1.out_channels, enc.conv2.out_channels) == (6, 16)
    assert [(m.in_features, m.out_features) for m in (enc.fc1, enc.fc2, net.classifier)] == [
        (400, 120),
        (120, 100),
        (100, 10),
    ]
    assert sum(p.numel() for p in net.parameters()) == 64102  # as the authors' model


@pytest.mark.parametrize("activation", ["softmax", "log-softmax"])
def test_output_activation_is_applied_to_the_logits(activation):
    torch.manual_seed(0)
    plain = build_model("mlp", (1, 28, 28), 10, use_head=False)
    torch.manual_seed(0)
    wrapped = build_model("mlp", (1, 28, 28), 10, use_head=False, output_activation=activation)
    x = torch.randn(4, 1, 28, 28)
    logits, out = plain(x)[2], wrapped(x)[2]
    if activation == "softmax":  # the authors' MLP: a softmax under the cross-entropy
        assert torch.allclose(out, logits.softmax(1)) and torch.allclose(out.sum(1), torch.ones(4))
    else:  # CNNCifar: log-softmax, which the cross-entropy leaves unchanged
        assert torch.allclose(out, logits.log_softmax(1))
        y = torch.arange(4)
        assert torch.allclose(
            torch.nn.functional.cross_entropy(out, y), torch.nn.functional.cross_entropy(logits, y)
        )
    with pytest.raises(ValueError, match="output_activation"):
        build_model("mlp", (1, 28, 28), 10, output_activation="relu")
