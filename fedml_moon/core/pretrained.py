"""Starting weights from a local file (`model_args.pretrained`): a safetensors file, or a state dict
saved with `torch.save` and read with `weights_only=True` (nothing un-pickled). Pure PyTorch.

A file's key matches the model's key of the same name, or that name under `encoder.` or
`encoder.net.` (where a library network sits in the model), so a torchvision or timm state dict,
an encoder's own, and a whole model of a run all load; `module.` (DistributedDataParallel's) is
dropped first. A matched key whose shape differs is not loaded. What is loaded and what is not is
returned, to be said in the log; nothing is downloaded.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

PREFIXES = ("", "encoder.", "encoder.net.")
WRAPPERS = ("model", "state_dict")  # a dict holding the state dict under one of these keys


@dataclass
class Loaded:
    """What `load_pretrained` did: the model's keys loaded from the file, the model's keys left as
    they were, the file's keys that matched none, and matched keys whose shapes differ
    (key: (file's shape, model's shape))."""

    loaded: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unused: list[str] = field(default_factory=list)
    mismatched: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)
    sha256: str = ""


def read_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file (`.safetensors`) or of a state dict saved with torch.save
    (possibly under a "model" or "state_dict" key); a ValueError naming the file otherwise."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ValueError(f"model_args.pretrained: no file {path}")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise ValueError(
            f"model_args.pretrained: {path} is neither a safetensors file (name it .safetensors) nor a "
            f"state dict torch.load reads with weights_only=True: {str(err)[:300]}"
        ) from None
    for key in WRAPPERS:
        if isinstance(state, Mapping) and isinstance(state.get(key), Mapping):
            state = state[key]
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"model_args.pretrained: {path} holds no state dict (a mapping of names to tensors)")
    return {str(k).removeprefix("module."): v for k, v in state.items()}


def sha256(path: str | Path) -> str:
    """The file's SHA-256 (hex), for the log: every process of a run reads the same weights."""
    digest = hashlib.sha256()
    with open(Path(path).expanduser(), "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_pretrained(model: nn.Module, path: str | Path) -> Loaded:
    """Copy the file's tensors into `model`'s matching keys (cast to the model's dtypes); see the
    module docstring for what matches."""
    weights = read_weights(path)
    state = model.state_dict()
    done = Loaded(sha256=sha256(path))
    taken: set[str] = set()
    for key, tensor in weights.items():
        target = next((p + key for p in PREFIXES if p + key in state and p + key not in taken), None)
        if target is None:
            done.unused.append(key)
        elif tuple(tensor.shape) != tuple(state[target].shape):
            done.mismatched[target] = (list(tensor.shape), list(state[target].shape))
        else:
            with torch.no_grad():
                state[target].copy_(tensor.to(state[target].dtype))
            taken.add(target)
    done.loaded = [k for k in state if k in taken]
    done.missing = [k for k in state if k not in taken]
    if not done.loaded:
        raise ValueError(
            f"model_args.pretrained: no tensor of {path} matches the model by name and shape (the file's "
            f"first keys: {', '.join(list(weights)[:4])}; the model's: {', '.join(list(state)[:4])})"
        )
    return done
