"""privacy_args in the standalone loop: secure aggregation gives every summing algorithm's plain result
to within the fixed-point bound, DP-FedAvg clips and averages as written, epsilon is the accountant's,
and what needs a single party's upload is refused with the key named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from fedml_moon import conformance
from fedml_moon.adapters.run import assemble
from fedml_moon.config.load import load_config
from fedml_moon.config.schema import ConfigError
from fedml_moon.core.fixed_point import FixedPoint
from fedml_moon.core.schedule import sample_schedule
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from fedml_moon.engine.resume import flatten
from fedml_moon.privacy.accountant import PrivacyAccountant
from fedml_moon.privacy.mod import PrivateAggregation, secure_sum
from fedml_moon.privacy.options import PrivacyArgs
from fedml_moon.privacy.party import PartyVector, Plan, PrivacyError, party_vector
from fedml_moon.privacy.secagg import SecAggError
from tests.support.tiny import SUMMING, TINY_RUN

CONFIGS = Path(__file__).resolve().parent.parent / "config" / "fashion_mnist"
TINY = [
    *conformance.TINY,
    *TINY_RUN,
    "train_args.comm_round=1",
    "validation_args.local_test=false",
]
SECURE = ["privacy_args.secure_aggregation=true"]
THREE = ["train_args.client_num_per_round=3"]  # secure aggregation needs at least 3 parties a round
needs_data = pytest.mark.skipif(
    not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist"
)
CASES = SUMMING  # name: (config, overrides)


def _run(tmp_path: Path, name: str, overrides: list[str], monkeypatch) -> tuple[dict, object]:
    monkeypatch.setattr("fedml_moon.data.federated.save_partition_heatmap", lambda *a: None)
    monkeypatch.setattr("fedml_moon.records.recorder.RunRecorder.plot", lambda *a: None)
    built = assemble(load_config(CONFIGS / f"{name}.yaml", overrides), tmp_path)
    built.loop.run()
    return torch.load(tmp_path / "final_model.pt", weights_only=True), built.loop.server


def _far(a: dict, b: dict) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


@needs_data
@pytest.mark.parametrize("case", list(CASES))
def test_secure_aggregation_gives_the_plain_round_within_the_fixed_point_bound(case, tmp_path, monkeypatch):
    """Each of n = 3 parties adds r * update with r <= 1; each element of the decoded sum is within
    n / (2 scale) of the true sum (FixedPoint.error_bound), so the mean update (sum / sum of r) is
    within n / (2 scale sum r), and SCAFFOLD's c (sum / N) and FedSSC's prototypes (sum / count) within
    n / (2 scale); float32 adds at most 1e-6 for these magnitudes."""
    name, extra = CASES[case]
    plain, plain_server = _run(tmp_path / "plain", name, [*TINY, *THREE, *extra], monkeypatch)
    secure, secure_server = _run(tmp_path / "secure", name, [*TINY, *THREE, *extra, *SECURE], monkeypatch)
    privacy = secure_server.privacy
    parties = secure_server.parties(0)
    ratio_sum = sum(privacy.ratios[p] for p in parties)
    bound = FixedPoint().error_bound(len(parties))
    assert 0 < _far(plain, secure) <= bound / ratio_sum + 1e-6
    a, b = plain_server.aggregator.algorithm, secure_server.aggregator.algorithm
    if case == "scaffold":
        assert _far(a.c, b.c) <= bound + 1e-6
    if case == "fedssc":
        assert torch.equal(a.present, b.present)
        assert float((a.prototypes - b.prototypes).abs().max()) <= bound + 1e-6
    plain_record, secure_record = plain_server.recorder.records[0], secure_server.recorder.records[0]
    assert secure_record["train_loss"] == pytest.approx(plain_record["train_loss"], abs=bound / ratio_sum)
    assert secure_record["bytes_up"] == 4 * secure_record["params_up"]  # int32 words on the wire


def test_a_partys_vector_is_its_weighted_update_clipped_then_its_weighted_metrics():
    """Update u = [3, 4] (norm 5): clipped to C = 1 -> [0.6, 0.8]; with ratio 0.5 and no DP ->
    [1.5, 2.0]; the metric loss 2.0 follows times the party's sample ratio: 0.5 * 2.0 = 1.0."""
    received = {"model": {"w": torch.zeros(2)}}
    upload = {"model": {"w": torch.tensor([3.0, 4.0])}, "metrics": {"loss": 2.0}, "party_id": 0}
    clipped = party_vector(
        upload, received, Plan({"model": "update"}, ratio=1.0, clip=1.0, metrics=("loss",))
    )
    assert clipped.vector.tolist() == pytest.approx([0.6, 0.8, 2.0]) and clipped.norm == pytest.approx(5.0)
    plan = Plan({"model": "update"}, ratio=0.5, metric_ratio=0.5, metrics=("loss",))
    weighted = party_vector(upload, received, plan)
    assert weighted.vector.tolist() == [1.5, 2.0, 1.0] and weighted.metric_names == ["loss"]
    assert party_vector(upload, received, Plan({"model": "update"})).vector.tolist() == [
        3.0,
        4.0,
    ]  # no metrics


