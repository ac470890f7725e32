"""LG-FedAvg's options for the authors' recipe: warm-up learning rate, warm start from the best
warm-up model, and the authors' best-so-far reporting (by hand on a two-number model)."""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from torch import nn

from fedml_moon.adapters.run import assemble
from fedml_moon.algorithms.base import NoOptions, PartyRound
from fedml_moon.algorithms.baselines import FedAvgClient
from fedml_moon.algorithms.lg import LGClient, LGOptions, LGServer
from fedml_moon.config.load import load_config
from fedml_moon.config.schema import ServerArgs
from fedml_moon.core.aggregation import clone_state
from fedml_moon.core.models import ModelOutput
from fedml_moon.core.personal import BestSoFar, local_test_accs
from fedml_moon.core.split import split_state
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from fedml_moon.engine.batched import train_party
from fedml_moon.records.recorder import RunRecorder
from tests.support.tiny import tiny_batches, tiny_factory, train_args

CPU = torch.device("cpu")


def test_warmup_lr_trains_the_warmup_at_its_own_rate():
    opts = LGOptions(split_preset="head", warmup_lr=0.3)
    start = clone_state(tiny_factory()().state_dict())
    lg, ref, lg_model, ref_model = (
        LGClient(opts, train_args(), tiny_factory(), 0),
        FedAvgClient(NoOptions(), train_args(learning_rate=0.3), tiny_factory(), 0),
        tiny_factory()(),
        tiny_factory()(),
    )
    train_party(lg, lg_model, {"model": start, "phase": "fedavg"}, {}, tiny_batches(), CPU, 0, 0)
    train_party(ref, ref_model, {"model": start}, {}, tiny_batches(), CPU, 0, 0)
    ours, theirs = lg_model.state_dict(), ref_model.state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    global_keys, local_keys = opts.split(start.keys())
    lg_round = PartyRound(
        {"model": split_state(start, global_keys), "phase": "lg"},
        {"local": split_state(start, local_keys)},
        1,
        0,
        tuple(n for n, p in lg_model.named_parameters() if p.requires_grad),
    )
    assert lg.context(lg_round).lr == train_args().learning_rate  # LG rounds: train_args'


def test_warm_start_from_the_best_evaluated_warmup_round():
    opts = LGOptions(split_preset="head", warmup_rounds=3, warmup_start="best")
    server = LGServer(opts, ServerArgs(), train_args())
    base = server.setup(clone_state(tiny_factory()().state_dict()))
    states = [OrderedDict((k, torch.full_like(v, float(r))) for k, v in base.items()) for r in range(3)]
    assert [server.wants_evaluation(r) for r in range(4)] == [False, False, True, False]
    for r, acc in enumerate([0.5, 0.7, 0.6]):
        out = server.after_evaluation(r, {"test_acc": acc}, states[r])
    assert all(torch.equal(out[k], states[1][k]) for k in base)  # round 1 had the best test accuracy
    assert server.after_evaluation(3, {"test_acc": 0.9}, states[2]) is states[2]  # LG phase: untouched
    last = LGServer(LGOptions(split_preset="head", warmup_rounds=3), ServerArgs(), train_args())
    last.setup(base)
    assert last.after_evaluation(2, {"test_acc": 0.1}, states[2]) is states[2] and not last.wants_evaluation(
        2
    )


class TwoNumbers(nn.Module):
    """logits = g + loc for every input: predicts argmax(g + loc). `g` global, `loc` local."""

    def __init__(self) -> None:
        super().__init__()
        self.g, self.loc = nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(2))

    def forward(self, x):
        logits = (self.g + self.loc).expand(len(x), 2)
        return ModelOutput(x, x, logits)


def _state(g, loc):
    return OrderedDict(g=torch.tensor(g), loc=torch.tensor(loc))


def _labels(*ys):
    return [(torch.zeros(len(ys), 1), torch.tensor(ys))]


def test_best_so_far_by_hand():
    tracker, model = BestSoFar(["g"]), TwoNumbers()
    test_local = [_labels(0, 0), _labels(1, 1)]  # party 0 holds class 0, party 1 class 1
    test_global = _labels(0, 0, 0, 1)
    tracker.update([_state([0.0, 0.0], [1.0, 0.0]), _state([0.0, 0.0], [1.0, 0.0])], [1.0, 0.0])
    tracker.update([_state([0.0, 0.1], [0.0, 0.0]), _state([0.0, 0.0], [0.0, 2.0])], [0.0, 1.0])
    # best so far: party 0's first model (acc 1 > 0), party 1's second (1 > 0)
    # average: g = [0, 0], l = [0.5, 1.0] -> predicts 1 -> 1 of 4 global test samples
    # local: each best model with the average's g = [0, 0]: party 0 predicts 0, party 1 predicts 1
    out = tracker.evaluate(model, test_local, test_global, CPU)
    assert out == {"local_test_acc_best_so_far": 1.0, "new_test_acc_best_so_far": 0.25}
    tracker.update([_state([5.0, 0.0], [0.0, 0.0]), _state([0.0, 0.0], [0.0, 2.0])], [1.0, 1.0])  # ties
    assert torch.equal(tracker.best[0][1]["g"], torch.tensor([5.0, 0.0]))  # the newer model wins a tie


