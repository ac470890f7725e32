"""Checks on what a party uploads, before anything of it is averaged. Pure PyTorch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


class BadUpload(RuntimeError):
    """Uploads that cannot be used, with train_args.on_bad_upload: stop (or none usable at all)."""


def tensor_leaves(tree: Any, path: str = "") -> list[tuple[str, torch.Tensor]]:
    """Every tensor in a tree of dicts / lists / tuples, with its path ("model.w", "pool[0].b")."""
    if isinstance(tree, torch.Tensor):
        return [(path, tree)]
    if isinstance(tree, Mapping):
        return [t for k, v in tree.items() for t in tensor_leaves(v, f"{path}.{k}" if path else str(k))]
    if isinstance(tree, (list, tuple)):
        return [t for i, v in enumerate(tree) for t in tensor_leaves(v, f"{path}[{i}]")]
    return []


def upload_problem(upload: Any, reference: Mapping[str, torch.Tensor]) -> str | None:
    """Why `upload` cannot be used, or None: it must carry a `model` dict whose entries are entries
    of the server's model with the same shape and dtype, and every floating tensor in it must be
    finite (NaN or Inf means the party's training diverged, or the upload was tampered with)."""
    if not isinstance(upload, Mapping) or not isinstance(upload.get("model"), Mapping):
        return "it has no model"
    for key, value in upload["model"].items():
        ref = reference.get(key)
        if ref is None:
            return f"model entry {key!r} is not in the server's model"
        if not isinstance(value, torch.Tensor) or value.shape != ref.shape or value.dtype != ref.dtype:
            got = (
                f"{tuple(value.shape)} {value.dtype}"
                if isinstance(value, torch.Tensor)
                else type(value).__name__
            )
            return f"model entry {key!r} is {got}, the server's is {tuple(ref.shape)} {ref.dtype}"
    for path, tensor in tensor_leaves(upload):
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return f"{path} holds NaN or Inf"
    return None
