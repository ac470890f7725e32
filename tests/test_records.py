"""The run's records are the server's: a silo reports only its algorithm's declared loss terms, never a
field the server writes (test_acc, best-so-far figures, epsilons, byte counts), and a party whose
metrics diverged is left out of its round rather than stalling it.

The server manager runs in this process on a tiny real run (tests/support/server.py)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from fedml_moon.algorithms.base import ClientAlgorithm, NoOptions, ServerAlgorithm
from fedml_moon.core.validate import SERVER_FIELDS, metrics_problem, terms_problem
from fedml_moon.distributed import managers as m
from fedml_moon.engine.batched import train_party
from fedml_moon.registry import ALGORITHMS, AlgorithmSpec, register
from tests.support.marks import needs_fmnist
from tests.support.server import answer_train, receive, result_item, server_manager
from tests.support.tiny import tiny_batches, tiny_factory, train_args

pytestmark = needs_fmnist

TIMING = ("round_time_s", "wire_bytes_sent", "wire_bytes_received")


def _records(manager) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in manager.rounds.recorder.records]


class _Named(ClientAlgorithm):
    terms = ("ce", "test_acc")


def test_every_builtin_algorithm_declares_terms_the_server_can_record():
    for spec in ALGORITHMS.values():
        assert terms_problem(spec.client.terms) is None, spec.name
        assert not set(spec.client.terms) & SERVER_FIELDS


@pytest.mark.parametrize(
    ("terms", "named"),
    [
        (("ce", "test_acc"), "'test_acc', a field the server writes"),
        (("local_test_acc_best_so_far",), "a field the server writes"),
        (("loss",), "'loss', a field the server writes"),
        (("a b",), "not a name like l_con"),
        (["ce"], "must be a tuple"),
    ],
)
def test_an_algorithm_that_declares_a_server_field_as_a_term_is_not_registered(terms, named):
    client = type("Hostile", (ClientAlgorithm,), {"terms": terms})
    with pytest.raises(ValueError, match="algorithm 'hostile'") as err:
        register(AlgorithmSpec("hostile", client, ServerAlgorithm, NoOptions, "x"))
    assert named in str(err.value) and "hostile" not in ALGORITHMS


def test_a_loss_that_returns_an_undeclared_term_stops_training_naming_terms():
    class Extra(ClientAlgorithm):
        def loss(self, net, x, y, ctx):
            ce = torch.nn.functional.cross_entropy(net(x).logits, y)
            return ce, {"ce": ce.detach(), "extra": ce.detach()}

    model = tiny_factory()()
    algorithm = Extra(NoOptions(), train_args(), tiny_factory(), 0)
    with pytest.raises(ValueError, match=r"returned the terms \['extra'\].*add them to `terms`"):
        train_party(algorithm, model, {"model": model.state_dict()}, {}, tiny_batches(), "cpu", 0, 0)


def test_metrics_are_checked_against_the_declared_terms_and_huge_integers_are_named():
    assert metrics_problem({"loss": 1.0, "ce": 0.5}, ("ce",)) is None
    assert "'test_acc', which is not one of the algorithm's terms" in metrics_problem(
        {"test_acc": 0.9}, ("ce",)
    )
    assert "metrics.ce is an integer of about 400 digits" in metrics_problem({"ce": 10**399}, ("ce",))
    assert "about 5000 digits" in metrics_problem({"ce": -(10**4999)}, ("ce",))
    assert "metrics.ce is a str" in metrics_problem({"ce": "1"}, ("ce",))


def _round_0(tmp_path, attack: list[tuple[int, str, dict]]) -> tuple:
    """Round 0 of the tiny FedAvg run: `attack` first, then the three silos' honest results."""
    manager, wire = server_manager(tmp_path)
    for rank, kind, fields in attack:
        receive(manager, rank, kind, **fields)
    for rank in (1, 2, 3):
        answer_train(manager, wire, rank)
    return manager, wire


@pytest.mark.parametrize(
    ("metrics", "named"),
    [
        ({"loss": 1.0, "ce": 1.0, "test_acc": 0.99, "test_loss": 0.1}, "'test_acc', which is not one of"),
        ({"loss": 1.0, "test_acc": 0.99}, "'test_acc', which is not one of"),
        ({"loss": 1.0, "local_test_acc_best_so_far": 2.0}, "'local_test_acc_best_so_far'"),
        ({"loss": 1.0, "round": 7}, "'round', which is not one of"),
        ({"loss": 1.0, "ce": 10**399}, "metrics.ce is an integer of about 400 digits"),
    ],
)
def test_a_silo_cannot_write_a_server_field_and_its_result_changes_nothing(tmp_path, caplog, metrics, named):
    """A RESULT whose metrics name a field the server writes (on a round that is not evaluated, or
    one that is) is refused, naming the field; the round's records are those of a round without it."""
    honest, _ = _round_0(tmp_path / "honest", [])
    probe, wire = server_manager(tmp_path / "probe")
    model = next(t for t in wire.sent if t.get_type() == m.TRAIN).get("tasks")[0]["payload"]["model"]
    item = result_item(probe, 0, model)
    hostile = {**item, "upload": {**item["upload"], "metrics": metrics}}
    attacked, _ = _round_0(tmp_path / "attacked", [(1, m.RESULT, {"round": 0, "results": [hostile]})])
    assert named in caplog.text
    assert _records(attacked) == _records(honest)
    assert "test_acc" not in attacked.rounds.recorder.records[0] or attacked.rounds.evaluation.evaluates(0)