@pytest.mark.parametrize("metrics", [{}, {"loss": float("nan")}, {"loss": 1e300}, {"loss": "2"}, {"ce": 1.0}])
def test_a_party_whose_metrics_are_not_the_rounds_cannot_add_to_the_sum(metrics):
    """The round's metric names are the server's (the plan's: loss and the algorithm's terms), never a
    party's: a party whose metrics lack one, or hold a value that is not a finite number, stays out."""
    upload = {"model": {"w": torch.ones(2)}, "metrics": metrics, "party_id": 0}
    with pytest.raises(PrivacyError, match=r"the upload's metrics \['loss'\] are missing or not finite"):
        party_vector(upload, {"model": {"w": torch.zeros(2)}}, Plan({"model": "update"}, metrics=("loss",)))


def test_dp_fedavg_divides_by_the_parties_sampled_and_reports_the_accountants_epsilon():
    """DP-FedAvg's fixed denominator: the sum of 2 clipped updates over m = 4 sampled (not over the 2
    that reported); epsilon after one round is PrivacyAccountant's for (sigma, N, m, delta)."""
    options = PrivacyArgs(dp_clip_norm=1.0, dp_noise_multiplier=1e-9, dp_delta=1e-5)
    weights, samples = {p: 10.0 + p for p in range(8)}, {p: 10 for p in range(8)}
    privacy = PrivateAggregation(options, {"model": "update"}, weights, per_round=4, samples=samples)
    total = torch.tensor([0.6, 0.8, 3.0], dtype=torch.float64)  # [0.6, 0.8] + [0, 0], metrics 1 + 2
    sums = privacy.finish(total, [("model", "w", (2,))], ["loss"], parties=[0, 1])
    assert sums.weight == 4.0 and sums.count == 2
    assert sums.fields["model"]["w"].tolist() == pytest.approx([0.6, 0.8], abs=1e-6)
    assert sums.metrics["loss"] == pytest.approx(1.5)
    expected = PrivacyAccountant(1e-9, 8, 4, 1e-5)
    expected.record([0, 1])
    # the record carries the release's epsilon; DP alone holds nothing against the server, which sees uploads
    assert privacy.record_fields() == {  # DP alone: no figure against the server, which sees every upload
        "dp_epsilon_release": pytest.approx(expected.epsilon_release()),
        "dp_epsilon_sample_known": pytest.approx(expected.epsilon_server()),  # each party's own rounds
    }
    assert privacy.plan(3).ratio == 1.0 and privacy.plan(3).noise_std == 0.0  # the server adds it all


def test_under_secure_aggregation_each_party_adds_its_share_of_the_noise_for_the_quorum():
    """Each of the 9 sampled parties adds N(0, sigma^2 C^2 / q), q = 5 the fewest a round may complete
    with: a sum of 5 carries exactly sigma C, of more, more (accounted as it is), and no sum of fewer
    is unmasked (min_sum, and the crowd of the round's SecAgg parameters)."""
    options = PrivacyArgs(secure_aggregation=True, dp_clip_norm=2.0, dp_noise_multiplier=1.5)
    weights = dict.fromkeys(range(20), 1.0)
    every = PrivateAggregation(options, {"model": "update"}, weights, per_round=9)
    assert every.plan(0).noise_std == pytest.approx(1.0) and every.plan(0).min_sum == 9  # 1.5 * 2 / sqrt(9)
    privacy = PrivateAggregation(options, {"model": "update"}, weights, per_round=9, quorum=5)
    plan = privacy.plan(0)
    assert plan.noise_std == pytest.approx(1.5 * 2 / 5**0.5) and plan.min_sum == 5
    assert privacy.params(9).min_group == 5 and privacy.params(9).threshold == 5
    total = torch.zeros(2, dtype=torch.float64)
    privacy.finish(total, [("model", "w", (2,))], [], parties=[0, 1, 2, 3, 4, 5, 6])  # 7 of 9: more noise
    assert privacy.accountant.history == [(pytest.approx(1.5 * (7 / 5) ** 0.5), (0, 1, 2, 3, 4, 5, 6))]
    fields = privacy.record_fields()
    assert set(fields) == {"dp_epsilon_release", "dp_epsilon_sample_known", "dp_epsilon_server"}
    assert fields["dp_epsilon_release"] <= fields["dp_epsilon_server"] == fields["dp_epsilon_sample_known"]


