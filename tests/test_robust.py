"""Robust aggregation (`server_args.robust_aggregation`, `fedml_moon.core.robust`), checked by hand."""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch

from fedml_moon.algorithms.base import ServerAlgorithm
from fedml_moon.algorithms.fedssc import build_prototypes
from fedml_moon.algorithms.lg import LGOptions, LGServer
from fedml_moon.algorithms.scaffold import ScaffoldOptions, ScaffoldServer
from fedml_moon.config.load import ConfigError, load_config
from fedml_moon.config.schema import ServerArgs
from fedml_moon.core.aggregation import weighted_average
from fedml_moon.core.robust import (
    RobustMean,
    RobustOptions,
    clip_scales,
    coordinate_median,
    krum_scores,
    pairwise_sq_distances,
    trim_count,
)
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from tests.support.tiny import train_args


def mean_of(rule: str, **options) -> RobustMean:
    return RobustMean(RobustOptions(rule, **options))


def states(*rows: list[float], buffers: list[int] | None = None) -> list[OrderedDict]:
    """One upload per row: {"w": tensor(row)} plus an integer buffer "n" when given."""
    out = []
    for i, row in enumerate(rows):
        state = OrderedDict(w=torch.tensor(row))
        if buffers is not None:
            state["n"] = torch.tensor(buffers[i])
        out.append(state)
    return out


# --- each rule on hand-written tensors --------------------------------------------------------------
def test_median_is_coordinatewise_and_ignores_weights():
    ups = states([1.0, 100.0], [2.0, 1.0], [100.0, 2.0], buffers=[2, 4, 6])
    out = mean_of("median")(ups, [1, 1, 100])
    assert out["w"].tolist() == [2.0, 2.0]
    assert out["n"].dtype == torch.int64 and out["n"].item() == 4  # integer buffer: its median, not weighted
    assert coordinate_median(torch.tensor([[1.0], [2.0], [3.0], [10.0]])).item() == 2.5  # even: middle two


@pytest.mark.parametrize("rule", ["median", "trimmed_mean", "krum", "norm_clip"])
def test_one_uploads_counter_cannot_move_the_integer_buffers_under_any_rule(rule):
    """A counter of -2**62 (or 2**62) among honest ones: every robust rule takes the median of the
    integer entries, so the aggregate's counter is an honest party's, whatever the weights."""
    for hostile in (-(2**62), 2**62):
        ups = states([0.0], [0.1], [0.2], [0.3], [5.0], buffers=[10, 11, 12, 13, hostile])
        out = mean_of(rule, krum_byzantine=1)(ups, [1, 1, 1, 1, 1000])
        assert out["n"].item() in (11, 12), (rule, hostile, out["n"])
        assert mean_of(rule, krum_byzantine=1).total(ups)["n"].item() == 5 * out["n"].item()


def test_trimmed_mean_drops_beta_n_at_each_end_and_at_least_one():
    x = [[1.0], [2.0], [3.0], [4.0], [100.0]]
    assert mean_of("trimmed_mean", trim_ratio=0.2)(states(*x), [1] * 5)["w"].item() == 3.0  # b = 1
    assert mean_of("trimmed_mean", trim_ratio=0.1)(states(*x), [1] * 5)["w"].item() == 3.0  # b = max(1, 0)
    assert [trim_count(10, 0.2), trim_count(10, 0.1), trim_count(10, 0.49), trim_count(2, 0.4)] == [
        2,
        1,
        4,
        0,
    ]
    assert trim_count(5, 0.0) == 0  # beta = 0: the plain unweighted mean
    ten = states(*[[float(v)] for v in [-50, 1, 2, 3, 4, 5, 6, 7, 8, 90]])
    assert mean_of("trimmed_mean", trim_ratio=0.2)(ten, [1] * 10)["w"].item() == pytest.approx(4.5)  # 2..7


