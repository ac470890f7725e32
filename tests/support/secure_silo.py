"""A silo of secure aggregation played in the test's own process against the in-process server
manager (tests/support/server.py), with the plugin's own party sessions (`fedml_moon.privacy.secagg`):
its keys, its encrypted shares, its masked vector and its unmasking answer, each as the wire carries
it."""

from __future__ import annotations

import functools

from fedml.core.distributed.communication.message import Message

from fedml_moon.distributed import protocol as p
from fedml_moon.distributed.secure_wire import keys_from_wire, keys_to_wire, shares_to_wire
from fedml_moon.distributed.server.manager import ServerManager
from fedml_moon.privacy.party import Plan, party_vector
from fedml_moon.privacy.secagg import PartySession, pack
from tests.support.server import Wire

SECURE = "privacy_args.secure_aggregation=true"


def sent_to(wire: Wire, kind: str, rank: int, round_idx: int = 0) -> Message:
    """The last message of `kind` the server sent rank `rank` for round `round_idx`."""
    return next(
        m
        for m in reversed(wire.sent)
        if m.get_type() == kind and m.get_receiver_id() == rank and m.get("round") == round_idx
    )


class Silo:
    """Rank r holding party r - 1, which "trains" by moving every float entry by (r) * 0.01."""

    def __init__(self, manager: ServerManager, wire: Wire, rank: int) -> None:
        self.manager, self.wire, self.rank, self.party = manager, wire, rank, rank - 1
        task = sent_to(wire, p.TRAIN, rank).get("tasks")[0]
        self.received = task["payload"]
        model = {
            k: v + 0.01 * rank if v.is_floating_point() else v for k, v in self.received["model"].items()
        }
        self.upload = {
            "model": model,
            "party_id": self.party,
            "metrics": {"loss": float(rank), "ce": float(rank)},
        }
        self.session = None

    def keys(self, params) -> dict:
        self.session = PartySession(self.party, 0, params)
        return keys_to_wire(self.party, self.session.advertise())

    @functools.cache  # noqa: B019 (one silo per test)
    def shares(self) -> list[dict]:
        roster_msg = sent_to(self.wire, p.ROSTER, self.rank)
        roster = dict(keys_from_wire(k) for k in roster_msg.get("rosters")[0]["keys"])
        digests = {i["party"]: bytes.fromhex(i["digest"]) for i in roster_msg.get("digests")}
        return [
            {"sender": self.party, "receiver": v, "ct": ct.hex()}
            for v, ct in self.session.share(roster, digests).items()
        ]

    @functools.cache  # noqa: B019
    def masked(self) -> dict:
        task = sent_to(self.wire, p.MASK, self.rank).get("tasks")[0]
        vector = party_vector(self.upload, self.received, Plan.from_dict(task["plan"]))
        inbox = {i["sender"]: bytes.fromhex(i["ct"]) for i in task["inbox"]}
        y = pack(self.session.mask(vector.vector, inbox), 32)
        return {"party": self.party, "vector": y, "accused": list(self.session.accused)}

    @functools.cache  # noqa: B019
    def unmasked(self) -> dict:
        request = sent_to(self.wire, p.UNMASK, self.rank)
        assert request.get("parties") == [self.party]
        answer = self.session.unmask(request.get("survivors"), request.get("dropped"))
        return {"party": self.party, "b": shares_to_wire(answer["b"]), "s": shares_to_wire(answer["s"])}
