"""Federated evaluation under secure aggregation against a silo that holds valid credentials: nothing
but the secure sum of the parties' test counts ever becomes a test figure, and no party's own figures
(`party_test`) appear. Silo 1 sends, in every secure phase of a round (the training round's keys,
shares, masked vectors and unmasking, then the same four of the counts' session), before and after
its honest message, one message of every kind a silo can send: its test counts in a clear REPORT,
a RESULT, HELLO and READY again, CHECKPOINTED, a heartbeat, a timer TICK, and keys, shares, masked
vectors and unmasking shares out of their phase or repeated. Each changes nothing the server holds,
and the round records exactly the honest parties' summed counts. A sum that honest parties cannot
form (a correct count outside [0, samples], a negative loss sum) gives no test figures, logged.

The server manager runs in this process on a tiny real run (tests/support/server.py); the silos
are played here with the plugin's own party sessions (`fedml_moon.privacy.secagg`)."""

from __future__ import annotations

import functools
import logging

import pytest
import torch

from fedml_moon.distributed import managers as m
from fedml_moon.distributed import protocol as p
from fedml_moon.distributed.secure_wire import keys_from_wire, keys_to_wire, shares_to_wire
from fedml_moon.privacy.secagg import PartySession, pack
from fedml_moon.privacy.secure_counts import counts_params
from tests.support.marks import needs_fmnist
from tests.support.secure_silo import SECURE, Silo, sent_to
from tests.support.server import receive, server_manager

pytestmark = needs_fmnist

FEDERATED = ("validation_args.evaluation=federated", "train_args.comm_round=1")
RANKS = (1, 2, 3)


class Counter:
    """Rank r's party r - 1 in the counts' secure session, adding `counts` [correct, seen, loss sum]."""

    def __init__(self, manager, wire, rank: int, counts: list[float]) -> None:
        self.wire, self.rank, self.party = wire, rank, rank - 1
        self.options = manager.rounds.privacy.options
        self.counts = torch.tensor(counts, dtype=torch.float64)
        self.session = PartySession(
            self.party, manager.state.round.round_idx, counts_params(self.options, len(RANKS))
        )

    def keys(self) -> list[dict]:
        return [keys_to_wire(self.party, self.session.advertise())]

    @functools.cache  # noqa: B019 (one counter per round)
    def shares(self) -> list[dict]:
        msg = sent_to(self.wire, p.ROSTER, self.rank)
        roster = dict(keys_from_wire(k) for k in msg.get("rosters")[0]["keys"])
        digests = {i["party"]: bytes.fromhex(i["digest"]) for i in msg.get("digests")}
        self.session.params = counts_params(self.options, len(digests))
        return [
            {"sender": self.party, "receiver": v, "ct": ct.hex()}
            for v, ct in self.session.share(roster, digests).items()
        ]

    @functools.cache  # noqa: B019
    def masked(self) -> list[dict]:
        task = sent_to(self.wire, p.MASK, self.rank).get("tasks")[0]
        inbox = {i["sender"]: bytes.fromhex(i["ct"]) for i in task["inbox"]}
        y = pack(self.session.mask(self.counts, inbox), self.session.params.encoding.k)
        return [{"party": self.party, "vector": y, "accused": list(self.session.accused)}]

    @functools.cache  # noqa: B019
    def unmasked(self) -> list[dict]:
        request = sent_to(self.wire, p.UNMASK, self.rank)
        answer = self.session.unmask(request.get("survivors"), request.get("dropped"))
        return [{"party": self.party, "b": shares_to_wire(answer["b"]), "s": shares_to_wire(answer["s"])}]


def _every_kind(manager, wire, silo: Silo) -> dict[str, dict]:
    """One well-formed message of every kind a silo sends, as silo 1 (party 0) could fill it now."""
    n, r = manager.rounds.test_samples[0], manager.state.round.round_idx
    fake = PartySession(0, r, counts_params(manager.rounds.privacy.options, len(RANKS)))
    length = manager.state.secure.session.length if manager.state.secure.session is not None else 8
    zeros, samples = torch.zeros(length, dtype=torch.int32), manager.rounds.samples[0]
    hello = {"config": manager.settings.config, "explicit": [], "process": "p1", "fresh_parties": []}
    return {
        p.REPORT: {"round": r, "reports": [{"party_id": 0, "test": {"global": [n, n, 0.0]}}]},
        p.RESULT: {"round": r, "results": [{"party": 0, "n": samples, "upload": silo.upload}]},
        p.HELLO: {"parties": [0], **hello},
        p.READY: {"claims": [{"party": 0, "claim": manager.rounds.claims[0]}]},
        p.CHECKPOINTED: {"round": r},
        m.HEARTBEAT: {},
        m.TICK: {},
        p.KEYS: {"round": r, "keys": [keys_to_wire(0, fake.advertise())]},
        p.SHARES: {"round": r, "shares": [{"sender": 0, "receiver": 1, "ct": "00" * 64}]},
        p.MASKED: {"round": r, "items": [{"party": 0, "vector": zeros, "accused": []}]},
        p.UNMASKED: {"round": r, "items": [{"party": 0, "b": [], "s": []}]},
    }  # fmt: skip