def test_krum_takes_the_upload_closest_to_the_honest_cluster():
    ups = states([1.0], [2.0], [4.0], [2.5], [100.0])
    sq = pairwise_sq_distances(ups, ["w"])
    assert sq[0, 1].item() == 1.0 and sq[3, 4].item() == 97.5**2
    # f = 1, n = 5: each score sums the n - f - 2 = 2 smallest distances to the others
    assert krum_scores(sq, 1).tolist() == [3.25, 1.25, 6.25, 2.5, 96.0**2 + 97.5**2]
    assert mean_of("krum", krum_byzantine=1)(ups, [1, 1, 1, 1, 1])["w"].item() == 2.0
    # Multi-Krum, m = 2: {2.0, 2.5}, averaged by weight 1 : 3
    multi = mean_of("krum", krum_byzantine=1, krum_select=2)(ups, [1, 1, 1, 3, 1])
    assert multi["w"].item() == pytest.approx((2.0 * 1 + 2.5 * 3) / 4)


def test_krum_with_too_few_uploads_takes_the_median_and_says_so(caplog):
    ups = states([1.0], [2.0], [100.0], [3.0])  # n = 4, not > 2 * 1 + 2
    with caplog.at_level(logging.WARNING, logger="fedml_moon.core.robust"):
        out = mean_of("krum", krum_byzantine=1)(ups, [1, 1, 1, 1])
    assert out["w"].item() == 2.5
    assert "server_args.krum_byzantine" in caplog.text and "got 4" in caplog.text


def test_norm_clip_scales_an_update_of_norm_10_to_M_and_leaves_small_ones():
    ref = OrderedDict(w=torch.tensor([1.0, 1.0]))
    ups = states([7.0, 9.0], [1.3, 1.4])  # updates [6, 8] (norm 10) and [0.3, 0.4] (norm 0.5)
    out = mean_of("norm_clip", clip_norm=5.0)(ups, [1, 1], ref)
    expected = torch.tensor([1.0 + (3.0 + 0.3) / 2, 1.0 + (4.0 + 0.4) / 2])  # [6, 8] -> [3, 4]
    assert torch.allclose(out["w"], expected, atol=1e-6)
    assert clip_scales(torch.tensor([10.0, 0.5, 5.0], dtype=torch.float64), 5.0).tolist() == [0.5, 1.0, 1.0]
    alone = mean_of("norm_clip", clip_norm=5.0)(ups[:1], [1], ref)["w"] - ref["w"]
    assert alone.norm().item() == pytest.approx(5.0)


def test_norm_clip_default_bound_is_the_median_update_norm():
    ups = states([1.0, 0.0], [0.0, 2.0], [10.0, 0.0])  # norms 1, 2, 10 around zero: M = 2
    out = mean_of("norm_clip")(ups, [1, 1, 1])  # no reference: the uploads are the updates
    assert torch.allclose(out["w"], torch.tensor([(1.0 + 0.0 + 2.0) / 3, 2.0 / 3]))


def test_none_is_bitwise_the_weighted_average():
    torch.manual_seed(0)
    ups = [OrderedDict(w=torch.randn(5, 3), b=torch.randn(3), n=torch.tensor(i + 1)) for i in range(4)]
    weights = [10.0, 3.0, 7.0, 1.0]
    mean, plain = mean_of("none"), weighted_average(ups, weights)
    out = mean(ups, weights, ups[0])
    assert all(torch.equal(out[k], plain[k]) and out[k].dtype == plain[k].dtype for k in plain)
    assert torch.equal(mean.total(ups)["w"], sum(u["w"] for u in ups))
    x = torch.randn(4, 6)
    assert torch.equal(mean.rows(x), x.mean(dim=0))


def test_an_unknown_rule_is_refused():
    with pytest.raises(ValueError, match="unknown robust aggregation 'mode'"):
        mean_of("mode")


