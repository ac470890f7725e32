"""DP clips and noises a model's trainable parameters only: integer counters travel in no private sum,
and BatchNorm's running statistics are refused under DP unless `privacy_args.dp_buffers: average`,
which averages them outside the clipped, noised part. A ResNet-50 update then keeps its norm when
clipped; before, its 53 counters outweighed the weights ~570 to 1. A party checks the plan it is sent
against its own privacy_args."""

from __future__ import annotations

import math
from collections import OrderedDict

import pytest
import torch

from fedml_moon.config.schema import ConfigError
from fedml_moon.core.models import build_model
from fedml_moon.privacy.mod import PrivateAggregation
from fedml_moon.privacy.options import PrivacyArgs
from fedml_moon.privacy.party import CLEAR, Plan, party_vector, plan_layout, plan_problem
from fedml_moon.privacy.sums import apply_mean_update

DP = dict(dp_clip_norm=1.0, dp_noise_multiplier=1e-12)
STATE = OrderedDict(w=torch.zeros(4), bn_running_var=torch.ones(2), bn_num_batches_tracked=torch.tensor(0))


def _privacy(buffers: str, per_round: int = 4, **options) -> PrivateAggregation:
    args = PrivacyArgs(**{**DP, **options}, dp_buffers=buffers)
    return PrivateAggregation(args, {"model": "update"}, dict.fromkeys(range(6), 1.0), per_round=per_round)


def test_float_buffers_are_refused_under_dp_naming_the_key():
    with pytest.raises(ConfigError, match="privacy_args.dp_buffers: the model has 1 float buffers"):
        _privacy("refuse").set_model(["w"], STATE)
    privacy = _privacy("average")
    privacy.set_model(["w"], STATE)
    plan = privacy.plan(0)
    assert plan.left_out == ("bn_num_batches_tracked",) and plan.clear == ("bn_running_var",)
    secure_only = PrivateAggregation(PrivacyArgs(secure_aggregation=True), {"model": "update"}, {0: 1.0}, 3)
    secure_only.set_model(["w"], STATE)  # no DP: the buffers are summed with the rest, the counter not
    assert secure_only.plan(0).left_out == ("bn_num_batches_tracked",) and secure_only.plan(0).clear == ()


def _upload(w: list[float], var: list[float], count: int) -> dict:
    model = OrderedDict(
        w=torch.tensor(w), bn_running_var=torch.tensor(var), bn_num_batches_tracked=torch.tensor(count)
    )
    return {"model": model, "metrics": {"loss": 1.0}}


def test_buffers_are_averaged_over_the_parties_summed_and_the_weights_over_the_sampled():
    """DP-FedAvg divides the clipped sum by m = 4 sampled; BatchNorm's statistics, outside it, are the
    mean over the 3 parties summed; the counter stays the server's."""
    privacy = _privacy("average")
    privacy.set_model(["w"], STATE)
    uploads = [
        _upload([0.1, 0, 0, 0], [2.0, 3.0], 9),
        _upload([0.2, 0, 0, 0], [1.0, 1.0], 9),
        _upload([0.3, 0, 0, 0], [3.0, 2.0], 9),
    ]
    vectors = [party_vector(u, {"model": STATE}, privacy.plan(p)) for p, u in enumerate(uploads)]
    total = torch.stack([v.vector for v in vectors]).sum(dim=0)
    assert vectors[0].entries == plan_layout({"model": STATE}, privacy.plan(0))
    sums = privacy.finish(total, vectors[0].entries, vectors[0].metric_names, [0, 1, 2])
    moved = apply_mean_update(STATE, sums.fields["model"], sums.weight)
    assert moved["w"].tolist() == pytest.approx([0.6 / 4, 0, 0, 0], abs=1e-7)  # float32 weights
    assert moved["bn_running_var"].tolist() == pytest.approx([2.0, 2.0], abs=1e-6)
    assert "bn_num_batches_tracked" not in moved and CLEAR not in sums.fields


