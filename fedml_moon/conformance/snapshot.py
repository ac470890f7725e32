"""What an object holds, as a tree of tensors and JSON values, and where two such trees differ.

`snapshot` turns an algorithm object (its attributes, recursively: tensors, numpy arrays and random
generators, dataclasses, containers, plain objects) into a tree that can be saved, loaded without
pickle and compared; `differences` names where two trees differ, by path, with both values. The
conformance suite compares a resumed run's server and party algorithms with the uninterrupted run's
this way, and the two paths of a party's local round tensor by tensor.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

_PLAIN = (bool, int, float, str, type(None))


def snapshot(obj: Any, depth: int = 4) -> Any:
    """A tree of tensors (on the CPU), lists, dicts with string keys and JSON values that stands for
    `obj`: what it holds, recursively to `depth` objects deep (deeper: its type's name)."""
    if isinstance(obj, _PLAIN):
        return obj
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, torch.Generator):
        return {"__generator__": obj.get_state()}
    if isinstance(obj, np.ndarray | np.generic):
        return torch.as_tensor(np.array(obj))
    if isinstance(obj, np.random.Generator):
        return {"__numpy_generator__": snapshot(obj.bit_generator.state, depth)}
    if isinstance(obj, Mapping):
        return {str(k): snapshot(v, depth) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset):
        items = sorted(obj, key=repr) if isinstance(obj, set | frozenset) else obj
        return [snapshot(v, depth) for v in items]
    if depth <= 0 or callable(obj) and not hasattr(obj, "__dict__"):
        return f"<{type(obj).__name__}>"
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
        return {"__type__": type(obj).__name__, **snapshot(fields, depth - 1)}
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        return {"__type__": type(obj).__name__, **snapshot(vars(obj), depth - 1)}
    return f"<{type(obj).__name__}>"


def describe(value: Any) -> str:
    """A value in a few words: a tensor's shape and dtype, else its repr (shortened)."""
    if isinstance(value, torch.Tensor):
        return f"a tensor {list(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _tensor_difference(path: str, a: torch.Tensor, b: torch.Tensor, atol: float, names: tuple) -> str | None:
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"{path}: {names[0]} {describe(a)}, {names[1]} {describe(b)}"
    if a.numel() == 0:
        return None
    if not a.is_floating_point():
        if torch.equal(a, b):
            return None
        gap = (a.long() - b.long()).abs()
    else:
        gap = (a.double() - b.double()).abs()
        nan = torch.isnan(a) != torch.isnan(b)
        gap = torch.where(nan, torch.full_like(gap, math.inf), torch.nan_to_num(gap, nan=0.0))
    worst = int(gap.reshape(-1).argmax())
    size = float(gap.reshape(-1)[worst])
    if size <= atol:
        return None
    where = list(np.unravel_index(worst, tuple(a.shape))) if a.dim() else []
    index = f"[{', '.join(str(int(i)) for i in where)}]" if where else ""
    va, vb = a.reshape(-1)[worst].item(), b.reshape(-1)[worst].item()
    return f"{path}{index}: {names[0]} {va:.9g}, {names[1]} {vb:.9g} (differ by {size:.3g}; allowed {atol:g})"


def differences(
    a: Any, b: Any, path: str = "", atol: float = 0.0, names: tuple[str, str] = ("one", "other")
) -> list[str]:
    """Where trees `a` and `b` differ (tensors beyond `atol`), each as "path: what each holds";
    `names` says whose value comes first and second. Empty when they agree."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        found = _tensor_difference(path or "value", a, b, atol, names)
        return [found] if found else []
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        out = []
        for key in sorted(set(a) | set(b), key=str):
            where = f"{path}.{key}" if path else str(key)
            if key not in a or key not in b:
                absent, present = (names[0], names[1]) if key not in a else (names[1], names[0])
                held = b[key] if key not in a else a[key]
                out.append(f"{where}: absent in {absent}, {describe(held)} in {present}")
            else:
                out += differences(a[key], b[key], where, atol, names)
        return out
    if isinstance(a, list | tuple) and isinstance(b, list | tuple) and len(a) == len(b):
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in differences(x, y, f"{path}[{i}]", atol, names)
        ]
    if isinstance(a, float) and isinstance(b, float) and a != b:
        gap = abs(a - b)
        if gap <= atol:
            return []
        said = f"{names[0]} {a:.9g}, {names[1]} {b:.9g} (differ by {gap:.3g}; allowed {atol:g})"
        return [f"{path or 'value'}: {said}"]
    if type(a) is not type(b) or a != b:
        return [f"{path or 'value'}: {names[0]} {describe(a)}, {names[1]} {describe(b)}"]
    return []


def same_tree(a: object, b: object, atol: float = 1e-5) -> bool:
    """Nested dicts / lists of tensors and JSON values equal (tensors to `atol`)."""
    return not differences(snapshot(a), snapshot(b), atol=atol)