def test_summary_reports_the_round_where_the_best_so_far_local_test_peaks(tmp_path):
    recorder = RunRecorder(tmp_path, {})
    for r, (loc, new) in enumerate([(0.5, 0.4), (0.9, 0.6), (0.8, 0.7)]):
        recorder.log_round(
            {
                "round": r,
                "test_acc": 0.5,
                "test_loss": 1.0,
                "train_loss": 1.0,
                "local_test_acc_best_so_far": loc,
                "new_test_acc_best_so_far": new,
            }
        )
    summary = recorder.summary("completed")
    assert (summary["reported_round"], summary["reported_local_test_acc"]) == (1, 0.9)
    assert summary["reported_new_test_acc"] == 0.6


def test_the_pool_starts_with_the_lg_start_model_and_reports_nothing_before():
    tracker, model = BestSoFar(["g"]), TwoNumbers()
    test_local = [_labels(0, 0), _labels(1, 1)]
    test_global = _labels(0, 1)
    warmup = [_state([0.0, 9.0], [0.0, 0.0])] * 2  # a warm-up model that suits party 1 perfectly
    assert tracker.figures(model, warmup, [0.0, 1.0], test_local, test_global, CPU) == {}
    start = _state([1.0, 0.0], [0.0, 0.0])  # the LG start predicts 0: party 0 right, party 1 wrong
    tracker.begin(start)
    first = [_state([0.0, 0.0], [0.0, 1.0]), _state([0.0, 0.0], [0.0, 1.0])]  # both predict 1
    out = tracker.figures(model, first, [0.0, 1.0], test_local, test_global, CPU)
    # party 0: its first LG model (acc 0) is worse than the start (acc 1), it keeps the start;
    # party 1: 1 > 0, its first LG model; never the warm-up model, which was offered before `begin`
    assert tracker.best[0][0] == 1.0 and all(torch.equal(tracker.best[0][1][k], start[k]) for k in start)
    assert tracker.best[1][0] == 1.0 and torch.equal(tracker.best[1][1]["loc"], torch.tensor([0.0, 1.0]))
    # the average: g = [0.5, 0], loc = [0, 0.5] -> predicts 0 (0.5 > 0.5 is false: argmax takes the
    # first): 1 of 2 global samples; local: party 0 start's loc with g -> 0 (right), party 1 -> 1 (right)
    assert out == {"local_test_acc_best_so_far": 1.0, "new_test_acc_best_so_far": 0.5}
    restored = BestSoFar(["g"])
    restored.load_state(tracker.state())
    assert restored.begun and restored.start is None and restored.best.keys() == tracker.best.keys()


@pytest.mark.skipif(not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist")
def test_authors_recipe_in_a_run(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    overrides = [
        "data_args.max_train_samples=2000",
        "data_args.max_test_samples=2000",
        "train_args.comm_round=4",
        "tracking_args.enable_wandb=false",
        "validation_args.frequency_of_the_test=1",
        "algorithm_args.warmup_rounds=2",
        "algorithm_args.warmup_start=best",
        "algorithm_args.warmup_lr=0.1",
        "algorithm_args.report_best=true",
    ]
    starts, offered = [], []
    begin, update = BestSoFar.begin, BestSoFar.update
    monkeypatch.setattr(BestSoFar, "begin", lambda self, s: (starts.append(clone_state(s)), begin(self, s)))
    monkeypatch.setattr(BestSoFar, "update", lambda self, s, a: (offered.append(list(a)), update(self, s, a)))
    run = assemble(load_config("config/fashion_mnist/lg.yaml", overrides), tmp_path / "out")
    run.loop.run()
    records = [json.loads(x) for x in Path(tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records if "test_acc" in r] == [0, 1, 2, 3]
    assert not any("local_test_acc_best_so_far" in r for r in records[:2])  # the warm-up: none
    for r in records[2:]:
        assert 0 <= r["new_test_acc_best_so_far"] <= 1 and 0 <= r["local_test_acc_best_so_far"] <= 1
    best_warmup = max(records[:2], key=lambda r: r["test_acc"])["round"]  # ties: the older
    algorithm = run.loop.aggregator.algorithm
    assert algorithm.best_warmup[1] == best_warmup
    assert len(starts) == 1 and len(offered) == 2  # begun once; offered the two LG rounds only
    assert all(torch.equal(starts[0][k], v) for k, v in algorithm.best_warmup[2].items())  # LG's start
    test_local = [run.loop.runner.test_local[p] for p in range(len(offered[0]))]
    model = run.loop.aggregator.model
    from_start = local_test_accs(model, starts * len(test_local), test_local, CPU)
    kept = algorithm.figures.best
    assert [kept[p][0] for p in sorted(kept)] == [
        max(s, *o) for s, *o in zip(from_start, *offered, strict=True)
    ]
    assert run.loop.summary["reported_round"] in (2, 3)
