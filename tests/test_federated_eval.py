"""Federated evaluation gives the figures central evaluation gives on the union of the parties' test
splits: the parties' counts add up to the server's (the accuracy exactly, the loss to float rounding),
for the global model, SOLO's models and LG-FedAvg's local and new tests; each party's own figures sit
beside them (docs: reference/outputs.md). And a silo reads its own party alone as the standalone run's
natural partition reads it, seeded test share included."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest
import torch

from fedml_moon.config.schema import ConfigError
from fedml_moon.data.silo import load_own
from fedml_moon.data.site import load_site
from fedml_moon.engine.federated_eval import headline_fields, totals
from tests.support.cli import restored_main
from tests.support.marks import needs_fmnist
from tests.support.site_data import MIXES, party_folders, site_args, site_sets

pytestmark = needs_fmnist

ROOT = Path(__file__).resolve().parent.parent
TINY = [
    *site_sets(),
    "data_args.dataset=imagefolder",
    "data_args.partition_method=natural",
    "train_args.client_num_in_total=3",
    "train_args.client_num_per_round=2",
    "train_args.comm_round=2",
    "train_args.epochs=1",
    "train_args.batch_size=16",
    "device_args.torch_threads=1",
    "tracking_args.enable_wandb=false",
]


def _run(config: str, sites: Path, out: Path, *extra: str) -> list[dict]:
    sets = [*TINY, f"data_args.data_cache_dir={sites}", *extra]
    with restored_main() as main:
        args = ["simulate", "--cf", str(ROOT / config), "--output-dir", str(out)]
        assert main([*args, *(a for s in sets for a in ("--set", s))]) == 0
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_totals_are_the_sums_of_the_counts():
    reports = {
        0: {"test": {"global": [3, 4, 2.0]}},
        2: {"test": {"global": [1, 6, 9.0]}, "local_test_acc": 0.5},
    }
    out = totals(reports, ["global"])
    assert (out["test_acc"], out["test_loss"], out["test_samples"]) == (0.4, 1.1, 10)
    assert out["party_test"] == {
        "0": {"test_acc": 0.75, "test_loss": 0.5, "test_samples": 4},
        "2": {"test_acc": 1 / 6, "test_loss": 1.5, "test_samples": 6, "local_test_acc": 0.5},
    }


def test_one_site_moves_the_site_mean_by_at_most_its_share():
    """The attack of the issue: a site whose test split is 4,000 copies of samples it gets right pulls
    the pooled figure to itself; the mean over sites, each weighing 1, moves by at most 1 / sites
    whatever counts the site reports (0 <= correct <= seen, any seen), and `headline` says which of
    the two is test_acc (pooled unless told)."""
    honest = {p: {"test": {"global": [c, 100, 70.0]}} for p, c in enumerate((40, 70, 50))}
    base = headline_fields(totals(honest, ["global"]))
    draw = random.Random(0)
    seen = [1, 4000, 10**6, *(draw.randint(1, 10**7) for _ in range(300))]
    lies = [(c, s) for s in seen for c in (0, s, draw.randint(0, s))]
    for correct, n in lies:
        figures = totals({**honest, 2: {"test": {"global": [correct, n, float(n)]}}}, ["global"])
        pooled = {**figures, **headline_fields(figures)}  # as the record takes them
        site = {**figures, **headline_fields(figures, "site_mean")}
        assert abs(pooled["site_mean_test_acc"] - base["site_mean_test_acc"]) <= 1 / 3
        assert pooled["test_acc"] == pooled["pooled_test_acc"] == figures["test_acc"]
        assert site["test_acc"] == site["site_mean_test_acc"] == statistics.fmean([0.4, 0.7, correct / n])
        assert (
            site["pooled_test_acc"] == figures["test_acc"]
            and site["test_loss"] == site["site_mean_test_loss"]
        )
    copies = headline_fields(totals({**honest, 2: {"test": {"global": [4000, 4000, 0.0]}}}, ["global"]))
    assert copies["pooled_test_acc"] - base["pooled_test_acc"] > 0.4  # the pooled figure: the liar's
    assert copies["site_mean_test_acc"] - base["site_mean_test_acc"] == pytest.approx(0.5 / 3)


CASES = {
    "moon": ("config/fashion_mnist/moon.yaml", [], ("test_acc",)),
    "solo": ("config/fashion_mnist/solo.yaml", [], ("test_acc", "test_acc_std", "models_evaluated")),
    "lg": (
        "config/fashion_mnist/lg.yaml",
        ["algorithm_args.warmup_rounds=1"],
        ("test_acc", "local_test_acc", "new_test_acc"),
    ),
    "lg-ensemble": (
        "config/fashion_mnist/lg.yaml",
        ["algorithm_args.warmup_rounds=1", "algorithm_args.new_test_method=ensemble"],
        ("test_acc", "local_test_acc", "new_test_acc"),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_federated_figures_equal_central_ones(tmp_path, sites, case):
    config, extra, exact = CASES[case]
    central = _run(config, sites, tmp_path / "central", *extra)
    federated = _run(config, sites, tmp_path / "federated", *extra, "validation_args.evaluation=federated")
    a = torch.load(tmp_path / "central" / "final_model.pt", weights_only=True)
    b = torch.load(tmp_path / "federated" / "final_model.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)  # evaluating elsewhere changes no training
    tests = {p: len(list((sites / name / "test").rglob("*.png"))) for p, name in enumerate(sorted(MIXES))}
    for c, f in zip(central, federated, strict=True):
        assert "party_test" not in c
        for key in exact:
            assert f[key] == c[key], (case, key, f[key], c[key])
        for key in ("test_loss", "new_test_loss"):
            if key in c:
                assert f[key] == pytest.approx(c[key], rel=1e-6)
        assert f["test_samples"] == sum(tests.values())
        assert {int(p): v["test_samples"] for p, v in f["party_test"].items()} == tests
        correct = sum(v["test_acc"] * v["test_samples"] for v in f["party_test"].values())
        assert f["pooled_test_acc"] == f["test_acc"] and f["pooled_test_loss"] == f["test_loss"]
        mean = statistics.fmean(v["test_acc"] for v in f["party_test"].values())
        assert f["site_mean_test_acc"] == mean and "site_mean_test_acc" not in c
        if case != "solo":  # SOLO's figures are means over the parties' models
            assert correct == pytest.approx(f["test_acc"] * f["test_samples"])
        if "new_test_acc" in exact:
            assert all("new_test_acc" in v and "local_test_acc" in v for v in f["party_test"].values())
            assert f["eval_bytes_down"] > c["eval_bytes_down"]  # the combined models went to every party


def test_a_site_mean_headline_is_test_acc_and_the_best_so_far(tmp_path, sites):
    """`validation_args.headline: site_mean`: test_acc (and test_loss) are the mean over the sites of
    each one's own figures, the pooled ones stay under pooled_test_acc, and summary.json's final and
    best figures are the headline's."""
    sets = ["validation_args.evaluation=federated", "validation_args.headline=site_mean"]
    records = _run("config/fashion_mnist/moon.yaml", sites, tmp_path / "run", *sets)
    for r in records:
        sites_figures = r["party_test"].values()
        assert (
            r["test_acc"] == r["site_mean_test_acc"] == statistics.fmean(v["test_acc"] for v in sites_figures)
        )
        assert r["test_loss"] == statistics.fmean(v["test_loss"] for v in sites_figures)
        correct = sum(v["test_acc"] * v["test_samples"] for v in sites_figures)
        assert r["pooled_test_acc"] == pytest.approx(correct / r["test_samples"])
    assert any(r["test_acc"] != r["pooled_test_acc"] for r in records)  # the sites' test splits differ
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["headline"] == "site_mean" and summary["final_test_acc"] == records[-1]["test_acc"]
    assert summary["best_test_acc"] == max(r["test_acc"] for r in records)


