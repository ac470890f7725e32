"""Checks on what a party uploads or reports, before anything of it is used. Pure PyTorch.

An upload is checked against the server algorithm's `upload_spec`: a tree of the same shape whose
tensors stand for the tensors the upload must hold (same name, shape and dtype: the full model, not
only the keys present) and whose other leaves are the values the upload must carry (its party id).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import torch


class BadUpload(RuntimeError):
    """Uploads that cannot be used, with train_args.on_bad_upload: stop (or none usable at all)."""


METRIC_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
MAX_METRICS = 32


def tensor_leaves(tree: Any, path: str = "") -> list[tuple[str, torch.Tensor]]:
    """Every tensor in a tree of dicts / lists / tuples, with its path ("model.w", "pool[0].b")."""
    if isinstance(tree, torch.Tensor):
        return [(path, tree)]
    if isinstance(tree, Mapping):
        return [t for k, v in tree.items() for t in tensor_leaves(v, f"{path}.{k}" if path else str(k))]
    if isinstance(tree, (list, tuple)):
        return [t for i, v in enumerate(tree) for t in tensor_leaves(v, f"{path}[{i}]")]
    return []


def _described(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)} {value.dtype}"
    return type(value).__name__


def spec_problem(value: Any, spec: Any, path: str) -> str | None:
    """Why `value` does not match `spec` exactly (see the module docstring), or None."""
    if isinstance(spec, torch.Tensor):
        if not isinstance(value, torch.Tensor) or value.shape != spec.shape or value.dtype != spec.dtype:
            return f"{path} is {_described(value)}, the server's is {tuple(spec.shape)} {spec.dtype}"
        return None
    if isinstance(spec, Mapping):
        if not isinstance(value, Mapping):
            return f"{path} is a {type(value).__name__}, not a dict"
        missing, extra = [k for k in spec if k not in value], [k for k in value if k not in spec]
        if missing or extra:
            said = [f"lacks {missing[:5]}"] if missing else []
            said += [f"has unexpected {[str(k)[:40] for k in extra[:5]]}"] if extra else []
            return f"{path} {' and '.join(said)}"
        for key, sub in spec.items():
            problem = spec_problem(value[key], sub, f"{path}.{key}")
            if problem is not None:
                return problem
        return None
    if type(value) is not type(spec) or value != spec:
        return f"{path} is {repr(value)[:40]}, not {spec!r}"
    return None


def metrics_problem(metrics: Any) -> str | None:
    """A party's training metrics: at most 32 names like `l_con`, each a finite number."""
    if not isinstance(metrics, Mapping) or len(metrics) > MAX_METRICS:
        return f"metrics is not a dict of at most {MAX_METRICS} numbers"
    for key, value in metrics.items():
        if not isinstance(key, str) or not METRIC_NAME.match(key):
            return f"metrics has a key {repr(key)[:40]} that is not a name"
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"metrics.{key} is {repr(value)[:40]}, not a finite number"
    return None


def upload_problem(upload: Any, spec: Mapping[str, Any], finite: bool = True) -> str | None:
    """Why `upload` cannot be used, or None: it must match `spec` (its optional `metrics` aside) and,
    with `finite`, every floating tensor in it must be finite (NaN or Inf means the party's training
    diverged, or the upload was tampered with)."""
    if not isinstance(upload, Mapping) or not isinstance(upload.get("model"), Mapping):
        return "it has no model"
    if "metrics" in upload and (problem := metrics_problem(upload["metrics"])) is not None:
        return problem
    body = {k: v for k, v in upload.items() if k != "metrics"}
    problem = spec_problem(body, spec, "upload")
    if problem is not None or not finite:
        return problem
    for path, tensor in tensor_leaves(body):
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return f"{path} holds NaN or Inf"
    return None


def report_problem(report: Any, party: int, personal: Mapping[str, Any] | None) -> str | None:
    """Why a party's evaluation report cannot be used, or None: {party_id, local_test_acc in [0, 1]}
    and, for personalised algorithms, `personal` (its own layers, matching `personal`, or None before
    it has any)."""
    if not isinstance(report, Mapping):
        return "the report is not a dict"
    allowed = {"party_id", "local_test_acc"} | ({"personal"} if personal is not None else set())
    if not {"party_id", "local_test_acc"} <= set(report) <= allowed:
        return f"the report's fields {sorted(map(str, report))[:6]} are not {sorted(allowed)}"
    if report["party_id"] != party or type(report["party_id"]) is not int:
        return f"party_id {repr(report['party_id'])[:40]} is not {party}"
    acc = report["local_test_acc"]
    if isinstance(acc, bool) or not isinstance(acc, (int, float)) or not 0.0 <= acc <= 1.0:
        return f"local_test_acc {repr(acc)[:40]} is not a number in [0, 1]"
    mine = report.get("personal")
    if personal is None or mine is None:
        return None
    problem = spec_problem(mine, personal, "personal")
    if problem is None and not all(bool(torch.isfinite(t).all()) for _, t in tensor_leaves(mine)):
        return "personal holds NaN or Inf"
    return problem


def meta_like(tensor: torch.Tensor) -> torch.Tensor:
    """A shape-and-dtype stand-in for `tensor` in a spec (no memory)."""
    return torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")
