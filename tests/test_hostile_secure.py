"""Secure aggregation's messages as a hostile or broken silo fills them: malformed keys, shares sent
to parties that are not its neighbours or left out, a masked vector of the wrong length or range, an
accusation of a party that sent it nothing, unmasking shares for parties it does not hold. Each is
refused with the field named, and the honest round then gives the survivors' weighted mean update,
within the fixed-point bound. A silo that sends one neighbour a garbage ciphertext is named by it and
dropped, and one that returns a wrong unmasking share is outvoted and named: the round gives the
honest silos' mean update.

The server manager runs in this process on a tiny real run (tests/support/server.py); the silos
are played with the plugin's own party sessions (`fedml_moon.privacy.secagg`:
tests/support/secure_silo.py)."""

from __future__ import annotations

import os

import pytest
import torch

from fedml_moon.core.fixed_point import FixedPoint
from fedml_moon.core.shamir import P
from fedml_moon.distributed import managers as m
from fedml_moon.distributed import protocol as p
from tests.support.marks import needs_fmnist
from tests.support.secure_silo import SECURE, Silo
from tests.support.server import receive, server_manager

pytestmark = needs_fmnist


def _refused(caplog, rank: int, text: str) -> None:
    said = [
        r.getMessage()
        for r in caplog.records
        if f"rank {rank}" in r.getMessage() and "refused" in r.getMessage()
    ]
    assert any(text in s for s in said), said[-3:]
    caplog.clear()


def test_hostile_secure_messages_are_refused_and_the_honest_round_gives_the_mean_update(tmp_path, caplog):
    manager, wire = server_manager(tmp_path, SECURE)
    params = manager.rounds.privacy.params(3)
    silos = {r: Silo(manager, wire, r) for r in (1, 2, 3)}
    before = dict(manager.rounds.aggregator.global_state)

    bad = {**silos[1].keys(params), "c_pk": "ab" * 31}  # a 31-byte key
    receive(manager, 1, p.KEYS, round=0, keys=[bad])
    _refused(caplog, 1, "c_pk must be 32 bytes")
    receive(manager, 2, p.KEYS, round=0, keys=[silos[1].keys(params)])  # not its party
    _refused(caplog, 2, "names parties [0], not its [1]")
    receive(
        manager, 1, p.KEYS, round=0, keys=[silos[1].keys(params)], metrics=[]
    )  # names the round's metrics
    _refused(caplog, 1, "unexpected fields ['metrics']")  # the server's plan names them, not a silo
    for rank, silo in silos.items():
        receive(manager, rank, p.KEYS, round=0, keys=[silo.keys(params)])
    assert manager.state.round.phase == "share"

    shares = silos[1].shares()
    receive(manager, 1, p.SHARES, round=0, shares=shares[:1])  # one neighbour left out
    _refused(caplog, 1, "not to its neighbours")
    for rank, silo in silos.items():
        receive(manager, rank, p.SHARES, round=0, shares=silo.shares())
    assert manager.state.round.phase == "mask"

    masked = silos[1].masked()
    receive(manager, 1, p.MASKED, round=0, items=[{**masked, "vector": masked["vector"][:-1]}])
    _refused(caplog, 1, "values, not")
    receive(manager, 1, p.MASKED, round=0, items=[{**masked, "accused": [7]}])
    _refused(caplog, 1, "names parties [7] for bad shares, but no shares of theirs were routed to it")
    for rank, silo in silos.items():
        receive(manager, rank, p.MASKED, round=0, items=[silo.masked()])
    assert manager.state.round.phase == "unmask"

    receive(manager, 3, p.UNMASKED, round=0, items=[silos[1].unmasked()])  # party 0 is rank 1's
    _refused(caplog, 3, "names parties [0], not its [2]")
    for rank, silo in silos.items():
        receive(manager, rank, p.UNMASKED, round=0, items=[silo.unmasked()])

    record = manager.rounds.recorder.records[0]
    samples = manager.rounds.samples
    mean_shift = sum(samples[r - 1] * 0.01 * r for r in silos) / sum(samples.values())
    bound = FixedPoint().error_bound(3) / sum(manager.rounds.privacy.ratios.values()) + 1e-6
    after = manager.rounds.aggregator.global_state
    for key, old in before.items():
        if old.is_floating_point():
            assert float((after[key] - old - mean_shift).abs().max()) <= bound, key
    assert manager.rounds.privacy.plan(0).metrics == ("ce", "loss")  # FedAvg's declared term and the total
    assert record["parties"] == 3 and record["train_loss"] == pytest.approx(
        sum(samples[r - 1] * r for r in silos) / sum(samples.values()), abs=1e-5
    )
    assert torch.isfinite(torch.tensor(record["test_loss"]))


