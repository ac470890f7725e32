"""Buffers are checked by meaning, not only by type, and server momentum moves trainable parameters
only: BatchNorm's variances stay >= 0 and its counters within what a round's local steps allow,
whether a silo sends them or the server's own momentum moves them."""

from __future__ import annotations

import math
from collections import OrderedDict

import pytest
import torch

from fedml_moon.core.aggregation import ServerMomentum
from fedml_moon.core.validate import buffer_problem, report_problem
from fedml_moon.distributed import managers as m
from fedml_moon.engine.uploads import COUNTER_SLACK, local_steps
from tests.support.marks import needs_fmnist
from tests.support.server import FEDAVG_CONFIG, answer_train, receive, result_item, server_manager

pytestmark = needs_fmnist

SENT = OrderedDict(
    w=torch.ones(3), bn_running_var=torch.ones(3), bn_num_batches_tracked=torch.tensor(5), ids=torch.arange(3)
)


def _with(**changes) -> OrderedDict:
    out = OrderedDict((k, v.clone()) for k, v in SENT.items())
    out.update(changes)
    return out


@pytest.mark.parametrize(
    ("upload", "named"),
    [
        (_with(bn_running_var=torch.tensor([1.0, -0.5, 2.0])), "model.bn_running_var has negative variances"),
        (_with(bn_num_batches_tracked=torch.tensor(-(2**62))), "outside [5, 15]"),
        (_with(bn_num_batches_tracked=torch.tensor(4)), "outside [5, 15]"),
        (_with(bn_num_batches_tracked=torch.tensor(16)), "outside [5, 15]"),
        (_with(ids=torch.tensor([0, 1, 7])), "model.ids changed"),
    ],
)
def test_a_buffer_that_local_training_cannot_produce_is_named(upload, named):
    assert named in buffer_problem(upload, SENT, cap=10)


def test_what_local_training_produces_passes():
    assert buffer_problem(_with(bn_num_batches_tracked=torch.tensor(15), w=-SENT["w"]), SENT, cap=10) is None
    assert buffer_problem(_with(bn_running_var=torch.zeros(3)), SENT, cap=0) is None
    assert local_steps(samples=130, epochs=2, batch_size=64) == 6 and COUNTER_SLACK >= 1


def test_a_report_s_personal_layers_are_checked_by_meaning_too():
    spec = {"bn.running_var": torch.empty(2, device="meta")}
    good = {"party_id": 0, "local_test_acc": 0.5, "personal": {"bn.running_var": torch.ones(2)}}
    assert report_problem(good, 0, spec) is None
    bad = {**good, "personal": {"bn.running_var": torch.tensor([1.0, -1.0])}}
    assert "negative variances" in report_problem(bad, 0, spec)


def test_server_momentum_moves_trainable_parameters_only_and_buffers_take_the_average():
    """FedAvgM (beta 0.9) over rounds where the variance keeps falling: the weights overshoot the
    average, as momentum does; the buffers are the round's average exactly, so they stay >= 0."""
    momentum = ServerMomentum(0.9, "fedavgm")
    old = OrderedDict(w=torch.tensor([1.0]), bn_running_var=torch.tensor([1.0]), bn_num=torch.tensor(3))
    for target in (0.5, 0.2, 0.1):
        avg = OrderedDict(
            w=torch.tensor([target]), bn_running_var=torch.tensor([target]), bn_num=torch.tensor(9)
        )
        new = momentum.step(old, avg, trainable=["w"])
        assert torch.equal(new["bn_running_var"], avg["bn_running_var"]) and new["bn_num"].item() == 9
        old = new
    assert old["w"].item() < 0  # the weight went past 0: momentum at work, where a variance cannot


def _resnet_server(tmp_path):
    return server_manager(tmp_path, "model_args.model=resnet50", "data_args.max_test_samples=16")


@pytest.mark.slow
def test_a_silo_s_negative_variance_or_counter_is_refused_and_changes_nothing(tmp_path, caplog):
    """ResNet-50 (BatchNorm): a RESULT whose running_var is negative, or whose counter is -2**62 or
    past the round's steps, is refused naming the buffer; the silo's honest result then completes
    the round, whose model has every variance >= 0."""
    manager, wire = _resnet_server(tmp_path)
    task = next(t for t in wire.sent if t.get_type() == m.TRAIN and t.get_receiver_id() == 1)
    model = task.get("tasks")[0]["payload"]["model"]
    var = next(k for k in model if k.endswith("running_var"))
    count = next(k for k in model if k.endswith("num_batches_tracked"))
    honest = {**model, count: model[count] + 3}
    for bad, named in (
        ({var: -100 * torch.ones_like(model[var])}, f"model.{var} has negative variances"),
        ({count: torch.tensor(-(2**62))}, f"model.{count} is -4611686018427387904, outside"),
        ({count: model[count] + 10**6}, f"model.{count} is 1000000, outside"),
    ):
        item = result_item(manager, 0, {**honest, **bad})
        receive(manager, 1, m.RESULT, round=0, results=[item])
        assert named in caplog.text
    assert manager.state.round.pending == {1, 2, 3}
    receive(manager, 1, m.RESULT, round=0, results=[result_item(manager, 0, honest)])
    for rank in (2, 3):
        answer_train(manager, wire, rank)
    record = manager.rounds.recorder.records[0]
    assert record["parties"] == 3 and "rejected_parties" not in record and math.isfinite(record["test_loss"])
    state = manager.rounds.aggregator.global_state
    assert all(bool((v >= 0).all()) for k, v in state.items() if k.endswith("running_var"))


@pytest.mark.slow
def test_fedavgm_with_resnet50_keeps_variances_non_negative_and_evaluation_finite(tmp_path):
    """The issue's case, smaller: FedAvgM (beta 0.9, Hsu et al.'s style), ResNet-50, 2 parties, 8 local
    steps a round. With momentum on every float entry the running variances went below zero in round
    1 (19 tensors) and the test loss was NaN; on trainable parameters only, neither."""
    from fedml_moon.adapters.run import assemble
    from fedml_moon.config.load import load_config

    settings = [
        "model_args.model=resnet50",
        "train_args.client_num_in_total=2",
        "train_args.client_num_per_round=2",
        "train_args.comm_round=2",
        "train_args.epochs=1",
        "train_args.batch_size=8",  # 8 steps of 8 a party: the fault shows in round 1 as with 16
        "data_args.max_train_samples=128",
        "data_args.max_test_samples=32",
        "data_args.partition_method=homo",
        "server_args.server_momentum=0.9",
        "server_args.server_momentum_style=fedavgm",
        "tracking_args.enable_wandb=false",
        "train_args.checkpoint_every=0",
    ]
    run = assemble(load_config(FEDAVG_CONFIG, settings), tmp_path)
    for round_idx in range(2):
        record = run.loop.one_round(round_idx)
        state = run.loop.aggregator.global_state
        negative = [k for k, v in state.items() if k.endswith("running_var") and bool((v < 0).any())]
        assert not negative and math.isfinite(record["test_loss"]), (round_idx, negative, record)