def test_the_server_records_only_declared_terms_whatever_reaches_finish_round(tmp_path):
    """Defence in depth: a metric of another name that reached the round's results (a bug, or a path
    that did not check) is not recorded, and a server field is the server's."""
    manager, _ = server_manager(
        tmp_path, "validation_args.frequency_of_the_test=2", "train_args.comm_round=3"
    )
    rounds = manager.rounds
    rounds.downloads(1)
    forged = {"loss": 1.0, "ce": 0.5, "test_acc": 0.99, "local_test_acc_best_so_far": 5.0, "parties": 99}
    record = rounds.finish_round(1, [(10.0, {"metrics": forged})], None)
    assert not rounds.evaluation.evaluates(1)
    assert "test_acc" not in record and "local_test_acc_best_so_far" not in record
    assert record["parties"] == 1 and record["ce"] == 0.5 and record["train_loss"] == 1.0
    summary = rounds.recorder.summary("completed")
    assert summary["best_test_acc"] is None and "reported_local_test_acc" not in summary


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1e300])
def test_a_diverged_partys_metrics_leave_it_out_of_the_round_without_a_wait(tmp_path, caplog, value):
    """A RESULT whose metric is NaN, infinite or beyond 1e15 is taken (it is well formed) and the party
    is left out as a diverged one: named in rejected_parties, and the round goes on at once."""
    manager, wire = server_manager(tmp_path)
    for rank in (2, 3):
        answer_train(manager, wire, rank)
    task = next(t for t in wire.sent if t.get_type() == m.TRAIN and t.get_receiver_id() == 1)
    item = result_item(manager, 0, task.get("tasks")[0]["payload"]["model"])
    diverged = {**item, "upload": {**item["upload"], "metrics": {"loss": value, "ce": 1.0}}}
    receive(manager, 1, m.RESULT, round=0, results=[diverged])
    record = manager.rounds.recorder.records[0]  # no tick, no deadline: the round is closed
    assert record["rejected_parties"] == [0] and record["parties"] == 2
    assert record["train_loss"] is None  # the other two reported no loss: the diverged one is not in it
    assert "party 0's upload is left out: metrics.loss is" in caplog.text


def test_a_record_that_is_not_finite_is_written_as_null_and_named(tmp_path, caplog):
    """JSON has no NaN: a diverged evaluation's figure is null in metrics.jsonl and summary.json, and
    the log names it; every line parses as strict JSON."""
    from fedml_moon.records.recorder import RunRecorder

    recorder = RunRecorder(tmp_path, {})
    recorder.log_round({"round": 0, "parties": 3, "train_loss": 1.0, "test_acc": 0.1, "test_loss": math.nan})
    recorder.log_round({"round": 1, "parties": 3, "train_loss": math.inf, "test_acc": 0.2, "test_loss": 2.0})
    recorder.finish("completed")
    strict = lambda text: json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))  # noqa: E731
    lines = [strict(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["test_loss"] is None and lines[1]["train_loss"] is None
    assert strict((tmp_path / "summary.json").read_text())["best_test_acc"] == 0.2
    assert "not finite, written as null: test_loss" in caplog.text


def test_one_partys_local_layers_cannot_set_the_new_test_under_a_robust_rule():
    """LG-FedAvg's new test averages the parties' own layers: under a robust rule the server's average
    is that rule, so one report of huge (finite) layers leaves the figure finite and near the honest."""
    from fedml_moon.config.schema import ServerArgs, TrainArgs
    from fedml_moon.core.models import build_model
    from tests.support.tiny import tiny_batches

    model = build_model("mlp", (1, 4, 4), 3, True, 8, "none")
    honest = [{k: v + 0.01 * i for k, v in model.state_dict().items()} for i in range(4)]
    hostile = {k: torch.full_like(v, 3e38) for k, v in model.state_dict().items()}
    test = tiny_batches(num_classes=3)
    for rule, finite in (("median", True), ("none", False)):
        server = ServerAlgorithm(NoOptions(), ServerArgs(robust_aggregation=rule), TrainArgs(), 0)
        figures = server.new_test(model, [*honest, hostile], test, torch.device("cpu"))
        assert math.isfinite(figures["new_test_loss"]) == finite, (rule, figures)
