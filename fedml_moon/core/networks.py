"""Encoders by name (`model_args.model`): the four built in, any classification network of
torchvision (`torchvision:<name>`) or timm (`timm:<name>`) with its classifier removed, and a
plugin's `module:function` returning an encoder. Pure PyTorch (timm only when named).

An encoder maps a batch of the data's inputs [B, C, H, W] to representations [B, d] and says its
width d in `out_features`; `models.MoonNet` puts MOON's projection head and the classifier on it.
Every encoder is tried once on a batch of the data's shape (`probe`), so a network that cannot take
the data is refused naming both, and the width it declares is the width it gives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

from fedml_moon.core.encoders import BUILT_IN, built_in_encoder

LIBRARIES = ("torchvision", "timm")
IMAGENET_CLASSES = 1000  # the width of the classifier a library network is built with
_PLUGINS: dict[str, Callable] = {}  # plugin references already imported (by `load_plugin`)
TIMM_MISSING = "timm is not installed: pip install timm (or the package's extra: pip install -e '.[timm]')"


class LibraryEncoder(nn.Module):
    """A library network whose classifier is an identity: [B, C, H, W] -> [B, out_features]."""

    def __init__(self, net: nn.Module, out_features: int) -> None:
        super().__init__()
        self.net = net
        self.out_features = out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def kind(name: str) -> str:
    """ "built-in", "torchvision", "timm" or "plugin" (any other `module:function`); a ValueError for
    a bare name that is not built in."""
    if name in BUILT_IN:
        return "built-in"
    prefix, sep, rest = name.partition(":")
    if sep and prefix in LIBRARIES and rest:
        return prefix
    if sep and prefix and rest:
        return "plugin"
    raise ValueError(
        f"unknown model {name!r}; choose one of {', '.join(BUILT_IN)}, torchvision:<name> (e.g. "
        "torchvision:resnet18), timm:<name> (e.g. timm:resnet18) or a plugin's module:function"
    )


def kind_or_none(name: str) -> str | None:
    """`kind`, or None for a name that is none of them."""
    try:
        return kind(name)
    except ValueError:
        return None


def torchvision_names() -> list[str]:
    """The classification networks of `torchvision.models`."""
    import torchvision  # a second to import: only where a torchvision network is named

    return list(torchvision.models.list_models(module=torchvision.models))


def check_name(name: str) -> None:
    """A ValueError naming the fix unless `name` names an encoder this installation can build
    (a plugin's function is checked when it is imported: `load_plugin`)."""
    what = kind(name)
    rest = name.partition(":")[2]
    if what == "torchvision" and rest not in torchvision_names():
        raise ValueError(
            f"torchvision has no classification network {rest!r} (e.g. resnet18, efficientnet_b0, "
            f"convnext_tiny, vit_b_16; all {len(torchvision_names())}: "
            "torchvision.models.list_models(module=torchvision.models))"
        )
    if what == "timm":
        try:
            import timm
        except ImportError:
            raise ValueError(TIMM_MISSING) from None
        if not timm.is_model(rest.split(".")[0]):
            raise ValueError(f"timm has no network {rest!r} (its names: timm.list_models())")


def _torchvision(name: str, input_shape: tuple[int, int, int]) -> nn.Module:
    """torchvision's network `name` (no weights), its last Linear layer (the classifier) an identity;
    a ViT built for the data's square side (`image_size`)."""
    extra: dict = {"aux_logits": False, "init_weights": True} if name in ("googlenet", "inception_v3") else {}
    if name.startswith("vit_") and input_shape[1] == input_shape[2]:
        extra["image_size"] = input_shape[1]
    import torchvision

    net = torchvision.models.get_model(name, weights=None, **extra)
    linears = [(path, m) for path, m in net.named_modules() if isinstance(m, nn.Linear)]
    if not linears or linears[-1][1].out_features != IMAGENET_CLASSES:
        raise ValueError(
            f"torchvision:{name} does not end in a Linear classifier that could be removed; "
            "wrap it in a model plugin (module:function) that returns its features"
        )
    path, classifier = linears[-1]
    net.set_submodule(path, nn.Identity())
    return LibraryEncoder(net, classifier.in_features)


def _timm(name: str, input_shape: tuple[int, int, int]) -> nn.Module:
    """timm's network `name` (no weights) without its classifier (`num_classes=0`), built for the
    data's channels (`in_chans`) and, where the network takes one (ViTs, Swin), its size (`img_size`)."""
    try:
        import timm
    except ImportError:
        raise ValueError(TIMM_MISSING) from None
    kwargs = {"pretrained": False, "num_classes": 0, "in_chans": input_shape[0]}
    try:
        net = timm.create_model(name, img_size=tuple(input_shape[1:]), **kwargs)
    except TypeError as err:  # a network without a size to build for: the others
        if "img_size" not in str(err):
            raise
        net = timm.create_model(name, **kwargs)
    return LibraryEncoder(net, int(getattr(net, "head_hidden_size", None) or net.num_features))


def load_plugin(ref: str, search: Sequence[Path] = ()) -> Callable:
    """The function a model plugin names (`module:function`, or `path/to/file.py:function`), looked
    for on the Python path, then in `search`; imported once per reference."""
    if ref not in _PLUGINS:
        from fedml_moon.plugins import import_attribute

        fn = import_attribute(ref, "model_args.model", (*search, Path.cwd()), "my_models:encoder")
        if not callable(fn):
            raise ValueError(f"model_args.model: {ref!r} is not a function (it is a {type(fn).__name__})")
        _PLUGINS[ref] = fn
    return _PLUGINS[ref]


def _plugin(ref: str, input_shape: tuple[int, int, int]) -> nn.Module:
    """What the plugin's function returns for the data's (channels, height, width): an nn.Module
    with an integer `out_features`, or a pair (module, width)."""
    made = load_plugin(ref)(tuple(input_shape))
    encoder, width = made if isinstance(made, tuple) and len(made) == 2 else (made, None)
    width = getattr(encoder, "out_features", None) if width is None else width
    if not isinstance(encoder, nn.Module) or isinstance(width, bool) or not isinstance(width, int):
        raise ValueError(
            f"the model plugin {ref} returned {type(made).__name__}; it must return an nn.Module with an "
            "integer out_features (its representation's width), or a pair (module, width)"
        )
    encoder.out_features = width
    return encoder


def make_encoder(name: str, input_shape: tuple[int, int, int]) -> nn.Module:
    """The encoder `name` names, for inputs of `input_shape` (channels, height, width), checked on
    a batch of that shape (`probe`)."""
    what = kind(name)
    rest = name.partition(":")[2]
    if what == "torchvision":
        check_name(name)
        encoder = _torchvision(rest, input_shape)
    elif what == "timm":
        encoder = _timm(rest, input_shape)
    elif what == "plugin":
        encoder = _plugin(name, input_shape)
    else:
        return built_in_encoder(name, input_shape)
    probe(encoder, name, input_shape)
    return encoder


def probe(encoder: nn.Module, name: str, input_shape: tuple[int, int, int]) -> None:
    """Run `encoder` (in eval mode, without gradients; its mode restored) on two zero inputs of
    `input_shape`; a ValueError naming the network and the shape unless it returns [2, out_features]."""
    shape = "x".join(str(s) for s in input_shape)
    was = encoder.training
    encoder.eval()
    try:
        with torch.no_grad():
            out = encoder(torch.zeros(2, *input_shape))
    except Exception as err:  # the library's own words say what it expected
        raise ValueError(
            f"{name} cannot take the data's {shape} inputs (channels x height x width): {err}"
        ) from None
    finally:
        encoder.train(was)
    got = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
    if got != [2, encoder.out_features]:
        raise ValueError(
            f"{name} returns {got} for 2 inputs of {shape}; an encoder returns [batch, out_features] "
            f"= [2, {encoder.out_features}] (pool and flatten its feature maps, and say its width)"
        )
