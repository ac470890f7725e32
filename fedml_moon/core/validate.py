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

from fedml_moon.errors import BadUpload  # noqa: F401 (raised here, caught by the command line)

METRIC_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
MAX_METRICS = 32
TENSOR = "__tensor__"  # spec_shapes' key of a tensor's shape and dtype
MAX_METRIC = 1e15  # |a training metric| above this is taken for a diverged party, as NaN is
# Every field the server writes into a round's record (engine.rounds.ServerRounds.finish_round, the
# transports' byte counts, privacy's epsilons, the simulated clock's and a buffer's fields): no
# algorithm may report a training term of these names.
SERVER_FIELDS = frozenset(
    {
        "round",
        "parties",
        "missing_parties",
        "rejected_parties",
        "train_loss",
        "loss",
        "test_acc",
        "test_loss",
        "test_acc_std",
        "test_samples",
        "pooled_test_acc",
        "pooled_test_loss",
        "site_mean_test_acc",
        "site_mean_test_loss",
        "party_test",
        "models_evaluated",
        "local_test_acc",
        "new_test_acc",
        "new_test_loss",
        "local_test_acc_best_so_far",
        "new_test_acc_best_so_far",
        "round_time_s",
        "bytes_up",
        "bytes_down",
        "params_up",
        "params_down",
        "eval_bytes_up",
        "eval_bytes_down",
        "wire_bytes_sent",
        "wire_bytes_received",
        "dp_epsilon",
        "dp_epsilon_server",
        "dp_epsilon_release",
        "dp_epsilon_sample_known",
        "dp_delta",
        "eval_parties",
        "sim_time_s",
        "staleness_mean",
        "staleness_max",
        "refused_stale",
        "updates",
        "left_out",
        "not_summed",
    }
)


def terms_problem(terms: Any) -> str | None:
    """Why an algorithm's declared loss terms (`ClientAlgorithm.terms`) cannot be recorded, or None:
    a tuple of at most 31 names like `l_con`, none of them a field the server writes."""
    if not isinstance(terms, tuple) or len(terms) >= MAX_METRICS:
        return f"terms must be a tuple of at most {MAX_METRICS - 1} names; got {terms!r:.80}"
    for name in terms:
        if not isinstance(name, str) or not METRIC_NAME.match(name):
            return f"terms has {name!r:.40}, which is not a name like l_con"
        if name in SERVER_FIELDS:
            return f"terms has {name!r}, a field the server writes into every round's record; rename it"
    return None


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


def spec_shapes(spec: Any) -> Any:
    """`spec` as JSON values, all that `spec_problem` compares: each tensor as {TENSOR: [shape,
    dtype]}, mappings entry by entry, other values as they are (a buffered task's spec, kept in a
    checkpoint)."""
    if isinstance(spec, torch.Tensor):
        return {TENSOR: [list(spec.shape), str(spec.dtype).removeprefix("torch.")]}
    if isinstance(spec, Mapping):
        return {str(k): spec_shapes(v) for k, v in spec.items()}
    return spec


def spec_from_shapes(shapes: Any) -> Any:
    """`spec_shapes`' inverse, each tensor a meta tensor (a shape and a dtype, no data)."""
    if isinstance(shapes, Mapping) and set(shapes) == {TENSOR}:
        shape, dtype = shapes[TENSOR]
        return torch.empty(shape, dtype=getattr(torch, dtype), device="meta")
    if isinstance(shapes, Mapping):
        return {k: spec_from_shapes(v) for k, v in shapes.items()}
    return shapes


def metrics_problem(metrics: Any, terms: tuple[str, ...] | None = None) -> str | None:
    """A party's training metrics, as sent: a dict of at most 32 numbers named `loss` (the total) or
    one of the algorithm's declared `terms` (None: any name like `l_con`). Their values' range is
    `metric_values_problem`'s (a diverged party's NaN is left out, not refused)."""
    if not isinstance(metrics, Mapping) or len(metrics) > MAX_METRICS:
        return f"metrics is not a dict of at most {MAX_METRICS} numbers"
    for key, value in metrics.items():
        if not isinstance(key, str) or not METRIC_NAME.match(key):
            return f"metrics has a key {repr(key)[:40]} that is not a name"
        if terms is not None and key != "loss" and key not in terms:
            return f"metrics has {key!r}, which is not one of the algorithm's terms {list(terms)} or loss"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"metrics.{key} is a {type(value).__name__}, not a number"
        if isinstance(value, int) and abs(value) > MAX_METRIC:
            digits = int(value.bit_length() * math.log10(2)) + 1  # str() of a huge int may itself fail
            return f"metrics.{key} is an integer of about {digits} digits, beyond {MAX_METRIC:g}"
    return None


def metric_values_problem(metrics: Mapping[str, float]) -> str | None:
    """Why a party's metrics (structurally sound) show a diverged party: a value that is NaN, infinite
    or beyond +-1e15 (where the round's weighted means would overflow)."""
    for key, value in metrics.items():
        if not math.isfinite(value) or abs(value) > MAX_METRIC:
            return f"metrics.{key} is {value!r}, not a finite number within +-{MAX_METRIC:g}"
    return None