def test_a_silo_reads_its_own_party_as_the_natural_partition_does(sites, tmp_path):
    """Party 1 read alone from its own folder, or taken from the per-party folder, holds what the
    standalone run's natural partition gives party 1; without a test/ folder the seeded test share
    is drawn the same (party 1's stream) too."""
    whole = load_site(site_args(data_cache_dir=str(sites), partition_method="natural"), 0)
    train, test = whole.parties.train[1], whole.parties.test[1]
    for folder in (sites / sorted(MIXES)[1], sites):
        own = load_own(site_args(data_cache_dir=str(folder), partition_method="natural"), 0, 1)
        assert torch.equal(own.x_train, whole.x_train[train]) and torch.equal(own.y_test, whole.y_test[test])
    flat = party_folders(tmp_path / "flat", per_party=30, n_test=0, split=False)
    whole = load_site(site_args(data_cache_dir=str(flat), partition_method="natural"), 5)
    own = load_own(site_args(data_cache_dir=str(flat / sorted(MIXES)[2]), partition_method="natural"), 5, 2)
    assert torch.equal(own.x_test, whole.x_test[whole.parties.test[2]])
    assert torch.equal(own.x_train, whole.x_train[whole.parties.train[2]])


def test_a_silo_past_the_parties_of_a_per_party_folder_is_refused(sites):
    with pytest.raises(
        ConfigError, match=r"holds 3 parties \(party-a, party-b, party-c\), and this silo is party 3"
    ):
        load_own(site_args(data_cache_dir=str(sites), partition_method="natural"), 0, 3)


def test_under_secure_aggregation_the_counts_are_summed_securely(tmp_path, sites):
    """Secure aggregation with federated evaluation in the standalone loop: the same figures as the
    central test (the counts' secure sum is exact), and no party's own figures recorded."""
    secure = ["privacy_args.secure_aggregation=true", "train_args.client_num_per_round=3"]
    central = _run("config/fashion_mnist/moon.yaml", sites, tmp_path / "central", *secure)
    federated = _run(
        "config/fashion_mnist/moon.yaml",
        sites,
        tmp_path / "federated",
        *secure,
        "validation_args.evaluation=federated",
    )
    for c, f in zip(central, federated, strict=True):
        assert f["test_acc"] == c["test_acc"] and f["test_loss"] == pytest.approx(c["test_loss"], rel=1e-6)
        assert "party_test" not in f and f["test_samples"] > 0
        assert "site_mean_test_acc" not in f and f["pooled_test_acc"] == f["test_acc"]  # the sum's only