@needs_data
def test_a_target_epsilon_stops_the_run_before_the_round_that_would_pass_it(tmp_path, monkeypatch):
    dp = ["privacy_args.dp_clip_norm=1.0", "privacy_args.dp_noise_multiplier=0.05"]
    overrides = [*TINY, *dp, "train_args.comm_round=3"]
    seed = load_config(CONFIGS / "fedavg.yaml", overrides).common_args.random_seed
    one, epsilons = PrivacyAccountant(0.05, 3, 2, 1e-5), []
    for ids in sample_schedule(3, 2, 2, seed):
        one.record(ids)
        epsilons.append(one.epsilon_release())  # DP alone: the target bounds the release's epsilon
    target = sum(epsilons) / 2
    _, server = _run(
        tmp_path, "fedavg", [*overrides, f"privacy_args.dp_target_epsilon={target}"], monkeypatch
    )
    records = server.recorder.records
    assert [r["round"] for r in records] == [0]
    assert records[0]["dp_epsilon_release"] == pytest.approx(epsilons[0])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["dp_epsilon_release"] <= target
    assert summary["dp_epsilon_server"] is None  # DP alone: the server sees every upload


@pytest.mark.parametrize(
    "overrides, key",
    [
        ([*SECURE, "server_args.robust_aggregation=median"], "server_args.robust_aggregation"),
        ([*SECURE, "validation_args.local_test=true"], "validation_args.local_test"),
        ([*SECURE, "train_args.save_party_models=true"], "train_args.save_party_models"),
        (["privacy_args.dp_noise_multiplier=1.0"], "privacy_args.dp_clip_norm"),
        (["privacy_args.dp_clip_norm=1.0"], "privacy_args.dp_noise_multiplier"),
        (["privacy_args.secagg_bits=32"], "privacy_args.secagg_bits"),
        ([*SECURE, "train_args.client_num_per_round=1"], "train_args.client_num_per_round"),
        ([*SECURE, "train_args.client_num_per_round=2"], "train_args.client_num_per_round"),
        ([*SECURE, "privacy_args.secagg_threshold=5"], "privacy_args.secagg_threshold"),  # 5 of 10
        ([*SECURE, "privacy_args.secagg_threshold=11"], "privacy_args.secagg_threshold"),
        ([*SECURE, "privacy_args.secagg_threshold=10"], "leaves no holder of a neighbourhood of 10"),
        (
            [*SECURE, "privacy_args.secagg_neighbours=4", "privacy_args.secagg_threshold=2"],
            "secagg_threshold",
        ),
        (["privacy_args.secagg_threshold=1"], "privacy_args.secagg_threshold"),
        (["privacy_args.secagg_min_group=1"], "privacy_args.secagg_min_group"),
        ([*SECURE, "privacy_args.secagg_min_group=11"], "privacy_args.secagg_min_group"),
        (
            [
                "privacy_args.dp_clip_norm=1",
                "privacy_args.dp_noise_multiplier=1",
                "privacy_args.dp_accountant=pld",
                "train_args.client_num_per_round=2",
            ],
            "privacy_args.dp_accountant",
        ),
    ],
)
def test_what_privacy_cannot_keep_is_refused_with_its_key(overrides, key):
    base = ["validation_args.local_test=false"] if "validation_args.local_test=true" not in overrides else []
    with pytest.raises(ConfigError, match=key):
        load_config(CONFIGS / "fedavg.yaml", [*base, *overrides])


def test_solo_and_random_k_prototypes_are_refused_under_secure_aggregation():
    with pytest.raises(ConfigError, match="solo sums nothing"):
        load_config(CONFIGS / "solo.yaml", ["validation_args.local_test=false", *SECURE])
    with pytest.raises(ConfigError, match="algorithm_args.prototype_mode"):
        load_config(CONFIGS / "fedssc.yaml", ["validation_args.local_test=false", *SECURE])


@needs_data
def test_a_target_epsilon_below_one_round_is_refused_before_anything_runs(tmp_path):
    dp = ["privacy_args.dp_clip_norm=1.0", "privacy_args.dp_noise_multiplier=0.05"]
    cfg = load_config(CONFIGS / "fedavg.yaml", [*TINY, *dp, "privacy_args.dp_target_epsilon=0.001"])
    with pytest.raises(ConfigError, match="dp_target_epsilon: 0.001 is passed in the first round"):
        assemble(cfg, tmp_path)