# --- one attacker among nine honest parties ---------------------------------------------------------
@pytest.mark.parametrize("factor", [-10.0, 100.0])
def test_one_attacker_moves_the_plain_average_far_and_the_robust_rules_little(factor):
    g = torch.Generator().manual_seed(0)
    global_w = torch.zeros(20)
    honest = [global_w + 1.0 + 0.1 * torch.randn(20, generator=g) for _ in range(9)]
    attacker = global_w + factor * (honest[0] - global_w)  # its update scaled by the factor
    ups = [OrderedDict(w=w) for w in [attacker, *honest]]
    target = torch.stack(honest).mean(dim=0)
    reference = OrderedDict(w=global_w)

    def error(rule: str, **options) -> float:
        return float((mean_of(rule, **options)(ups, [1.0] * 10, reference)["w"] - target).norm())

    plain = error("none")
    assert plain > 4.0  # the honest update has norm about 4.5: the average is thrown off by more
    for rule in ("median", "trimmed_mean", "krum", "norm_clip"):
        assert error(rule) < 0.25 * plain, rule  # norm_clip bounds a flipped update, keeps some
    assert error("krum", krum_select=5) < 0.1 * plain


# --- the algorithms' server steps go through the rule -----------------------------------------------
def test_model_average_of_every_averaging_server_uses_the_rule():
    server = ServerAlgorithm(None, ServerArgs(robust_aggregation="median"), train_args())
    glob = OrderedDict(w=torch.zeros(2))
    uploads = [(n, {"model": OrderedDict(w=torch.tensor(v))}) for n, v in [(1, [1.0, 9.0]), (1, [2.0, 8.0])]]
    uploads.append((50, {"model": OrderedDict(w=torch.tensor([100.0, -100.0]))}))
    assert server.aggregate(glob, uploads)["w"].tolist() == [2.0, 8.0]


def test_scaffold_c_moves_by_the_robust_mean_times_S_over_N():
    args = train_args(client_num_in_total=6, client_num_per_round=3)
    server = ScaffoldServer(ScaffoldOptions(), ServerArgs(robust_aggregation="median"), args)
    glob = OrderedDict(w=torch.zeros(1))
    deltas = [[1.0], [3.0], [-90.0]]
    uploads = [(1.0, {"model": glob, "delta_c": {"w": torch.tensor(d)}}) for d in deltas]
    server.aggregate(glob, uploads)
    assert server.c["w"].item() == pytest.approx(1.0 * 3 / 6)  # median 1, |S| = 3, N = 6
    plain = ScaffoldServer(ScaffoldOptions(), ServerArgs(), args)
    plain.aggregate(glob, uploads)
    assert torch.equal(plain.c["w"], sum(torch.tensor(d) for d in deltas) / 6.0)  # none: unchanged


def test_fedssc_prototypes_per_class_over_the_parties_that_have_it():
    protos = [torch.tensor([[1.0, 1.0], [5.0, 5.0]]), torch.tensor([[2.0, 2.0], [0.0, 0.0]])]
    protos.append(torch.tensor([[90.0, -90.0], [7.0, 7.0]]))
    present = [torch.tensor([True, True]), torch.tensor([True, False]), torch.tensor([True, True])]
    pairs = list(zip(protos, present, strict=True))
    out, mask = build_prototypes(pairs, "mean", 1, np.random.default_rng(0), mean_of("median"))
    assert out[0].tolist() == [2.0, 1.0]  # median of 1, 2, 90 and of 1, 2, -90
    assert out[1].tolist() == [6.0, 6.0]  # class 1: parties 0 and 2 only, median of two = their mean
    assert mask.tolist() == [True, True]
    plain, _ = build_prototypes(pairs, "mean", 1, np.random.default_rng(0), mean_of("none"))
    assert torch.equal(plain, build_prototypes(pairs, "mean", 1, np.random.default_rng(0))[0])


def test_lg_averages_only_its_global_layers_robustly():
    server = LGServer(LGOptions(global_prefixes=["g"]), ServerArgs(robust_aggregation="median"), train_args())
    glob = OrderedDict(g=torch.zeros(1), loc=torch.full((1,), 7.0))
    server.setup(glob)
    ups = [(1.0, {"model": OrderedDict(g=torch.tensor([v]))}) for v in (1.0, 2.0, 300.0)]
    out = server.aggregate(glob, ups)
    assert out["g"].item() == 2.0 and out["loc"].item() == 7.0