def _held(manager) -> tuple:
    """What the server holds of the round: a message taken changes some of it."""
    r, s = manager.state.round, manager.state.secure
    return (r.phase, r.round_idx, manager.secure.summing_counts(), frozenset(r.pending), tuple(s.keys),
            tuple(s.shares), tuple(s.masked), tuple(s.answers), tuple(r.reports),
            len(manager.rounds.recorder.records))  # fmt: skip


def _intrude(manager, wire, silo: Silo, own: str, after: bool) -> int:
    """Silo 1 sends every kind but the phase's own (`own`; with `after`, that too: a repeat): none
    may change what the server holds. The number sent."""
    kinds = _every_kind(manager, wire, silo)
    sent = 0
    for kind, params in kinds.items():
        if kind == own and not after:
            continue
        before = _held(manager)
        receive(manager, 1, kind, **params)
        assert _held(manager) == before, f"{kind} was taken in the {before[0]} phase ({before[2]})"
        sent += 1
    return sent


def _secure_round(manager, wire, counts: dict[int, list[float]], hostile: bool) -> int:
    """Round 0 through both secure sessions, silo 1 intruding in every phase when `hostile`."""
    params = manager.rounds.privacy.params(len(RANKS))
    silos = {r: Silo(manager, wire, r) for r in RANKS}
    sent = 0
    train = [(p.KEYS, lambda r: {"keys": [silos[r].keys(params)]}),
             (p.SHARES, lambda r: {"shares": silos[r].shares()}),
             (p.MASKED, lambda r: {"items": [silos[r].masked()]}),
             (p.UNMASKED, lambda r: {"items": [silos[r].unmasked()]})]  # fmt: skip
    counters: dict[int, Counter] = {}
    evaluate = [(p.KEYS, lambda r: {"keys": counters[r].keys()}),
                (p.SHARES, lambda r: {"shares": counters[r].shares()}),
                (p.MASKED, lambda r: {"items": counters[r].masked()}),
                (p.UNMASKED, lambda r: {"items": counters[r].unmasked()})]  # fmt: skip
    for session in (train, evaluate):
        if session is evaluate:
            assert manager.state.round.phase == "eval" and manager.secure.summing_counts()
            counters.update({r: Counter(manager, wire, r, counts[r - 1]) for r in RANKS})
        for kind, body in session:
            for rank in RANKS:
                if hostile and rank == 1:
                    sent += _intrude(manager, wire, silos[1], kind, after=False)
                receive(manager, rank, kind, round=0, **body(rank))
                if hostile and rank == 1:
                    sent += _intrude(manager, wire, silos[1], kind, after=True)
    return sent


def _counts(manager) -> dict[int, list[float]]:
    """Each party's honest counts on its test split: some correct, its claimed samples, a loss sum."""
    n = manager.rounds.test_samples
    return {q: [n[q] // (q + 2), n[q], 0.75 * n[q] + q] for q in range(len(RANKS))}


def test_only_the_secure_sum_of_counts_becomes_a_test_figure(tmp_path, caplog):
    manager, wire = server_manager(tmp_path, SECURE, *FEDERATED)
    manager.refusals.per_source = manager.refusals.total = 10**6  # every refusal in the log, in full
    counts = _counts(manager)
    sent = _secure_round(manager, wire, counts, hostile=True)
    assert sent == 8 * (10 + 11)  # 8 phases, before (all but the phase's own kind) and after (all)
    (record,) = manager.rounds.recorder.records
    seen = sum(c[1] for c in counts.values())
    assert record["test_samples"] == seen and "party_test" not in record
    assert record["test_acc"] == sum(c[0] for c in counts.values()) / seen
    assert record["test_loss"] == pytest.approx(sum(c[2] for c in counts.values()) / seen, abs=1e-9)
    assert "refused rank 1's report: secure aggregation is on" in caplog.text
    assert "handling it failed" not in caplog.text  # each refused by its check, none by a handler's failure


@pytest.mark.parametrize(
    "lie",
    [(0, 10**6), (0, -231), (2, -1e3)],  # (count, added): correct past seen, below 0; a negative loss sum
    ids=["correct-above-seen", "correct-below-0", "negative-loss"],
)
def test_a_secure_sum_no_honest_parties_can_form_gives_no_test_figures(tmp_path, caplog, lie):
    """A party that lies inside its masked counts moves the sum; one outside the range honest
    parties' sums lie in is recorded without test figures, and the log names the count."""
    manager, wire = server_manager(tmp_path, SECURE, *FEDERATED)
    counts = _counts(manager)
    counts[0][lie[0]] += lie[1]
    caplog.set_level(logging.ERROR)
    _secure_round(manager, wire, counts, hostile=False)
    (record,) = manager.rounds.recorder.records
    assert not {"test_acc", "test_loss", "test_samples", "party_test"} & set(record), record
    said = "outside [0," if lie[0] == 0 else "not a finite number >= 0"
    assert said in caplog.text and "no test figures this round" in caplog.text, caplog.text[-2000:]
