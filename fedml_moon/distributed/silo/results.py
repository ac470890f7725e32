"""What a site (a silo, or a worker of the MPI simulation) keeps of the run's results: its own test
figures, logged on every round it evaluates (under secure aggregation too: they are its own, and
only their secure sum leaves it), and the final global model the server's FINISH carries, written
as `final_model.pt` in its own folder with its SHA-256 logged (the server logs the same digest)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from fedml_moon.core.digest import state_dict_sha256
from fedml_moon.engine.federated_eval import summed
from fedml_moon.run_folder import RunFolder, replacing

log = logging.getLogger(__name__)


def own_figures(reports: list[Mapping[str, Any]]) -> str | None:
    """A site's figures of one evaluation as log text, from its parties' reports: the counts of the
    models it tested on its own test split added up over its parties (`test_acc`, `test_loss`; the
    new test's as `new_test_acc`, `new_test_loss`) and the mean of its parties' own models' local
    test (`local_test_acc`); None when it measured nothing."""
    parts = []
    tested = [r["test"] for r in reports if isinstance(r.get("test"), Mapping) and r["test"]]
    if tested:
        names = list(tested[0])
        counts = {n: [sum(t[n][i] for t in tested) for i in range(3)] for n in names}
        figures = summed(counts, names)
        prefix = "new_" if names == ["new"] else ""
        parts.append(
            f"{prefix}test_acc {figures['test_acc']:.4f} {prefix}test_loss {figures['test_loss']:.4f} "
            f"on its {figures['test_samples']} test samples"
        )
    local = [float(r["local_test_acc"]) for r in reports if "local_test_acc" in r]
    if local:
        parts.append(f"local_test_acc {sum(local) / len(local):.4f} (its parties' own models)")
    return ", ".join(parts) or None


def log_own_figures(rank: int, round_idx: int, reports: list[Mapping[str, Any]]) -> None:
    """Log what the site measured on `round_idx` (see `own_figures`)."""
    text = own_figures(reports)
    if text is not None:
        parties = sorted(int(r["party_id"]) for r in reports)
        log.info("rank %d, round %d, its own test (parties %s): %s", rank, round_idx, parties, text)


def keep_final_model(rank: int, folder: Path, model: Mapping[str, Any]) -> Path:
    """Write the server's final model to `folder`/final_model.pt (a state dict of tensors, loadable
    with `torch.load(..., weights_only=True)`; written whole or not at all) and log its SHA-256."""
    state = {str(k): v for k, v in model.items()}
    bad = [k for k, v in state.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise ValueError(f"the server's final model holds entries that are not tensors: {bad[:5]}")
    digest = state_dict_sha256(state)
    path = RunFolder(folder).final_model
    with replacing(path) as tmp:
        torch.save(state, tmp)
    log.info("rank %d: final model sha256 %s (%s)", rank, digest, path)
    return path