def upload_problem(
    upload: Any, spec: Mapping[str, Any], finite: bool = True, terms: tuple[str, ...] | None = None
) -> str | None:
    """Why `upload` cannot be used, or None: it must match `spec` (its optional `metrics` aside, which
    `metrics_problem` checks against the algorithm's `terms`) and, with `finite`, every floating tensor
    in it must be finite and every metric within range (NaN or Inf means the party's training
    diverged, or the upload was tampered with)."""
    if not isinstance(upload, Mapping) or not isinstance(upload.get("model"), Mapping):
        return "it has no model"
    metrics = upload.get("metrics", {})
    if "metrics" in upload and (problem := metrics_problem(metrics, terms)) is not None:
        return problem
    body = {k: v for k, v in upload.items() if k != "metrics"}
    problem = spec_problem(body, spec, "upload")
    if problem is not None or not finite:
        return problem
    for path, tensor in tensor_leaves(body):
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return f"{path} holds NaN or Inf"
    return metric_values_problem(metrics)


def buffer_problem(
    model: Mapping[str, torch.Tensor], received: Mapping[str, torch.Tensor], cap: int
) -> str | None:
    """Why a party's model buffers (checked by name and meaning, not only by type) cannot come from
    local training on the model it `received`: a BatchNorm `running_var` below zero, or a counter
    (`num_batches_tracked`) outside [its received value, that + `cap`] (`cap`: the most train-mode
    forward passes the party's round allows); any other integer entry must come back as it was sent."""
    for key, value in model.items():
        sent = received.get(key)
        if key.endswith("running_var") and value.is_floating_point() and bool((value < 0).any()):
            return f"model.{key} has negative variances (min {float(value.min()):.4g})"
        if value.is_floating_point() or sent is None or sent.is_floating_point():
            continue
        if not key.endswith("num_batches_tracked"):
            if not torch.equal(value, sent.to(value.device)):
                return f"model.{key} changed; an integer entry other than a counter comes back as sent"
            continue
        low, high = int(sent.min()), int(sent.max()) + int(cap)
        if int(value.min()) < low or int(value.max()) > high:
            return f"model.{key} is {int(value.max())}, outside [{low}, {high}] (the round's local steps)"
    return None


def report_problem(
    report: Any,
    party: int,
    personal: Mapping[str, Any] | None,
    local: bool = True,
    tests: list[str] | None = None,
    test_samples: int | None = None,
) -> str | None:
    """Why a party's evaluation report cannot be used, or None: {party_id} and, as the server asked,
    `local_test_acc` in [0, 1] (`local`; for personalised algorithms with `personal`, its own layers
    matching `personal`, or None before it has any) and `test` (federated evaluation: for each model
    of `tests`, [correct, seen, loss sum] with 0 <= correct <= seen, seen its `test_samples` when the
    server holds that count, and a finite loss sum >= 0)."""
    if not isinstance(report, Mapping):
        return "the report is not a dict"
    need = {"party_id"} | ({"local_test_acc"} if local else set()) | ({"test"} if tests else set())
    allowed = need | ({"personal"} if personal is not None and local else set())
    if not need <= set(report) <= allowed:
        return f"the report's fields {sorted(map(str, report))[:6]} are not {sorted(allowed)}"
    if report["party_id"] != party or type(report["party_id"]) is not int:
        return f"party_id {repr(report['party_id'])[:40]} is not {party}"
    if tests and (problem := counts_problem(report["test"], tests, test_samples)) is not None:
        return problem
    if not local:
        return None
    acc = report["local_test_acc"]
    if isinstance(acc, bool) or not isinstance(acc, (int, float)) or not 0.0 <= acc <= 1.0:
        return f"local_test_acc {repr(acc)[:40]} is not a number in [0, 1]"
    mine = report.get("personal")
    if personal is None or mine is None:
        return None
    problem = spec_problem(mine, personal, "personal")
    if problem is None and not all(bool(torch.isfinite(t).all()) for _, t in tensor_leaves(mine)):
        return "personal holds NaN or Inf"
    return problem or buffer_problem(mine, {}, 0)


def counts_problem(test: Any, names: list[str], samples: int | None) -> str | None:
    """Why a federated evaluation's counts {model: [correct, seen, loss sum]} cannot be used, or None."""
    if not isinstance(test, Mapping) or sorted(map(str, test)) != sorted(names):
        return f"test is not counts for the models {names[:5]}"
    for name in names:
        row = test[name]
        if not isinstance(row, (list, tuple)) or len(row) != 3:
            return f"test[{name!r}] is not [correct, seen, loss sum]"
        correct, seen, loss = row
        if type(correct) is not int or type(seen) is not int or not 0 <= correct <= seen:
            return f"test[{name!r}] counts {repr(row)[:60]} are not integers 0 <= correct <= seen"
        if samples is not None and seen != samples:
            return f"test[{name!r}] counts {seen} test samples, not the {samples} its party claimed"
        if isinstance(loss, bool) or not isinstance(loss, (int, float)) or not 0 <= loss < math.inf:
            return f"test[{name!r}] loss sum {repr(loss)[:40]} is not a finite number >= 0"
    return None


def meta_like(tensor: torch.Tensor) -> torch.Tensor:
    """A shape-and-dtype stand-in for `tensor` in a spec (no memory)."""
    return torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")