def test_fewer_than_t_answers_to_unmask_stop_the_run_with_nothing_revealed(tmp_path):
    """t = 2 of each neighbourhood of 3: when two of the three silos leave before unmasking, no seed
    can be rebuilt; the run stops naming the threshold, and the global model is the round's start."""
    manager, wire = server_manager(tmp_path, SECURE)
    params = manager.rounds.privacy.params(3)
    silos = {r: Silo(manager, wire, r) for r in (1, 2, 3)}
    before = dict(manager.rounds.aggregator.global_state)
    for step, kind, field in ((Silo.keys, p.KEYS, "keys"), (Silo.shares, p.SHARES, "shares")):
        for rank, silo in silos.items():
            value = step(silo, params) if step is Silo.keys else step(silo)
            extra = {}
            receive(manager, rank, kind, round=0, **{field: [value] if kind == p.KEYS else value}, **extra)
    for rank, silo in silos.items():
        receive(manager, rank, p.MASKED, round=0, items=[silo.masked()])
    receive(manager, 1, p.UNMASKED, round=0, items=[silos[1].unmasked()])
    for rank in (2, 3):
        receive(manager, rank, m.BYE)
    receive(manager, 0, m.TICK)
    assert manager.status == "failed"
    aborts = [x.get("reason") for x in wire.sent if x.get_type() == m.ABORT]
    assert aborts and "secure aggregation cannot go on, no sum revealed" in aborts[0]
    assert "fewer than the threshold t=2" in aborts[0], aborts[0]
    after = manager.rounds.aggregator.global_state
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert manager.rounds.recorder.records == []


def test_garbage_to_a_neighbour_and_a_wrong_unmasking_share_leave_the_honest_silos_mean(tmp_path, caplog):
    """5 silos (t = 3 of 5). Party 0 sends its first neighbour random bytes for a ciphertext: that
    neighbour names it in its masked message, the server drops party 0 (its masked vector left out,
    its s-seed rebuilt from the 3 other holders, never asked to unmask) and the round goes on. Party
    3 returns one wrong share of a self-mask seed: 4 came back, so it is outvoted and named. The
    round records the 4 honest parties' weighted mean update, within the fixed-point bound."""
    manager, wire = server_manager(tmp_path, SECURE, silos=5)
    params = manager.rounds.privacy.params(5)
    silos = {r: Silo(manager, wire, r) for r in range(1, 6)}
    before = dict(manager.rounds.aggregator.global_state)
    for rank, silo in silos.items():
        receive(manager, rank, p.KEYS, round=0, keys=[silo.keys(params)])
    garbled = [dict(item) for item in silos[1].shares()]
    garbled[0]["ct"] = os.urandom(len(garbled[0]["ct"]) // 2).hex()
    victim = garbled[0]["receiver"]
    receive(manager, 1, p.SHARES, round=0, shares=garbled)
    for rank in range(2, 6):
        receive(manager, rank, p.SHARES, round=0, shares=silos[rank].shares())
    for rank, silo in silos.items():
        receive(manager, rank, p.MASKED, round=0, items=[silo.masked()])
    assert silos[victim + 1].masked()["accused"] == [0]
    assert "parties [0] are dropped from the round: a neighbour could not decrypt" in caplog.text
    assert not [x for x in wire.sent if x.get_type() == p.UNMASK and x.get_receiver_id() == 1]
    lie = silos[4].unmasked()
    lie["b"][0] = {**lie["b"][0], "y": f"{(int(lie['b'][0]['y'], 16) + 1) % P:032x}"}
    for rank in range(2, 6):
        receive(manager, rank, p.UNMASKED, round=0, items=[silos[rank].unmasked()])
    assert "unmasking went on without wrong shares from parties [3]" in caplog.text

    record, samples = manager.rounds.recorder.records[0], manager.rounds.samples
    honest = range(2, 6)
    assert record["parties"] == 4 and record["missing_parties"] == [0]
    mean_shift = sum(samples[r - 1] * 0.01 * r for r in honest) / sum(samples[r - 1] for r in honest)
    ratios = sum(manager.rounds.privacy.ratios[r - 1] for r in honest)
    bound = FixedPoint().error_bound(4) / ratios + 1e-6
    after = manager.rounds.aggregator.global_state
    for key, old in before.items():
        if old.is_floating_point():
            assert float((after[key] - old - mean_shift).abs().max()) <= bound, key
