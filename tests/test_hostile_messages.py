"""A silo that holds valid credentials sends the server anything it likes: every message type, every
field filled as a hostile or broken peer would fill it. The server refuses what does not fit, names
the silo and the field, and goes on; an honest round after the attack gives the model it gives
without one.

The server manager runs in this process on a tiny real run (tests/support/server.py)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedml_moon.distributed import managers as m
from fedml_moon.distributed.protocol import ENVELOPE, SCHEMAS, message_problem
from tests.support.server import answer_train, receive, result_item, server_manager

_SHARED: dict = {}
SILO_TYPES = [m.HELLO, m.RESULT, m.REPORT, m.CHECKPOINTED, m.BYE, m.ERROR, m.HEARTBEAT]
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
trees = st.recursive(
    scalars | st.builds(torch.randn, st.integers(0, 3)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


@st.composite
def messages(draw) -> tuple[str, dict]:
    """A message type of the protocol (or none), with its declared fields (some replaced, dropped
    or added to) or entirely made-up fields."""
    kind = draw(st.sampled_from([*SCHEMAS, "bogus", ""]))
    declared = list(SCHEMAS.get(kind, {}))
    if declared and draw(st.booleans()):
        fields = {k: draw(trees) for k in declared}
        for key in draw(st.lists(st.sampled_from(declared), max_size=2)):
            fields.pop(key, None)
    else:
        names = st.text(min_size=1, max_size=8).filter(lambda k: k not in ENVELOPE)  # the transport's
        fields = draw(st.dictionaries(names, trees, max_size=3))
    return kind, fields


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(st.tuples(st.integers(0, 4), messages()), min_size=1, max_size=6))
def test_nothing_a_silo_sends_stops_the_server(tmp_path_factory, batch):
    """Whatever arrives, from a silo of the run, an unknown rank or posing as the server's own timer,
    no handler raises and the run is not stopped. One server takes every example, in the state the
    examples before left it in."""
    if "server" not in _SHARED:
        _SHARED["server"] = server_manager(tmp_path_factory.mktemp("hostile"))[0]
    manager = _SHARED["server"]
    for rank, (kind, fields) in batch:
        receive(manager, rank, kind, **fields)
        assert manager.state.round.phase != "done", (rank, kind, fields)


@pytest.mark.parametrize("kind", SILO_TYPES)
def test_each_silo_message_is_declared_and_a_missing_or_extra_field_is_named(kind):
    fields = dict.fromkeys(SCHEMAS[kind], 0)
    for key in SCHEMAS[kind]:
        rest = {k: v for k, v in fields.items() if k != key}
        assert message_problem(kind, rest) == f"the message lacks [{key!r}]"
    assert message_problem(kind, {**fields, "x": 1}).startswith("the message has unexpected fields ['x']")


def _model_after_round_0(tmp_path, attack: list[tuple[int, str, dict]]) -> dict:
    manager, wire = server_manager(tmp_path)
    for rank, kind, fields in attack:
        receive(manager, rank, kind, **fields)
    for rank in (1, 2, 3):
        answer_train(manager, wire, rank)
    assert manager.state.round.round_idx == 1 or manager.state.round.phase != "train"
    record = manager.rounds.recorder.records[0]
    assert record["parties"] == 3 and "missing_parties" not in record
    return manager.rounds.aggregator.global_state


def test_the_attacks_of_a_silo_leave_the_honest_round_unchanged(tmp_path, caplog):
    """The attacks found on the wire (NaN, 1e30 and negative weights, another silo's party, a results
    field of None, a HELLO whose config is a list, an upload of 1 of the model's entries, a BYE from
    a silo that is still working, a forged TICK) are each refused with the field named; the silos'
    honest results then give bitwise the model of a round without any attack."""
    honest = _model_after_round_0(tmp_path / "honest", [])
    manager, wire = server_manager(tmp_path / "probe")
    model = next(t for t in wire.sent if t.get_type() == m.TRAIN).get("tasks")[0]["payload"]["model"]
    item = result_item(manager, 0, model)
    one_entry = {**item, "upload": {"model": dict(list(model.items())[:1]), "party_id": 0}}
    constant = {k: torch.full_like(v, 7) if v.is_floating_point() else v for k, v in model.items()}
    attacks = [
        (1, m.RESULT, {"round": 0, "results": [{**item, "n": math.nan}]}),
        (1, m.RESULT, {"round": 0, "results": [{**item, "n": 10**30, "upload": {"model": constant}}]}),
        (1, m.RESULT, {"round": 0, "results": [{**item, "n": -299}]}),
        (1, m.RESULT, {"round": 0, "results": [{**item, "party": 1}]}),
        (1, m.RESULT, {"round": 0, "results": None}),
        (1, m.RESULT, {"round": 0, "results": [one_entry]}),
        (1, m.HELLO, {"parties": [0], "config": [1], "explicit": [], "fresh_parties": [], "process": "p1"}),
        (1, m.TICK, {}),
        (1, "bogus", {"x": 1}),
        (1, m.BYE, {"reason": "x" * 10}),
    ]
    attacked = _model_after_round_0(tmp_path / "attacked", attacks)
    assert set(attacked) == set(honest)
    assert all(torch.equal(attacked[k], honest[k]) for k in honest)
    for named in (
        "field results[0].n is a float, not an integer",
        "field results[0].n is 1000000000000000000000000000000, not in [1, ",
        "field results[0].n is -299, not in [1, ",
        "results are for parties [1], not its parties [0]",
        "field results is a NoneType, not a list",
        "results[0].upload.model lacks [",
        "refused a hello message from rank 1: field config is a list, not a dict of settings",
        "refused a tick message from rank 1: only a process's own timer sends TICK",
        "refused a bogus message from rank 1: type 'bogus' is not a message of this protocol",
        "refused a bye message from rank 1: the message has unexpected fields ['reason']",
    ):
        assert named in caplog.text, named


def test_a_partition_over_the_sample_cap_is_refused_naming_the_key(tmp_path):
    from fedml_moon.adapters.run import build_base, build_server
    from fedml_moon.config.load import load_config
    from fedml_moon.config.schema import ConfigError
    from tests.support.server import FEDAVG_CONFIG

    cfg = load_config(FEDAVG_CONFIG, ["data_args.max_train_samples=800", "comm_args.max_party_samples=50"])
    with pytest.raises(
        ConfigError, match=r"comm_args.max_party_samples: parties \[.*\] hold more than 50 samples"
    ):
        build_server(build_base(cfg, tmp_path))


@pytest.mark.parametrize(
    ("reports", "named"),
    [
        ([{"party_id": 1, "local_test_acc": 0.5}], "reports are not one for each of its parties [0]"),
        ([{"party_id": 0, "local_test_acc": 7.0}], "local_test_acc 7.0 is not a number in [0, 1]"),
        ([{"party_id": 0, "local_test_acc": 0.5}] * 2, "reports are not one for each of its parties [0]"),
        ([{"party_id": 0, "local_test_acc": 0.5, "personal": {}}], "the report's fields"),
    ],
)
def test_a_report_for_another_party_or_out_of_range_is_refused_and_changes_nothing(
    tmp_path, caplog, reports, named
):
    manager, wire = server_manager(tmp_path, "validation_args.local_test=true")
    for rank in (1, 2, 3):
        answer_train(manager, wire, rank)
    assert manager.state.round.phase == "eval"
    receive(manager, 1, m.REPORT, round=0, reports=reports)
    assert "refused rank 1's report: " in caplog.text and named in caplog.text
    for rank in (2, 3):
        receive(manager, rank, m.REPORT, round=0, reports=[{"party_id": rank - 1, "local_test_acc": 0.25}])
    receive(manager, 0, m.TICK)  # rank 1's report was refused, as if it never came: the round waits for it
    assert (
        manager.state.round.phase == "eval"
        and manager.state.round.pending == {1}
        and not manager.rounds.recorder.records
    )
    receive(manager, 1, m.REPORT, round=0, reports=[{"party_id": 0, "local_test_acc": 0.75}])
    assert manager.rounds.recorder.records[0]["local_test_acc"] == pytest.approx((0.75 + 0.25 + 0.25) / 3)


def test_under_dp_an_upload_without_a_metric_of_the_sum_is_refused_and_stops_nothing(tmp_path, caplog):
    """DP without secure aggregation (the server clips and sums each party's vector, its training
    metrics among the sum's entries): a RESULT whose upload lacks one is refused naming it, as if it
    never came, rather than stopping the run when the round is summed; the silo's honest result
    then completes the round."""
    manager, wire = server_manager(
        tmp_path, "privacy_args.dp_clip_norm=1.0", "privacy_args.dp_noise_multiplier=1.0"
    )
    metrics = {"ce": 0.5, "loss": 0.5}
    for rank in (1, 2, 3):
        task = next(t for t in wire.sent if t.get_type() == m.TRAIN and t.get_receiver_id() == rank)
        items = [result_item(manager, t["party"], t["payload"]["model"]) for t in task.get("tasks")]
        if rank == 1:
            receive(manager, rank, m.RESULT, round=0, results=items)
            assert "refused rank 1's result" in caplog.text and "lacks ['ce', 'loss']" in caplog.text
            assert manager.state.round.pending == {1, 2, 3} and manager.state.round.phase == "train"
        for item in items:
            item["upload"]["metrics"] = dict(metrics)
        receive(manager, rank, m.RESULT, round=0, results=items)
    assert (
        manager.rounds.recorder.records[0]["round"] == 0
        and "dp_epsilon_release" in manager.rounds.recorder.records[0]
    )