def test_a_resnet50_dp_update_is_clipped_by_its_trainable_parameters_alone():
    """ResNet-50 (the CIFAR stem, 100 classes): an update of norm 0.5 over the weights, running
    variances and means moved and 53 counters moved by 100. Clipped to C = 1 it keeps its norm 0.5
    (buffers excluded); to C = 0.1, exactly 0.1; every statistic travels as it is in the clear part,
    and no counter travels at all. With every entry in the clipped vector, its norm would be ~728."""
    torch.manual_seed(0)
    model = build_model("resnet50", (3, 32, 32), 100, True, 256, "none")
    state = OrderedDict((k, v.detach().clone()) for k, v in model.state_dict().items())
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    direction = {k: torch.randn_like(state[k]) for k in trainable}
    scale = 0.5 / math.sqrt(sum(float(d.square().sum()) for d in direction.values()))
    upload = OrderedDict(
        (k, v + scale * direction[k] if k in trainable else v.clone()) for k, v in state.items()
    )
    for key in state:
        if key.endswith("running_var"):
            upload[key] = upload[key] + 1.0
        elif key.endswith("num_batches_tracked"):
            upload[key] = upload[key] + 100
    counters = [k for k in state if k.endswith("num_batches_tracked")]
    assert len(counters) == 53
    for clip, norm in ((1.0, 0.5), (0.1, 0.1)):
        privacy = _privacy("average", dp_clip_norm=clip)
        privacy.set_model(trainable, state)
        vector = party_vector({"model": upload, "metrics": {"loss": 1.0}}, {"model": state}, privacy.plan(0))
        clipped = sum(math.prod(shape) for f, _, shape in vector.entries if f != CLEAR)
        assert vector.norm == pytest.approx(0.5, rel=1e-6)
        assert float(vector.vector[:clipped].norm()) == pytest.approx(norm, rel=1e-6, abs=1e-9)
        assert not any(k in counters for _, k, _ in vector.entries)
        clear = vector.vector[clipped : -len(vector.metric_names)]  # then the metrics
        assert float(clear.sum()) == pytest.approx(
            sum(upload[k].numel() for k in state if k.endswith("running_var"))
        )
    every = Plan({"model": "update"}, clip=1.0)  # the old vector: every entry clipped together
    assert party_vector({"model": upload}, {"model": state}, every).norm > 700


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (dict(clip=2.0), "is not the run's privacy_args"),
        (dict(noise_std=0.1), "noise share 0.1 is not sigma C / sqrt(5)"),
        (dict(min_sum=0), "min_sum 0 is not in [1, 9]"),
        (dict(min_sum=10), "min_sum 10 is not in [1, 9]"),
        (dict(discount=0.5), "discount 0.5 is not 1"),  # a synchronous run discounts nothing
    ],
)
def test_a_party_refuses_a_plan_that_is_not_what_its_run_asks(change, named):
    options = PrivacyArgs(secure_aggregation=True, dp_clip_norm=1.0, dp_noise_multiplier=2.0)
    privacy = PrivateAggregation(options, {"model": "update"}, dict.fromkeys(range(9), 1.0), 9, quorum=5)
    plan = privacy.plan(0)
    assert plan_problem(plan, options, 9) is None
    bad = Plan(**{**plan.to_dict(), **change})
    assert named in plan_problem(bad, options, 9)
    assert Plan.from_dict(plan.to_dict()) == plan


def test_a_buffers_party_refuses_noise_sized_for_fewer_than_its_k():
    """A synchronous round's plan may size its noise for its quorum (min_sum 5 of 9); a buffer's sum
    is always of its K parties, so a party of a buffer takes no other min_sum (`exact`)."""
    options = PrivacyArgs(secure_aggregation=True, dp_clip_norm=1.0, dp_noise_multiplier=2.0)
    privacy = PrivateAggregation(options, {"model": "update"}, dict.fromkeys(range(9), 1.0), 9, quorum=5)
    plan = privacy.plan(0)
    assert plan.min_sum == 5 and plan_problem(plan, options, 9) is None
    assert "sized for 5 parties, not the buffer's 9" in plan_problem(plan, options, 9, exact=True)
    whole = PrivateAggregation(options, {"model": "update"}, dict.fromkeys(range(9), 1.0), 9, quorum=9)
    assert plan_problem(whole.plan(0), options, 9, exact=True) is None
