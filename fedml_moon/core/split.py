"""LG-FedAvg's global/local split of a state dict (Liang et al., "Think Locally, Act Globally").

GLOBAL keys are averaged by the server and travel both ways; LOCAL keys stay with each party and
are never sent. A split is given in exactly one of four ways (config `algorithm_args.*`):
`split_preset`, `global_prefixes`, `global_layers_from_top` or `global_layers_from_bottom`.
Layers are module paths in state-dict (input to output) order. Pure PyTorch.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence

import torch

MNIST_MLP_GLOBAL = ("encoder.layer_hidden2", "encoder.layer_hidden3", "classifier")
PRESETS: dict[str, str] = {
    "mnist-mlp": "the authors' MNIST MLP split: its top 3 layers (layer_hidden2, layer_hidden3 and the "
    "output layer) global; the mlp model without the projection head",
    "cifar-cnn": "the authors' CIFAR CNN split: the convolution layers (names containing 'conv') global, "
    "the fully connected layers, head and classifier local",
    "head": "local representation, global head: `head` (when present) and `classifier` global, encoder local",
}

_WAYS = (
    "algorithm_args.split_preset",
    "algorithm_args.global_prefixes",
    "algorithm_args.global_layers_from_top",
    "algorithm_args.global_layers_from_bottom",
)


class SplitError(ValueError):
    """A global/local split that cannot be used; the message names the keys and the config fix."""


def _module_path(key: str) -> str:
    """The module a state-dict key belongs to (the key itself for a top-level parameter)."""
    return key.rsplit(".", 1)[0] if "." in key else key


def layers(keys: Sequence[str]) -> list[tuple[str, list[str]]]:
    """Group keys into layers (module paths), in first-seen order; every key in exactly one layer.

    BatchNorm buffers (running_mean, running_var, num_batches_tracked) share their module's layer.
    """
    groups: OrderedDict[str, list[str]] = OrderedDict()
    for key in keys:
        groups.setdefault(_module_path(key), []).append(key)
    return list(groups.items())


def _matches(key: str, prefix: str) -> bool:
    """Prefix match on whole dotted components: `a.fc1` matches `a.fc1.weight`, not `a.fc10.weight`."""
    return key == prefix or key.startswith(prefix + ".")


def _by_prefixes(keys: Sequence[str], prefixes: Sequence[str]) -> list[str]:
    """Keys under any of `prefixes`; every prefix must match at least one key."""
    cleaned = [p.strip().rstrip(".") for p in prefixes]
    if not cleaned or any(not p for p in cleaned):
        raise SplitError(
            f"algorithm_args.global_prefixes must be non-empty module names; got {list(prefixes)}"
        )
    unmatched = [p for p in cleaned if not any(_matches(k, p) for k in keys)]
    if unmatched:
        names = ", ".join(name for name, _ in layers(keys))
        raise SplitError(
            f"algorithm_args.global_prefixes {unmatched} match no state-dict key; prefixes match whole "
            f"dotted components. Available layers: {names}"
        )
    return [k for k in keys if any(_matches(k, p) for p in cleaned)]


def _by_count(keys: Sequence[str], n: int, from_top: bool) -> list[str]:
    """Keys of the last (from_top) or first n layers."""
    groups = layers(keys)
    option = _WAYS[2] if from_top else _WAYS[3]
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(groups):
        raise SplitError(
            f"{option} must be an integer in [1, {len(groups)}] (the model has {len(groups)} layers)"
        )
    chosen = groups[len(groups) - n :] if from_top else groups[:n]
    members = {k for _, ks in chosen for k in ks}
    return [k for k in keys if k in members]


def _by_preset(keys: Sequence[str], preset: str) -> list[str]:
    """Global keys of a named preset (see PRESETS)."""
    if preset == "mnist-mlp":
        has = [any(_matches(k, m) for k in keys) for m in (*MNIST_MLP_GLOBAL, "head")]
        if not all(has[:-1]) or has[-1]:
            raise SplitError(
                "algorithm_args.split_preset 'mnist-mlp' is the authors' MLP split (layer_hidden2, "
                "layer_hidden3 and the output layer global) and needs model_args.model: mlp with "
                "use_projection_head: false; with the projection head, name the global layers with "
                "algorithm_args.global_prefixes, e.g. [encoder.layer_hidden2, encoder.layer_hidden3, head, "
                "classifier]"
            )
        return _by_prefixes(keys, MNIST_MLP_GLOBAL)
    if preset == "cifar-cnn":
        convs = [name for name, _ in layers(keys) if "conv" in name.rsplit(".", 1)[-1]]
        if not convs:
            raise SplitError(
                "algorithm_args.split_preset 'cifar-cnn' needs layers whose names contain 'conv'; this model "
                f"has none ({', '.join(n for n, _ in layers(keys))}). Use algorithm_args.global_prefixes."
            )
        return _by_prefixes(keys, convs)
    if preset == "head":
        present = [p for p in ("head", "classifier") if any(_matches(k, p) for k in keys)]
        if not present:
            raise SplitError("algorithm_args.split_preset 'head' needs a `head` or `classifier` module")
        return _by_prefixes(keys, present)
    known = "; ".join(f"{name!r}: {text}" for name, text in PRESETS.items())
    raise SplitError(f"unknown algorithm_args.split_preset {preset!r}; choose one of {known}")


def validate_split(
    keys: Sequence[str],
    global_keys: Iterable[str],
    local_keys: Iterable[str],
    *,
    allow_empty_local: bool = False,
) -> None:
    """Raise SplitError unless global and local keys are disjoint, cover `keys` and are all known.

    Global must be non-empty (else nothing is federated); local must be non-empty unless
    `allow_empty_local` (an LG split with no local layers is plain FedAvg).
    """
    known, glob, loc = set(keys), list(global_keys), list(local_keys)
    problems = []
    both = sorted(set(glob) & set(loc))
    assigned = set(glob) | set(loc)
    neither = [k for k in keys if k not in assigned]
    unknown = sorted(assigned - known)
    if both:
        problems.append(f"keys in both global and local: {both}")
    if neither:
        problems.append(f"keys in neither global nor local: {neither}")
    if unknown:
        problems.append(f"unknown keys (not in the model's state dict): {unknown}")
    if problems:
        raise SplitError("invalid global/local split; " + "; ".join(problems))
    if not glob:
        raise SplitError(
            f"the split has no global keys, so nothing is federated; choose some via one of {_WAYS}"
        )
    if not loc and not allow_empty_local:
        raise SplitError(
            "the split makes every key global (no local layers): that is plain FedAvg; use algorithm fedavg "
            "or make fewer layers global (algorithm_args.global_prefixes / global_layers_from_top / _bottom)"
        )


def resolve_split(
    keys: Sequence[str],
    *,
    preset: str | None = None,
    global_prefixes: Sequence[str] | None = None,
    from_top: int | None = None,
    from_bottom: int | None = None,
    allow_empty_local: bool = False,
) -> tuple[list[str], list[str]]:
    """(global_keys, local_keys) in state-dict order, from exactly one of the four ways; validated."""
    given = [
        way
        for way, v in zip(_WAYS, (preset, global_prefixes, from_top, from_bottom), strict=True)
        if v is not None
    ]
    if len(given) != 1:
        what = f"conflicting options {given}" if given else "no split given"
        raise SplitError(f"{what}: set exactly one of {', '.join(_WAYS)}")
    if preset is not None:
        chosen = _by_preset(keys, preset)
    elif global_prefixes is not None:
        if isinstance(global_prefixes, str):
            global_prefixes = [global_prefixes]
        chosen = _by_prefixes(keys, global_prefixes)
    else:
        count = from_top if from_top is not None else from_bottom
        chosen = _by_count(keys, count, from_top=from_top is not None)  # type: ignore[arg-type]
    members = set(chosen)
    global_keys = [k for k in keys if k in members]
    local_keys = [k for k in keys if k not in members]
    validate_split(keys, global_keys, local_keys, allow_empty_local=allow_empty_local)
    return global_keys, local_keys


def split_state(state: Mapping[str, torch.Tensor], keys: Sequence[str]) -> OrderedDict:
    """The sub-dict of `state` for `keys`, in the given key order (KeyError on a missing key)."""
    return OrderedDict((k, state[k]) for k in keys)


def merge_states(*parts: Mapping[str, torch.Tensor]) -> OrderedDict:
    """Combine state dicts (e.g. global and local parts) into one; later parts win on shared keys."""
    out: OrderedDict = OrderedDict()
    for part in parts:
        out.update(part)
    return out


def count_params(state: Mapping[str, torch.Tensor], keys: Iterable[str]) -> int:
    """Total number of elements of `state[k]` over `keys`."""
    return sum(int(state[k].numel()) for k in keys)
