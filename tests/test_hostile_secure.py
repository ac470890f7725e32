"""Secure aggregation's messages as a hostile or broken silo fills them: malformed keys, shares sent
to parties that are not its neighbours or left out, a masked vector of the wrong length or range,
unmasking shares for parties it does not hold. Each is refused with the field named, and the honest
round then gives the survivors' weighted mean update, within the fixed-point bound.

The server manager runs in this process on a tiny real run (tests/test_server_waits.py); the three
silos are played here with the plugin's own party sessions (`fedml_moon.privacy.secagg`)."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from fedml.core.distributed.communication.message import Message

from fedml_moon.core.fixed_point import FixedPoint
from fedml_moon.distributed import managers as m
from fedml_moon.distributed import protocol as p
from fedml_moon.distributed.secure import keys_from_wire, keys_to_wire, shares_to_wire
from fedml_moon.distributed.secure_worker import SecureWorker
from fedml_moon.privacy.mod import PrivateAggregation
from fedml_moon.privacy.options import PrivacyArgs
from fedml_moon.privacy.party import Plan, party_vector
from fedml_moon.privacy.secagg import PartySession, pack
from tests.test_server_waits import _from, _server, pytestmark  # noqa: F401 (data)

SECURE = "privacy_args.secure_aggregation=true"


def _sent(wire, kind: str, rank: int, round_idx: int = 0):
    return next(
        m
        for m in reversed(wire.sent)
        if m.get_type() == kind and m.get_receiver_id() == rank and m.get("round") == round_idx
    )


class Silo:
    """Rank r holding party r - 1, which "trains" by moving every float entry by (r) * 0.01."""

    def __init__(self, manager, wire, rank: int) -> None:
        self.manager, self.wire, self.rank, self.party = manager, wire, rank, rank - 1
        task = _sent(wire, p.TRAIN, rank).get("tasks")[0]
        self.received = task["payload"]
        model = {
            k: v + 0.01 * rank if v.is_floating_point() else v for k, v in self.received["model"].items()
        }
        self.upload = {"model": model, "party_id": self.party, "metrics": {"loss": float(rank)}}
        self.session = None

    def keys(self, params) -> dict:
        self.session = PartySession(self.party, 0, params)
        return keys_to_wire(self.party, self.session.advertise())

    @functools.cache  # noqa: B019 (one silo per test)
    def shares(self) -> list[dict]:
        item = _sent(self.wire, p.ROSTER, self.rank).get("rosters")[0]
        roster = dict(keys_from_wire(k) for k in item["keys"])
        return [
            {"sender": self.party, "receiver": v, "ct": ct.hex()}
            for v, ct in self.session.share(roster).items()
        ]

    @functools.cache  # noqa: B019
    def masked(self) -> dict:
        task = _sent(self.wire, p.MASK, self.rank).get("tasks")[0]
        vector = party_vector(self.upload, self.received, Plan.from_dict(task["plan"]))
        inbox = {i["sender"]: bytes.fromhex(i["ct"]) for i in task["inbox"]}
        return {"party": self.party, "vector": pack(self.session.mask(vector.vector, inbox), 32)}

    @functools.cache  # noqa: B019
    def unmasked(self) -> dict:
        request = _sent(self.wire, p.UNMASK, self.rank).get("requests")[0]
        answer = self.session.unmask(request["survivors"], request["dropped"])
        return {"party": self.party, "b": shares_to_wire(answer["b"]), "s": shares_to_wire(answer["s"])}


def _refused(caplog, rank: int, text: str) -> None:
    said = [
        r.getMessage()
        for r in caplog.records
        if f"rank {rank}" in r.getMessage() and "refused" in r.getMessage()
    ]
    assert any(text in s for s in said), said[-3:]
    caplog.clear()


def test_hostile_secure_messages_are_refused_and_the_honest_round_gives_the_mean_update(tmp_path, caplog):
    manager, wire = _server(tmp_path, SECURE)
    params = manager.rounds.privacy.params(3)
    silos = {r: Silo(manager, wire, r) for r in (1, 2, 3)}
    before = dict(manager.rounds.aggregator.global_state)

    bad = {**silos[1].keys(params), "c_pk": "ab" * 31}  # a 31-byte key
    _from(manager, 1, p.KEYS, round=0, keys=[bad], metrics=["loss"])
    _refused(caplog, 1, "c_pk must be 32 bytes")
    _from(manager, 2, p.KEYS, round=0, keys=[silos[1].keys(params)], metrics=["loss"])  # not its party
    _refused(caplog, 2, "names parties [0], not its [1]")
    for rank, silo in silos.items():
        _from(manager, rank, p.KEYS, round=0, keys=[silo.keys(params)], metrics=["loss"])
    assert manager.phase == "share"

    shares = silos[1].shares()
    _from(manager, 1, p.SHARES, round=0, shares=shares[:1])  # one neighbour left out
    _refused(caplog, 1, "not to its neighbours")
    for rank, silo in silos.items():
        _from(manager, rank, p.SHARES, round=0, shares=silo.shares())
    assert manager.phase == "mask"

    masked = silos[1].masked()
    _from(manager, 1, p.MASKED, round=0, items=[{**masked, "vector": masked["vector"][:-1]}])
    _refused(caplog, 1, "values, not")
    for rank, silo in silos.items():
        _from(manager, rank, p.MASKED, round=0, items=[silo.masked()])
    assert manager.phase == "unmask"

    _from(manager, 3, p.UNMASKED, round=0, items=[silos[1].unmasked()])  # party 0 is rank 1's
    _refused(caplog, 3, "names parties [0], not its [2]")
    for rank, silo in silos.items():
        _from(manager, rank, p.UNMASKED, round=0, items=[silo.unmasked()])

    record = manager.rounds.recorder.records[0]
    samples = manager.rounds.samples
    mean_shift = sum(samples[r - 1] * 0.01 * r for r in silos) / sum(samples.values())
    bound = FixedPoint().error_bound(3) / sum(manager.rounds.privacy.ratios.values()) + 1e-6
    after = manager.rounds.aggregator.global_state
    for key, old in before.items():
        if old.is_floating_point():
            assert float((after[key] - old - mean_shift).abs().max()) <= bound, key
    assert record["parties"] == 3 and record["train_loss"] == pytest.approx(
        sum(samples[r - 1] * r for r in silos) / sum(samples.values()), abs=1e-5
    )
    assert torch.isfinite(torch.tensor(record["test_loss"]))


class _Worker(SecureWorker):
    """The worker side's handlers, on a silo holding parties 0 and 1 (what its manager would hold)."""

    def __init__(self, privacy) -> None:
        self.rank, self.sent = 1, []
        self.built = type("Built", (), {"run_config": type("Cfg", (), {"privacy_args": privacy})()})()

    def send(self, kind: str, receiver: int, **params) -> None:
        self.sent.append((kind, params))