# --- config ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, key, hint",
    [
        (["server_args.robust_aggregation=mode"], "server_args.robust_aggregation", "choose one of none"),
        (["server_args.trim_ratio=0.5"], "server_args.trim_ratio", "must be in [0, 0.5)"),
        (["server_args.trim_ratio=-0.1"], "server_args.trim_ratio", "must be in [0, 0.5)"),
        (["server_args.krum_byzantine=-1"], "server_args.krum_byzantine", "must be >= 0"),
        (["server_args.krum_select=0"], "server_args.krum_select", "must be >= 1"),
        (["server_args.clip_norm=0"], "server_args.clip_norm", "must be > 0, or null"),
        (["server_args.clip_norm=-2"], "server_args.clip_norm", "must be > 0, or null"),
        (
            ["train_args.algorithm=solo", "server_args.robust_aggregation=median"],
            "server_args.robust_aggregation",
            "solo averages nothing",
        ),
        (
            ["server_args.robust_aggregation=krum", "server_args.krum_byzantine=4"],
            "server_args.krum_byzantine",
            "more than 2 * krum_byzantine + 2 = 10 uploads per round",
        ),
        (
            ["server_args.robust_aggregation=krum", "server_args.krum_select=10"],
            "server_args.krum_select",
            "at most client_num_per_round - krum_byzantine = 9",
        ),
    ],
)
def test_robust_config_errors_name_the_key_and_the_fix(overrides, key, hint):
    with pytest.raises(ConfigError) as err:
        load_config("config/fashion_mnist/fedavg.yaml", overrides)
    assert str(err.value).startswith(key) and hint in str(err.value)


def test_robust_keys_default_to_none():
    cfg = load_config("config/fashion_mnist/fedavg.yaml", ["server_args.robust_aggregation=krum"])
    server = cfg.server_args
    assert (server.trim_ratio, server.krum_byzantine, server.krum_select, server.clip_norm) == (
        0.1,
        1,
        1,
        None,
    )
    assert load_config("config/fashion_mnist/fedavg.yaml").server_args.robust_aggregation == "none"


# --- tiny standalone runs on Fashion-MNIST ----------------------------------------------------------
TINY_RUN = [
    "data_args.max_train_samples=300",
    "data_args.max_test_samples=100",
    "train_args.client_num_in_total=3",
    "train_args.client_num_per_round=3",
    "train_args.comm_round=3",
    "train_args.epochs=1",
    "train_args.batch_size=32",
    "device_args.torch_threads=1",
    "tracking_args.enable_wandb=false",
    "server_args.robust_aggregation=median",
]
OWN = {
    "fedavg": [],
    "scaffold": [],
    "fedssc": ["algorithm_args.prototype_mode=mean", "algorithm_args.min_class_samples=1"],
    "lg": [  # 5 parties x 2 label shards: every class cut into the same number of shards
        "algorithm_args.warmup_rounds=1",
        "train_args.batch_size=10",
        "train_args.client_num_in_total=5",
        "train_args.client_num_per_round=5",
    ],
}


@pytest.mark.skipif(not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist")
@pytest.mark.parametrize("algorithm", sorted(OWN))
def test_a_tiny_run_with_the_median_completes(algorithm, tmp_path: Path, monkeypatch):
    from fedml_moon.adapters.run import assemble

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    cfg = load_config(f"config/fashion_mnist/{algorithm}.yaml", [*TINY_RUN, *OWN[algorithm]])
    run = assemble(cfg, tmp_path / "out")
    assert run.loop.aggregator.algorithm.mean.rule == "median"
    run.loop.run()
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == 3
    assert all(torch.isfinite(v.float()).all() for v in run.loop.aggregator.global_state.values())
