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

    def _each(self, msg: Any, field: str, step: str, run: Any) -> list[tuple[dict, Any]]:
        """`run(held, item)` for each item of `msg[field]` whose party this worker holds in this round;
        (item, answer) for each party that does not refuse (`_refusing`)."""
        out = []
        for item in msg.get(field):
            held = self._held(msg, item["party"])
            if held is not None:
                answer = self._refusing(item["party"], step, run, held, item)
                if answer is not None:
                    out.append((item, answer))
        return out

    def on_sa_roster(self, msg: Any) -> None:
        participants = int(msg.get("participants"))

        def share(held: dict, item: dict) -> dict:
            session = held["session"]
            session.params = secagg_params(self.built.run_config.privacy_args, participants)
            return session.share(dict(keys_from_wire(k) for k in item["keys"]))

        out = [
            {"sender": int(item["party"]), "receiver": int(receiver), "ct": ct.hex()}
            for item, shares in self._each(msg, "rosters", "share its keys", share)
            for receiver, ct in shares.items()
        ]
        self.send(SHARES, 0, round=msg.get("round"), shares=out)

    def on_sa_mask(self, msg: Any) -> None:
        def masked(held: dict, task: dict) -> Any:
            inbox = {int(i["sender"]): bytes.fromhex(i["ct"]) for i in task["inbox"]}
            return self._masked(held, task["plan"], inbox)

        items = [
            {"party": int(task["party"]), "vector": vector}
            for task, vector in self._each(msg, "tasks", "mask its vector", masked)
        ]
        self.send(MASKED, 0, round=msg.get("round"), items=items)

    def on_sa_unmask(self, msg: Any) -> None:
        def unmask(held: dict, request: dict) -> dict:
            return held["session"].unmask(request["survivors"], request["dropped"])

        items = [
            {
                "party": int(request["party"]),
                "b": shares_to_wire(answer["b"]),
                "s": shares_to_wire(answer["s"]),
            }
            for request, answer in self._each(msg, "requests", "unmask", unmask)
        ]
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