def _msg(kind: str, **params) -> Message:
    msg = Message(kind, 0, 1)
    for key, value in params.items():
        msg.add_params(key, value)
    return msg


def test_a_diverged_party_leaves_at_masking_and_the_silos_other_party_goes_on(caplog):
    privacy = PrivacyArgs(secure_aggregation=True)
    worker = _Worker(privacy)
    received = {"model": {"w": torch.zeros(3)}}
    tasks = [{"party": p, "payload": received} for p in (0, 1)]
    uploads = [{"model": {"w": torch.full((3,), v)}, "party_id": q} for q, v in ((0, math.nan), (1, 0.5))]
    worker.secure_train(0, tasks, [(10.0, u) for u in uploads])
    ((kind, keys),) = worker.sent
    assert kind == p.KEYS and [k["party"] for k in keys["keys"]] == [0, 1]
    roster = [{"party": q, "keys": keys["keys"]} for q in (0, 1)]
    worker.on_sa_roster(_msg(p.ROSTER, round=0, participants=2, rosters=roster))
    shares = worker.sent[-1][1]["shares"]
    plan = PrivateAggregation(privacy, {"model": "update"}, {0: 1.0, 1: 1.0}, 2).plan(0).to_dict()
    inbox = {
        q: [{"sender": s["sender"], "ct": s["ct"]} for s in shares if s["receiver"] == q] for q in (0, 1)
    }
    mask = [{"party": q, "plan": plan, "inbox": inbox[q]} for q in (0, 1)]
    worker.on_sa_mask(_msg(p.MASK, round=0, tasks=mask))
    kind, masked = worker.sent[-1]
    assert kind == p.MASKED and [i["party"] for i in masked["items"]] == [1]
    assert "party 0 does not mask its vector this round: the upload holds NaN or Inf" in caplog.text


def test_fewer_than_t_answers_to_unmask_stop_the_run_with_nothing_revealed(tmp_path):
    """t = 2 of each neighbourhood of 3: when two of the three silos leave before unmasking, no seed
    can be rebuilt; the run stops naming the threshold, and the global model is the round's start."""
    manager, wire = _server(tmp_path, SECURE)
    params = manager.rounds.privacy.params(3)
    silos = {r: Silo(manager, wire, r) for r in (1, 2, 3)}
    before = dict(manager.rounds.aggregator.global_state)
    for step, kind, field in ((Silo.keys, p.KEYS, "keys"), (Silo.shares, p.SHARES, "shares")):
        for rank, silo in silos.items():
            value = step(silo, params) if step is Silo.keys else step(silo)
            extra = {"metrics": ["loss"]} if kind == p.KEYS else {}
            _from(manager, rank, kind, round=0, **{field: [value] if kind == p.KEYS else value}, **extra)
    for rank, silo in silos.items():
        _from(manager, rank, p.MASKED, round=0, items=[silo.masked()])
    _from(manager, 1, p.UNMASKED, round=0, items=[silos[1].unmasked()])
    for rank in (2, 3):
        _from(manager, rank, m.BYE)
    _from(manager, 0, m.TICK)
    assert manager.status == "failed"
    aborts = [x.get("reason") for x in wire.sent if x.get_type() == m.ABORT]
    assert aborts and "secure aggregation cannot go on, no sum revealed" in aborts[0]
    assert "fewer than the threshold t=2" in aborts[0], aborts[0]
    after = manager.rounds.aggregator.global_state
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert manager.rounds.recorder.records == []