def test_values_outside_the_fixed_point_range_are_clipped_and_said(caplog):
    """A value of 9 with clip 8 decodes as 8 (the sum is of clipped values), with a warning."""
    options = PrivacyArgs(secure_aggregation=True)
    privacy = PrivateAggregation(options, {"model": "update"}, {0: 1.0, 1: 1.0, 2: 1.0}, per_round=3)
    vectors = {
        p: PartyVector(torch.tensor([9.0 if p == 0 else 1.0, -0.5], dtype=torch.float64), [], [])
        for p in range(3)
    }
    total, survivors = secure_sum(0, vectors, privacy.params(3))
    assert survivors == [0, 1, 2]
    assert total.tolist() == pytest.approx([10.0, -1.5], abs=FixedPoint().error_bound(3))
    assert "party 0: 1 of 2 values lie outside [-8, 8]" in caplog.text


def test_a_threshold_of_half_a_neighbourhood_is_refused_naming_the_key_and_the_fix():
    overrides = ["validation_args.local_test=false", *SECURE, "privacy_args.secagg_neighbours=4"]
    with pytest.raises(
        ConfigError,
        match=r"privacy_args.secagg_threshold: 2 is not more than half of a "
        r"neighbourhood of 5 .*set it above 2, or auto",
    ):
        load_config(CONFIGS / "fedavg.yaml", [*overrides, "privacy_args.secagg_threshold=2"])
    assert load_config(CONFIGS / "fedavg.yaml", [*overrides, "privacy_args.secagg_threshold=3"])


@needs_data
def test_rejections_down_to_two_uploads_stop_a_secure_standalone_round(tmp_path, monkeypatch, caplog):
    """3 parties sampled, one upload holds NaN and is left out: 2 remain, and the round's secure sum is
    refused with the reason (each of the two would learn the other's update); the model is unchanged."""
    monkeypatch.setattr("fedml_moon.data.federated.save_partition_heatmap", lambda *a: None)
    built = assemble(load_config(CONFIGS / "fedavg.yaml", [*TINY, *THREE, *SECURE]), tmp_path)
    server = built.loop.server
    downloads = server.downloads(0)
    before = {k: v.clone() for k, v in server.aggregator.global_state.items()}
    results = {}
    for party, payload in downloads.items():
        model = {k: v + 0.01 if v.is_floating_point() else v for k, v in payload["model"].items()}
        if party == min(downloads):
            name = next(k for k, v in model.items() if v.is_floating_point())
            model[name] = torch.full_like(model[name], float("nan"))
        metrics = {"loss": 1.0, "ce": 1.0}
        results[party] = (
            float(server.samples[party]),
            {"model": model, "party_id": party, "metrics": metrics},
        )
    with pytest.raises(SecAggError, match="among 2 parties: 2 participants, fewer than 3"):
        server.aggregate(0, results)
    assert f"party {min(downloads)}'s upload is left out" in caplog.text
    after = server.aggregator.global_state
    assert all(torch.equal(before[k], after[k]) for k in before)


@needs_data
def test_a_round_computed_again_after_a_resume_is_charged_again(tmp_path, monkeypatch):
    """DP: rounds 0, 1 and 2 release their noisy sums, the run dies after round 2 with its newest
    checkpoint at round 1, and is resumed. Round 2, computed again with fresh noise, is a second
    release of it: the accountant is the ledger's (privacy_ledger.jsonl), so after the resumed round 2
    epsilon is that of 4 releases, not 3; and the ledger says so."""
    monkeypatch.setattr("fedml_moon.data.federated.save_partition_heatmap", lambda *a: None)
    dp = ["privacy_args.dp_clip_norm=0.01", "privacy_args.dp_noise_multiplier=1.0", "train_args.comm_round=4"]
    cfg = load_config(CONFIGS / "fedavg.yaml", [*TINY, *dp])
    first = assemble(cfg, tmp_path)
    flat = flatten(first.loop.server.recorder.config)
    for round_idx in range(3):
        first.loop.one_round(round_idx)
        if round_idx < 2:
            first.loop.checkpoint(round_idx, flat)
    resumed = assemble(cfg, tmp_path, resume=True)
    assert resumed.loop.start_round == 2
    record = resumed.loop.one_round(2)
    schedule = resumed.loop.server.schedule
    releases = [schedule[0], schedule[1], schedule[2], schedule[2]]
    library = PrivacyAccountant(1.0, 3, 2, 1e-5)
    for ids in releases:
        library.record(ids)
    assert record["dp_epsilon_release"] == pytest.approx(library.epsilon_release())
    lines = (tmp_path / "privacy_ledger.jsonl").read_text().splitlines()
    assert [json.loads(x)["round"] for x in lines] == [0, 1, 2, 2]
