"""A server that holds no data knows of each site only what the site claims: its samples, its test
samples and (FedSSC) the classes it shares. Each claim is bounded, fixed for the run when first made,
and a hostile one changes nothing: the run equals the run without it (docs: explanation/security.md).

The server manager runs in this process on a real run's objects (its data: none; the sites' PNG
folders read by real silo builds for their claims); the test plays the silos' messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fedml.core.distributed.communication.message import Message

from fedml_moon.adapters import run as run_module
from fedml_moon.adapters.run import build_base, build_server, held_claims
from fedml_moon.algorithms.fedssc import FedSSCOptions, FedSSCServer
from fedml_moon.config.load import load_config
from fedml_moon.config.schema import ConfigError, ServerArgs, TrainArgs
from fedml_moon.distributed import managers as m
from fedml_moon.distributed import protocol
from fedml_moon.distributed.deploy import server_manager, shared_config
from tests.support.marks import needs_fmnist
from tests.support.server import Wire, real_silo, receive
from tests.support.site_data import MIXES, site_sets

pytestmark = needs_fmnist

CONFIG = Path(__file__).resolve().parent.parent / "config" / "site" / "parties.yaml"
RUN = [
    *site_sets(),
    "common_args.training_type=cross_silo",
    "comm_args.backend=MQTT_S3",
    "train_args.comm_round=2",
    "train_args.epochs=1",
    "train_args.batch_size=16",
    "device_args.torch_threads=1",
    "tracking_args.enable_wandb=false",
]


def _claims(cfg, root: Path, out: Path) -> dict[int, dict]:
    """What each real silo claims, built as a silo builds: its own folder (party p's), read alone."""
    out_claims = {}
    for rank, party in enumerate(sorted(p.name for p in root.iterdir()), start=1):
        site = load_config(CONFIG, [*RUN, f"data_args.data_cache_dir={root / party}", *cfg])
        base = build_base(site, out / f"silo-{rank}", rank, role="silo")
        out_claims.update(held_claims(base))
    return out_claims


def _server(tmp_path: Path, sites: Path, *extra: str, ready: bool = True):
    """The no-data server of three sites (its data_cache_dir an empty folder), each silo having said
    HELLO and, with `ready`, READY with its true claims."""
    empty = tmp_path / "empty"
    empty.mkdir(exist_ok=True)
    cfg = load_config(CONFIG, [*RUN, f"data_args.data_cache_dir={empty}", *extra])
    base = build_base(cfg, tmp_path / "server", role="server")
    assert len(base.fed.data.y_train) == len(base.fed.data.y_test) == 0  # it holds no sample
    rounds = build_server(base)
    wire = Wire()
    manager = server_manager(cfg, base.args, wire, rounds, [1, 2, 3])
    manager.register_message_receive_handlers()
    honest = _claims(list(extra), sites, tmp_path)
    for rank in (1, 2, 3):
        hello = {"config": shared_config(cfg), "explicit": [], "process": f"p{rank}", "fresh_parties": []}
        receive(manager, rank, m.HELLO, parties=[rank - 1], **hello)
        if ready:
            _ready(manager, rank, honest[rank - 1])
    return manager, wire, honest


def _ready(manager, rank: int, claim: dict) -> None:
    receive(manager, rank, m.READY, claims=[{"party": rank - 1, "claim": claim}])


def _aborts(wire: Wire, rank: int) -> list[str]:
    return [x.get("reason") for x in wire.sent if x.get_type() == m.ABORT and x.get_receiver_id() == rank]


def test_the_run_starts_when_every_site_has_claimed_and_its_claims_are_recorded(tmp_path, sites):
    manager, wire, honest = _server(tmp_path, sites, ready=False)
    for rank in (1, 2):
        _ready(manager, rank, honest[rank - 1])
    assert manager.state.round.phase == "hello" and not [x for x in wire.sent if x.get_type() == m.TRAIN]
    _ready(manager, 3, honest[2])
    assert manager.state.round.phase == "train"
    assert manager.rounds.claims == honest and manager.rounds.samples == {
        p: c["samples"] for p, c in honest.items()
    }
    pngs = {p: len(list((sites / name / "test").rglob("*.png"))) for p, name in enumerate(sorted(MIXES))}
    assert {p: c["test_samples"] for p, c in honest.items()} == pngs  # each site's test images
    saved = json.loads((tmp_path / "server" / "claims.json").read_text())
    assert {int(p): c for p, c in saved.items()} == honest


HOSTILE = [
    ({"samples": 10**9}, "samples 1000000000 is not a count in [1, 10000000]"),
    ({"samples": 0}, "samples 0 is not a count"),
    ({"samples": -5}, "samples -5 is not a count"),
    ({"samples": True}, "samples True is not a count"),
    ({"samples": 3.5}, "samples 3.5 is not a count"),
    ({"test_samples": 10**12}, "test_samples 1000000000000 is not a count"),
    ({"classes": [11]}, "are not distinct ascending indices of the run's 10 classes"),
    ({"classes": [3, 1]}, "are not distinct ascending indices"),
    ({"classes": [1, 1]}, "are not distinct ascending indices"),
    ({"classes": "all"}, "classes is not a list of class indices"),
    ({"weight": 1}, "a claim is {samples, test_samples, classes}"),
]


@pytest.mark.parametrize(("change", "named"), HOSTILE)
def test_a_hostile_claim_is_refused_naming_it_and_the_run_is_as_without_it(tmp_path, sites, change, named):
    manager, wire, honest = _server(tmp_path, sites, ready=False)
    _ready(manager, 1, {**honest[0], **change})
    assert manager.state.round.phase == "hello" and named in " ".join(_aborts(wire, 1)), _aborts(wire, 1)
    for rank in (1, 2, 3):
        _ready(manager, rank, honest[rank - 1])
    assert manager.state.round.phase == "train" and manager.rounds.claims == honest


def test_claims_for_another_sites_party_are_refused(tmp_path, sites):
    manager, wire, honest = _server(tmp_path, sites, ready=False)
    receive(manager, 1, m.READY, claims=[{"party": 1, "claim": honest[1]}])
    assert "claims are for parties [1], not its parties [0]" in " ".join(_aborts(wire, 1))
    assert not manager.state.sites[1].ready and not manager.state.round.offered


def test_a_site_cannot_change_its_claim_once_made_whatever_it_says_later(tmp_path, sites):
    """Before the start (a restarted silo) and in the middle of the run (every round a new count): the
    first claim stands; a RESULT whose count is not the claim is refused, the round waits for the
    honest one."""
    manager, wire, honest = _server(tmp_path, sites, ready=False)
    _ready(manager, 1, honest[0])
    _ready(manager, 1, {**honest[0], "samples": honest[0]["samples"] + 1})
    assert "party 0 claims samples" in " ".join(_aborts(wire, 1))
    for rank in (2, 3):
        _ready(manager, rank, honest[rank - 1])
    assert manager.rounds.claims == honest
    for round_idx in range(2):
        assert manager.state.round.phase == "train" and manager.state.round.round_idx == round_idx
        _ready(manager, 2, {**honest[1], "samples": 7 + round_idx})
        for rank in (1, 2, 3):
            task = next(
                t for t in reversed(wire.sent) if t.get_type() == m.TRAIN and t.get_receiver_id() == rank
            )
            party, model = rank - 1, task.get("tasks")[0]["payload"]["model"]
            lie = {"party": party, "n": honest[party]["samples"] + 1 + round_idx,
                   "upload": {"model": model, "party_id": party}}  # fmt: skip
            receive(manager, rank, m.RESULT, round=round_idx, results=[lie])
            assert rank in manager.state.round.pending
            receive(
                manager, rank, m.RESULT, round=round_idx, results=[{**lie, "n": honest[party]["samples"]}]
            )
        for rank in (1, 2, 3):  # federated evaluation (the server holds no test set)
            if manager.state.round.phase == "eval":
                receive(manager, rank, m.REPORT, round=round_idx, reports=[_report(manager, rank - 1)])
    assert manager.rounds.claims == honest
    assert [r["parties"] for r in manager.rounds.recorder.records] == [3, 3]


def _report(manager, party: int, **change) -> dict:
    seen = manager.rounds.test_samples[party]
    return {"party_id": party, "test": {"global": [seen // 2, seen, 1.0 * seen]}, **change}


@pytest.mark.parametrize(
    ("counts", "named"),
    [
        ([5, 10_000, 1.0], "counts 10000 test samples, not the"),
        ([500, 100, 1.0], "are not integers 0 <= correct <= seen"),
        ([-1, 100, 1.0], "are not integers 0 <= correct <= seen"),
        ([5, 100, float("inf")], "is not a finite number >= 0"),
        ([5, 100, -3.0], "is not a finite number >= 0"),
    ],
)
def test_evaluation_counts_that_break_the_claim_are_refused(tmp_path, sites, counts, named, caplog):
    """A site's test counts must add up to the test samples it claimed; a refused report is as if it
    never came (the phase waits for the honest one)."""
    manager, wire, honest = _server(tmp_path, sites)
    for rank in (1, 2, 3):
        task = next(t for t in wire.sent if t.get_type() == m.TRAIN and t.get_receiver_id() == rank)
        party, model = rank - 1, task.get("tasks")[0]["payload"]["model"]
        item = {"party": party, "n": honest[party]["samples"], "upload": {"model": model, "party_id": party}}
        receive(manager, rank, m.RESULT, round=0, results=[item])
    assert manager.state.round.phase == "eval"
    seen = honest[0]["test_samples"]
    bad = [counts[0], seen if counts[1] == 100 else counts[1], counts[2]]
    receive(manager, 1, m.REPORT, round=0, reports=[_report(manager, 0, test={"global": bad})])
    assert 1 in manager.state.round.pending and named in caplog.text
    for rank in (1, 2, 3):
        receive(manager, rank, m.REPORT, round=0, reports=[_report(manager, rank - 1)])
    record = manager.rounds.recorder.records[0]
    assert record["test_acc"] == sum(c["test_samples"] // 2 for c in honest.values()) / sum(
        c["test_samples"] for c in honest.values()
    )
    assert record["party_test"]["0"]["test_samples"] == seen


@pytest.mark.parametrize(("weights", "expected"), [("samples", None), ("uniform", 2.0)])
def test_uniform_weights_ignore_the_claimed_counts(tmp_path, sites, weights, expected):
    """Sites move the model by 1, 2 and 3: by samples the step is their claims' weighted mean (a site
    claiming the cap would lead it); with party_weights: uniform it is 2 whatever they claim."""
    manager, wire, honest = _server(tmp_path, sites, f"server_args.party_weights={weights}")
    before = {k: v.clone() for k, v in manager.rounds.aggregator.global_state.items()}
    for rank in (1, 2, 3):
        task = next(t for t in wire.sent if t.get_type() == m.TRAIN and t.get_receiver_id() == rank)
        party, model = rank - 1, task.get("tasks")[0]["payload"]["model"]
        moved = {k: v + rank if v.is_floating_point() else v for k, v in model.items()}
        item = {"party": party, "n": honest[party]["samples"], "upload": {"model": moved, "party_id": party}}
        receive(manager, rank, m.RESULT, round=0, results=[item])
    n = [honest[p]["samples"] for p in range(3)]
    step = expected if expected is not None else sum((p + 1) * k for p, k in enumerate(n)) / sum(n)
    after = manager.rounds.aggregator.global_state
    key = next(k for k, v in after.items() if v.is_floating_point())
    assert torch.allclose(after[key] - before[key], torch.full_like(after[key], step), atol=1e-5)


def test_a_sites_own_cap_bounds_its_claims_below_the_runs(tmp_path, sites):
    """The cap its certificate or token entry carries (the transport's `caps`) holds for that site;
    the run's (comm_args.max_party_samples) for the others."""
    manager, wire, honest = _server(tmp_path, sites, ready=False)
    wire.caps = {1: honest[0]["samples"] - 1, 2: None}
    _ready(manager, 1, honest[0])
    assert f"samples {honest[0]['samples']} is not a count in [1, {honest[0]['samples'] - 1}]" in " ".join(
        _aborts(wire, 1)
    )
    wire.caps = {1: honest[0]["samples"]}
    for rank in (1, 2, 3):
        _ready(manager, rank, honest[rank - 1])
    assert manager.state.round.phase == "train" and manager.rounds.claims == honest


def test_a_secure_sum_of_counts_that_is_not_the_claimed_samples_gives_no_test_figures(tmp_path, sites):
    """Under secure aggregation the server sees only the sum of the counts; if its samples are not
    what the summed parties claimed, a correct count lies outside [0, samples] or the loss sum is
    negative (one of them lied), the round gets no test figures."""
    manager, _, honest = _server(tmp_path, sites, "validation_args.evaluation=federated")
    rounds, seen = manager.rounds, sum(c["test_samples"] for c in honest.values())
    good = rounds.evaluation.summed_fields(
        {"counts": {"global": [seen // 2, seen, 2.0 * seen]}, "parties": [0, 1, 2]}
    )
    assert (good["test_acc"], good["test_loss"], good["test_samples"]) == ((seen // 2) / seen, 2.0, seen)
    assert (
        rounds.evaluation.summed_fields({"counts": {"global": [5, seen + 7, 1.0]}, "parties": [0, 1, 2]})
        == {}
    )
    for bad in ([seen + 1, seen, 1.0], [seen + 231, seen, 1.0], [-1, seen, 1.0], [-231, seen, 1.0],
                [0, seen, -2.0**-16], [0, seen, float("nan")]):  # fmt: skip
        assert rounds.evaluation.summed_fields({"counts": {"global": bad}, "parties": [0, 1, 2]}) == {}, bad
    for edge in ([0, seen, 0.0], [seen, seen, 0.0]):  # every answer wrong, every answer right
        assert rounds.evaluation.summed_fields({"counts": {"global": edge}, "parties": [0, 1, 2]})[
            "test_acc"
        ] in (0, 1)
    two = sum(honest[p]["test_samples"] for p in (0, 2))  # a sum without party 1: its claim is not counted
    assert (
        rounds.evaluation.summed_fields({"counts": {"global": [1, two, 1.0]}, "parties": [0, 2]})[
            "test_samples"
        ]
        == two
    )


def test_a_robust_rule_that_weighs_uploads_needs_uniform_weights_where_weights_are_claims(sites, tmp_path):
    own = [*RUN, f"data_args.data_cache_dir={tmp_path}"]
    for rule in (["server_args.robust_aggregation=norm_clip"], ["server_args.robust_aggregation=krum",
                 "server_args.krum_select=2", "server_args.krum_byzantine=0"]):  # fmt: skip
        with pytest.raises(ConfigError, match="server_args.party_weights: .* the site's own claim"):
            load_config(CONFIG, [*own, *rule])
        assert load_config(CONFIG, [*own, *rule, "server_args.party_weights=uniform"])
    assert load_config(CONFIG, [*own, "server_args.robust_aggregation=median"])  # weighs nothing


def test_fedssc_shares_only_the_classes_a_site_claimed():
    server = FedSSCServer(FedSSCOptions(), ServerArgs(), TrainArgs(), 0)
    server.classes_held = {0: [0, 1]}
    assert server.upload_problem({"present": torch.tensor([True, True, False, False])}, 0) is None
    said = server.upload_problem({"present": torch.tensor([True, False, False, True])}, 0)
    assert "present differs at classes [1, 3]" in said


def test_a_server_given_a_test_set_of_its_own_evaluates_centrally_on_all_of_it(tmp_path, sites, monkeypatch):
    """validation_args.evaluation: central on a server of the sites' own data reads its data_cache_dir
    whole (train/ and test/) as its test set, trains on none of it, and says so; without a folder the
    setting is refused, naming it."""
    folder = sites / sorted(MIXES)[0]
    cfg = load_config(
        CONFIG, [*RUN, f"data_args.data_cache_dir={folder}", "validation_args.evaluation=central"]
    )
    said: list[str] = []
    monkeypatch.setattr(run_module.log, "info", lambda msg, *a: said.append(msg % a))
    base = build_base(cfg, tmp_path / "server", role="server")
    assert len(base.fed.data.y_train) == 0 and len(base.fed.data.y_test) == len(list(folder.rglob("*.png")))
    assert "the server holds no training data; evaluation is central (on its own test set)" in said
    assert not build_server(base).federated
    bare = load_config(CONFIG, [*RUN, "data_args.data_cache_dir=null", "validation_args.evaluation=central"])
    with pytest.raises(
        ConfigError, match="validation_args.evaluation: central needs a test set on the server"
    ):
        build_base(bare, tmp_path / "bare", role="server")


def test_under_secure_aggregation_a_site_gives_its_counts_only_to_a_secure_sum(tmp_path, sites):
    """A real silo under secure aggregation: an EVAL asking for its own model's test or for counts in
    the clear is refused (nothing is sent); one for a secure sum of counts opens a secure session
    (its keys), and no REPORT ever leaves it."""
    secure = ["privacy_args.secure_aggregation=true", "train_args.client_num_per_round=3"]
    cfg = load_config(CONFIG, [*RUN, *secure, f"data_args.data_cache_dir={sites / sorted(MIXES)[0]}"])
    silo, wire, base = real_silo(cfg, tmp_path / "silo")
    model = base.model.state_dict()
    asks = [
        {"model": model, "local": True},
        {"model": model, "local": False, "test": ["global"], "test_models": {}},
        {"model": model, "local": True, "test": ["global"], "test_models": {}, "secure": True},
    ]
    for payload in asks:
        _to_silo(silo, payload)
        assert not wire.sent, payload
    _to_silo(silo, {**asks[1], "secure": True})
    assert [msg.get_type() for _, msg in wire.sent] == [protocol.KEYS]


def _to_silo(silo, payload: dict) -> None:
    msg = Message(m.EVAL, 0, 1)
    msg.add_params("round", 0)
    msg.add_params("payload", payload)
    silo.on_eval(msg)
