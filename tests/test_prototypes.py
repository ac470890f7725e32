"""FedSSC's class prototypes cannot be taken over by one party: a party speaks only for the classes it
holds (its `present` is checked against the partition the server holds), and under a robust rule a
class that fewer than 3 parties shared this round keeps its previous prototype, since every rule
reduces to a mean of one or two values."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedml_moon.algorithms.fedssc import FedSSCOptions, FedSSCServer, build_prototypes
from fedml_moon.config.load import load_config
from fedml_moon.config.schema import ConfigError, ServerArgs, TrainArgs
from fedml_moon.core.robust import RobustMean, RobustOptions
from fedml_moon.distributed import managers as m
from tests.support.marks import needs_fmnist
from tests.support.server import FEDAVG_CONFIG, receive, result_item, server_manager

pytestmark = needs_fmnist


def _server_algorithm(rule: str = "none", **options) -> FedSSCServer:
    server = FedSSCServer(FedSSCOptions(**options), ServerArgs(robust_aggregation=rule), TrainArgs(), 0)
    server.class_counts = {0: [50, 3, 11, 0], 1: [0, 40, 40, 40]}
    return server


def test_present_must_be_the_partys_own_classes():
    server = _server_algorithm()
    honest = {"present": torch.tensor([True, False, True, False])}  # > 10 samples: classes 0 and 2
    assert server.upload_problem(honest, 0) is None
    every = {"present": torch.ones(4, dtype=torch.bool)}
    assert "present differs at classes [1, 3]: party 0 holds more than 10 samples of classes [0, 2]" in (
        server.upload_problem(every, 0)
    )
    assert "differs at classes [0, 2]" in server.upload_problem({"present": torch.tensor([False] * 4)}, 0)
    assert server.upload_problem(honest, 7) is None  # a party the server has no counts for: the spec decides


def _uploads(values: list[list[float]], classes: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One upload per row: prototype `row` for class 0 (class 1 held by nobody)."""
    out = []
    for row in values:
        protos = torch.zeros(classes, len(row))
        protos[0] = torch.tensor(row)
        out.append((protos, torch.tensor([True] + [False] * (classes - 1))))
    return out


@pytest.mark.parametrize("rule", ["median", "trimmed_mean", "krum", "norm_clip"])
def test_a_rare_class_keeps_its_previous_prototype_under_a_robust_rule(rule):
    """Two holders (an honest party and one that sends a huge opposite prototype): the rule cannot act
    on two values, so the class keeps its previous direction; with three honest holders beside the
    attacker, the rule's prototype points the honest way."""
    mean = RobustMean(RobustOptions(rule, krum_byzantine=1, trim_ratio=0.25))
    previous = (torch.tensor([[1.0, 0.0], [0.0, 0.0]]), torch.tensor([True, False]))
    server = _server_algorithm(rule)
    rng = np.random.default_rng(0)
    two = _uploads([[1.0, 0.1], [-1e6, 0.0]])
    protos, present = build_prototypes(two, "mean", 1, rng, mean, previous, server.min_holders())
    assert torch.equal(protos[0], previous[0][0]) and present.tolist() == [True, False]
    five = _uploads([[1.0, 0.1], [0.9, 0.0], [1.1, -0.1], [1.0, 0.05], [-1e6, 0.0]])
    protos, _ = build_prototypes(five, "mean", 1, rng, mean, previous, server.min_holders())
    assert F.cosine_similarity(protos[0], torch.tensor([1.0, 0.0]), dim=0) > 0.99, (rule, protos[0])


def test_without_a_rule_every_holder_counts_and_the_previous_value_fills_an_unheld_class():
    server = _server_algorithm()
    assert server.min_holders() == 1 and _server_algorithm("median").min_holders() == 3
    previous = (torch.tensor([[0.0, 0.0], [5.0, 5.0]]), torch.tensor([False, True]))
    protos, present = build_prototypes(
        _uploads([[2.0, 0.0], [4.0, 2.0]]), "mean", 1, np.random.default_rng(0), None, previous, 1
    )
    assert protos.tolist() == [[3.0, 1.0], [5.0, 5.0]] and present.tolist() == [True, True]


def test_a_robust_rule_with_random_k_below_3_is_a_config_error():
    base = ["train_args.algorithm=fedssc", "server_args.robust_aggregation=median"]
    with pytest.raises(ConfigError, match="algorithm_args.prototype_k: a robust rule needs at least 3"):
        load_config(FEDAVG_CONFIG, base)
    assert load_config(FEDAVG_CONFIG, [*base, "algorithm_args.prototype_mode=mean"])
    with pytest.raises(ConfigError, match="algorithm_args.prototype_min_holders"):
        load_config(FEDAVG_CONFIG, ["train_args.algorithm=fedssc", "algorithm_args.prototype_min_holders=0"])


def test_a_silo_that_claims_classes_it_does_not_hold_is_refused_and_changes_nothing(tmp_path, caplog):
    """FedSSC over the distributed server: a RESULT whose `present` claims every class (with huge
    prototypes) is refused naming the classes; the silo's honest result then completes the round."""
    manager, wire = server_manager(tmp_path, "train_args.algorithm=fedssc")
    task = next(t for t in wire.sent if t.get_type() == m.TRAIN and t.get_receiver_id() == 1)
    model = task.get("tasks")[0]["payload"]["model"]
    classes, dim = model["classifier.weight"].shape
    held = torch.tensor(manager.rounds.aggregator.algorithm.class_counts[0]) > 10
    assert not bool(held.all())  # party 0 lacks a class: Dir(0.5) over 3 parties
    for rank in (1, 2, 3):
        party = rank - 1
        counts = torch.tensor(manager.rounds.aggregator.algorithm.class_counts[party])
        upload = {"prototypes": torch.ones(classes, dim), "present": counts > 10}
        if rank == 1:
            claim = result_item(manager, party, model)
            claim["upload"].update(
                prototypes=1e6 * torch.ones(classes, dim), present=torch.ones(classes).bool()
            )
            receive(manager, 1, m.RESULT, round=0, results=[claim])
            assert "upload.present differs at classes" in caplog.text and manager.state.round.pending == {
                1,
                2,
                3,
            }
        item = result_item(manager, party, model)
        item["upload"].update(upload)
        receive(manager, rank, m.RESULT, round=0, results=[item])
    record = manager.rounds.recorder.records[0]
    assert record["parties"] == 3 and "rejected_parties" not in record
    server = manager.rounds.aggregator.algorithm
    assert float(server.prototypes.abs().max()) == 1.0  # the huge claim never reached them
