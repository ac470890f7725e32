"""What `fedml-moon check` asks of the run's network (`model_args.model`: built in, a library's, or a
model plugin's) before the algorithm's checks: that it is built for the data's inputs, that the
run's seed builds the same weights in every process, that its state is tensors the server can hold,
and whether parties can train it stacked (torch.func) or one at a time."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from fedml_moon.conformance.inprocess import quiet_base
from fedml_moon.core.batched import stacking_error

Found = tuple[str, bool, str, str]  # a check's name, whether it passed, why not, a note (`checks.Check`)


def _found(name: str, ok: bool, detail: str = "", note: str = "") -> Found:
    return name, ok, detail, note


def network_checks(config: str | Path, overrides: list[str]) -> tuple[list[Found], str | None]:
    """(the checks, why the network cannot be stacked or None). Builds the run's first model twice
    (`adapters.run.build_base`, in a folder removed after)."""
    with tempfile.TemporaryDirectory(prefix="fedml-moon-network-") as tmp:
        try:
            first = quiet_base(config, overrides, Path(tmp) / "a")
        except Exception as err:
            return [_found("the network is built for the data's inputs", False, f"{err}")], None
        again = quiet_base(config, overrides, Path(tmp) / "b")
    model, shape = first.model, first.fed.data.input_shape
    name = first.cfg.model_args.model
    width = model.encoder.out_features
    checks = [
        _found(f"the network is built for the data's inputs ({name}: {shape} -> [batch, {width}])", True)
    ]
    a, b = model.state_dict(), again.model.state_dict()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    checks.append(
        _found(
            "the run's seed builds the same weights twice (every process starts from one model)",
            not differ,
            f"{len(differ)} tensors differ, e.g. {differ[:3]}: draw the initial weights from torch's "
            "global generator (seeded by the run), not from another source",
        )
    )
    odd = [k for k, v in a.items() if not isinstance(v, torch.Tensor)]
    checks.append(_found("its state dict holds tensors only", not odd, f"not tensors: {odd[:5]}"))
    error = stacking_error(model, shape, torch.device("cpu"))
    note = f"one at a time: {error}" if error else "stacked parties run it (torch.func.vmap)"
    together = "parties train it stacked or, where it cannot stack, one at a time"
    checks.append(_found(together, True, note=note))
    return checks, error
