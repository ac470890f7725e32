"""Federated evaluation (`validation_args.evaluation: federated`): every party tests the models the
server names on its own test split and reports counts; the server adds them up.

A party's report carries, per model, [correct, seen, loss sum] (`core.evaluation.evaluate_counts`).
The totals give the figures a server holding the union of the parties' test splits would compute:
accuracy sum(correct) / sum(seen) and loss sum(loss sum) / sum(seen), equal to central evaluation
on that union (the accuracy exactly; the loss up to the order of a float64 sum). Beside this pooled
figure, where each party's own figures are known, their mean with every site weighing 1
(`headline_fields`; `validation_args.headline` says which is `test_acc`). Pure Python.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from fedml_moon.core.evaluation import ratios


def totals(reports: Mapping[int, Mapping[str, Any]], names: list[str]) -> dict[str, Any]:
    """The round's test figures from the parties' reports (party -> report with "test"): `summed` over
    the counts added up (the union of the reporting parties' test splits), and each party's own
    figures under `party_test` (keyed by party id as text)."""
    parties = sorted(reports)
    counts = {name: [sum(reports[p]["test"][name][i] for p in parties) for i in range(3)] for name in names}
    out = summed(counts, names)
    out["party_test"] = {str(p): party_figures(reports[p], names) for p in parties}
    return out


def headline_fields(figures: Mapping[str, Any], headline: str = "pooled") -> dict[str, Any]:
    """The pooled figures (`summed`: every test sample weighs 1) as `pooled_test_acc` /
    `pooled_test_loss` and, where each party's own figures are known (`party_test`, in the clear), their
    mean with every site weighing 1 as `site_mean_test_acc` / `site_mean_test_loss` (over the sites
    that tested any sample); `test_acc` / `test_loss` are those of `headline` ("pooled" or
    "site_mean"). A site is a party: cross-silo runs one party per silo."""
    out: dict[str, Any] = {"pooled_test_acc": figures["test_acc"], "pooled_test_loss": figures["test_loss"]}
    sites = [f for f in figures.get("party_test", {}).values() if f["test_samples"] > 0]
    if sites:
        out["site_mean_test_acc"] = statistics.fmean(f["test_acc"] for f in sites)
        out["site_mean_test_loss"] = statistics.fmean(f["test_loss"] for f in sites)
    if headline == "site_mean" and sites:
        out.update(test_acc=out["site_mean_test_acc"], test_loss=out["site_mean_test_loss"])
    return out


def party_figures(report: Mapping[str, Any], names: list[str]) -> dict[str, float]:
    """One party's figures on its own test split (the mean over the models named), with its own
    model's local_test_acc when it reported one."""
    figures = summed(report["test"], names)
    out = {k: figures[k] for k in ("test_acc", "test_loss", "test_samples")}
    if "local_test_acc" in report:
        out["local_test_acc"] = float(report["local_test_acc"])
    return out


def summed(counts: Mapping[str, list], names: list[str]) -> dict[str, Any]:
    """Test figures from counts {model: [correct, seen, loss sum]} (a party's, the parties' added up,
    or their secure sum): test_acc and test_loss (with several models, as SOLO evaluates, their mean,
    `test_acc_std` and `models_evaluated`) and `test_samples`."""
    figures = [ratios(*counts[name]) for name in names]
    accs = [a for a, _ in figures]
    out: dict[str, Any] = {
        "test_acc": statistics.fmean(accs),
        "test_loss": statistics.fmean(loss for _, loss in figures),
        "test_samples": int(counts[names[0]][1]),
    }
    if len(names) > 1:
        out["test_acc_std"] = statistics.pstdev(accs)
        out["models_evaluated"] = len(names)
    return out
