"""A worker's side of secure aggregation's message rounds (see `fedml_moon.distributed.secure` for the
exchange): its parties' sessions, from their keys to their unmasking shares. The worker checks what it
is asked against its own config (the threshold), and a party refuses what would reveal a secret
(`fedml_moon.privacy.secagg`)."""

from __future__ import annotations

import logging
from typing import Any

from fedml_moon.distributed.protocol import KEYS, MASKED, SHARES, UNMASKED
from fedml_moon.distributed.secure import keys_from_wire, keys_to_wire, shares_to_wire
from fedml_moon.privacy.mod import secagg_params
from fedml_moon.privacy.party import Plan, PrivacyError, party_vector, warn_out_of_range
from fedml_moon.privacy.secagg import PartySession, SecAggError, pack

log = logging.getLogger(__name__)


class SecureWorker:
    """A worker's side of the secure-aggregation phases (mixed into PluginClientManager)."""

    def secure_train(self, round_idx: int, tasks: list[dict], trained: list[tuple[float, dict]]) -> None:
        """Keep each party's upload and what it received; advertise fresh keys for each (its session's
        threshold is set when the roster says how many take part)."""
        options = self.built.run_config.privacy_args
        self.sa_round, self.sa_parties = round_idx, {}
        keys, names = [], []
        for task, (_, upload) in zip(tasks, trained, strict=True):
            party = int(task["party"])
            session = PartySession(party, round_idx, secagg_params(options, 1))
            self.sa_parties[party] = {"upload": upload, "received": task["payload"], "session": session}
            keys.append(keys_to_wire(party, session.advertise()))
            names = sorted((upload.get("metrics") or {}).keys())
        self.send(KEYS, 0, round=round_idx, keys=keys, metrics=names)

    def _held(self, msg: Any, party: int) -> dict | None:
        held = getattr(self, "sa_parties", {}).get(int(party))
        if held is None or msg.get("round") != self.sa_round:
            log.warning(
                "rank %d dropped a %s message for party %s, round %s",
                self.rank,
                msg.get_type(),
                party,
                msg.get("round"),
            )
            return None
        return held

    def on_sa_roster(self, msg: Any) -> None:
        out = []
        for item in msg.get("rosters"):
            held = self._held(msg, item["party"])
            if held is None:
                continue
            session = held["session"]
            options = self.built.run_config.privacy_args
            session.params = secagg_params(options, int(msg.get("participants")))
            roster = dict(keys_from_wire(k) for k in item["keys"])
            shares = self._refusing(item["party"], "share its keys", session.share, roster)
            for receiver, ct in (shares or {}).items():
                out.append({"sender": int(item["party"]), "receiver": int(receiver), "ct": ct.hex()})
        self.send(SHARES, 0, round=msg.get("round"), shares=out)

    def on_sa_mask(self, msg: Any) -> None:
        items = []
        for task in msg.get("tasks"):
            held = self._held(msg, task["party"])
            if held is None:
                continue
            inbox = {int(i["sender"]): bytes.fromhex(i["ct"]) for i in task["inbox"]}
            masked = self._refusing(task["party"], "mask its vector", self._masked, held, task["plan"], inbox)
            if masked is not None:
                items.append({"party": int(task["party"]), "vector": masked})
        self.send(MASKED, 0, round=msg.get("round"), items=items)

    def on_sa_unmask(self, msg: Any) -> None:
        items = []
        for request in msg.get("requests"):
            held = self._held(msg, request["party"])
            if held is None:
                continue
            party, session = int(request["party"]), held["session"]
            answer = self._refusing(party, "unmask", session.unmask, request["survivors"], request["dropped"])
            if answer is not None:
                items.append(
                    {"party": party, "b": shares_to_wire(answer["b"]), "s": shares_to_wire(answer["s"])}
                )
        self.send(UNMASKED, 0, round=msg.get("round"), items=items)

    @staticmethod
    def _masked(held: dict, plan: dict, inbox: dict) -> Any:
        vector = party_vector(held["upload"], held["received"], Plan.from_dict(plan))
        session = held["session"]
        warn_out_of_range(vector.vector, session.params.encoding.clip, session.party)
        return pack(session.mask(vector.vector, inbox), session.params.encoding.k)

    def _refusing(self, party: int, step: str, run: Any, *args: Any) -> Any:
        """`run(*args)`, or None where the party refuses (a diverged upload, a request that would
        reveal a secret, a share that does not decrypt): it leaves the round at this step, and the
        silo's other parties go on."""
        try:
            return run(*args)
        except (PrivacyError, SecAggError) as err:
            log.error("rank %d: party %s does not %s this round: %s", self.rank, party, step, err)
            return None
