"""Secure aggregation's extra message rounds, over whatever carries the plugin's messages (MPI, gRPC,
MQTT + S3): the server's side (`SecureServer`, mixed into the server manager) and a worker's
(`SecureWorker`, mixed into the client manager).

After TRAIN, a worker's parties train and keep their uploads; then, per round (Bonawitz et al. 2017,
Fig. 4; `fedml_moon.privacy.secagg`):

    worker -> server  sa_keys      each party's public keys (and the metric names its vector ends with)
    server -> worker  sa_roster    each party's neighbourhood's keys, and how many take part
    worker -> server  sa_shares    each party's encrypted shares, addressed to its neighbours
    server -> worker  sa_mask      each party's inbox and its plan (what it adds, its noise share)
    worker -> server  sa_masked    each party's masked vector
    server -> worker  sa_unmask    who survived, who dropped
    worker -> server  sa_unmasked  each survivor's shares of the survivors' and the dropped seeds

A rank that dies or is silent past the round's deadline drops its parties at the step it missed; the
round completes with the survivors' sum when every secret it needs has t shares, and otherwise stops
the run with the reason (nothing is revealed: no party answers an unmask request that names fewer
than t survivors of its neighbourhood). The server never holds a party's upload.
"""

from __future__ import annotations

import logging
from typing import Any

from fedml_moon.distributed.protocol import KEYS, MASK, MASKED, ROSTER, SHARES, UNMASK, UNMASKED
from fedml_moon.privacy.mod import secagg_params
from fedml_moon.privacy.party import Plan, party_vector
from fedml_moon.privacy.secagg import PartySession, SecAggError, ServerSession, pack, unpack
from fedml_moon.privacy.sums import layout

log = logging.getLogger(__name__)
KEY_FIELDS = ("c_pk", "s_pk", "b_commit")


def keys_to_wire(party: int, keys: dict) -> dict:
    return {"party": int(party), **{k: keys[k].hex() for k in KEY_FIELDS}}


def keys_from_wire(item: dict) -> tuple[int, dict]:
    return int(item["party"]), {k: bytes.fromhex(item[k]) for k in KEY_FIELDS}


def shares_to_wire(shares: dict[int, tuple[int, int]]) -> list[dict]:
    return [{"of": int(v), "x": int(x), "y": f"{y:032x}"} for v, (x, y) in sorted(shares.items())]


def shares_from_wire(items: list[dict]) -> dict[int, tuple[int, int]]:
    return {int(i["of"]): (int(i["x"]), int(i["y"], 16)) for i in items}


class SecureServer:
    """The server manager's secure-aggregation phases (mixed into PluginServerManager)."""

    rounds: Any

    def secure_reset(self) -> None:
        self.sa_keys: dict[int, dict] = {}
        self.sa_metrics: list[str] | None = None
        self.sa_shares: dict[int, dict[int, bytes]] = {}
        self.sa_masked: dict[int, Any] = {}
        self.sa_answers: dict[int, dict] = {}
        self.sa_session: ServerSession | None = None

    def _mine(self, rank: int) -> set[int]:
        return {t["party"] for t in self.assigned[rank][1]["tasks"]} if rank in self.assigned else set()

    def _take(self, msg: Any, phase: str, parties: list[int], allowed: set[int]) -> bool:
        """Whether a worker's message of `phase` may be taken: expected, and only for parties it holds."""
        if not self._expected(msg, phase):
            return False
        rank = msg.get_sender_id()
        if not set(parties) <= allowed or len(set(parties)) != len(parties):
            problem = f"its {phase} message names parties {sorted(parties)[:10]}, not its {sorted(allowed)}"
            log.error("round %d: refused rank %d: %s", self.round_idx, rank, problem)
            self.refused(rank, problem)
            return False
        return True

    def on_sa_keys(self, msg: Any) -> None:
        items, rank = msg.get("keys"), msg.get_sender_id()
        if not self._take(msg, "train", [i["party"] for i in items], self.sa_ranks_parties(rank)):
            return
        names = list(msg.get("metrics"))
        if self.sa_metrics is not None and names != self.sa_metrics:
            self.refused(rank, f"metric names {names[:5]} differ from the round's {self.sa_metrics[:5]}")
            return
        self.sa_metrics = names
        for item in items:
            party, keys = keys_from_wire(item)
            self.sa_keys[party] = keys
            self.results[party] = (float(self.rounds.samples[party]), {})  # counts for the quorum
        self._next(rank, self.after_train)

    def sa_ranks_parties(self, rank: int) -> set[int]:
        return self._mine(rank)

    def _next(self, rank: int, then: Any) -> None:
        self.pending.discard(rank)
        if not self.pending:
            then()

    def secure_after_keys(self) -> None:
        """Every party that advertised keys takes part: hand each its neighbourhood's keys."""
        self.missing = [p for p in self.rounds.parties(self.round_idx) if p not in self.sa_keys]
        spec = self.rounds.upload_spec(min(self.sa_keys))
        summed = self.rounds.privacy.summed
        self.sa_entries = layout({f: spec[f] for f in summed})
        length = sum(_numel(shape) for _, _, shape in self.sa_entries) + len(self.sa_metrics or [])
        params = secagg_params(self.rounds.privacy.options, len(self.sa_keys))
        self.sa_session = ServerSession(self.round_idx, params, length)
        rosters = self.sa_session.collect_keys(self.sa_keys)
        self._send_each(
            "share",
            ROSTER,
            lambda mine: {
                "participants": len(self.sa_keys),
                "rosters": [
                    {"party": p, "keys": [keys_to_wire(v, k) for v, k in sorted(rosters[p].items())]}
                    for p in sorted(mine)
                ],
            },
            set(rosters),
        )

    def _send_each(self, phase: str, msg_type: str, body: Any, parties: set[int]) -> None:
        """Send each rank holding some of `parties` its part (body(its parties)); wait for them."""
        by_rank: dict[int, set[int]] = {}
        for party in parties:
            by_rank.setdefault(self.placement[party], set()).add(party)
        alive = {r: ps for r, ps in by_rank.items() if not self.is_dead(r)}
        self._phase(phase, set(alive))
        self.sa_holds = alive
        for rank, mine in sorted(alive.items()):
            self.assign(rank, msg_type, round=self.round_idx, **body(mine))
        if not alive:
            self.secure_step()

    def secure_step(self) -> None:
        """Go on from the current phase with what arrived (every pending rank answered or gave up)."""
        step = {"share": self.after_shares, "mask": self.after_masked, "unmask": self.after_unmasked}
        step[self.phase]()

    def on_sa_shares(self, msg: Any) -> None:
        items, rank = msg.get("shares"), msg.get_sender_id()
        senders = sorted({i["sender"] for i in items})
        if not self._take(msg, "share", senders, self.sa_holds.get(rank, set())):
            return
        for item in items:
            ct = bytes.fromhex(item["ct"])
            self.sa_shares.setdefault(item["sender"], {})[item["receiver"]] = ct
        self._next(rank, self.after_shares)

    def after_shares(self) -> None:
        inboxes = self.sa_session.route(self.sa_shares)
        privacy = self.rounds.privacy
        self._send_each(
            "mask",
            MASK,
            lambda mine: {
                "tasks": [
                    {
                        "party": p,
                        "plan": privacy.plan(p).to_dict(),
                        "inbox": [
                            {"sender": s, "ct": ct.hex()} for s, ct in sorted(inboxes.get(p, {}).items())
                        ],
                    }
                    for p in sorted(mine)
                ]
            },
            set(self.sa_shares),
        )

    def on_sa_masked(self, msg: Any) -> None:
        items, rank = msg.get("items"), msg.get_sender_id()
        if not self._take(msg, "mask", [i["party"] for i in items], self.sa_holds.get(rank, set())):
            return
        k, totals = self.sa_session.params.encoding.k, self.rounds.totals
        for item in items:
            vector = item["vector"]
            self.sa_masked[item["party"]] = unpack(vector, k)
            totals["bytes_up"] += vector.numel() * vector.element_size()
            totals["params_up"] += vector.numel()
        self._next(rank, self.after_masked)

    def after_masked(self) -> None:
        survivors, dropped = self.sa_session.collect_masked(self.sa_masked)
        if dropped:
            log.warning("round %d: parties %s dropped after sharing their keys", self.round_idx, dropped)
        requests = self.sa_session.unmask_requests()  # per survivor: its neighbours that survived / dropped
        self._send_each(
            "unmask",
            UNMASK,
            lambda mine: {
                "requests": [
                    {"party": p, "survivors": list(requests[p][0]), "dropped": list(requests[p][1])}
                    for p in sorted(mine)
                ]
            },
            set(survivors),
        )

    def on_sa_unmasked(self, msg: Any) -> None:
        items, rank = msg.get("items"), msg.get_sender_id()
        if not self._take(msg, "unmask", [i["party"] for i in items], self.sa_holds.get(rank, set())):
            return
        for item in items:
            self.sa_answers[item["party"]] = {
                "b": shares_from_wire(item["b"]),
                "s": shares_from_wire(item["s"]),
            }
        self._next(rank, self.after_unmasked)

    def after_unmasked(self) -> None:
        """Rebuild the seeds, unmask, read the sum back; a secret short of t shares stops the run."""
        session = self.sa_session
        try:
            total = session.decode(session.unmask(self.sa_answers))
        except SecAggError as err:
            self.fail(f"round {self.round_idx}: secure aggregation failed, no sum revealed: {err}")
            return
        survivors = list(session.survivors)
        self.missing = [p for p in self.rounds.parties(self.round_idx) if p not in survivors]
        sums = self.rounds.privacy.finish(total, self.sa_entries, self.sa_metrics or [], survivors)
        self.ordered = self.rounds.apply_sums(sums)
        self.after_aggregate()


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for s in shape:
        out *= int(s)
    return out


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
            for receiver, ct in session.share(roster).items():
                out.append({"sender": int(item["party"]), "receiver": int(receiver), "ct": ct.hex()})
        self.send(SHARES, 0, round=msg.get("round"), shares=out)

    def on_sa_mask(self, msg: Any) -> None:
        items = []
        for task in msg.get("tasks"):
            held = self._held(msg, task["party"])
            if held is None:
                continue
            vector = party_vector(held["upload"], held["received"], Plan.from_dict(task["plan"]))
            inbox = {int(i["sender"]): bytes.fromhex(i["ct"]) for i in task["inbox"]}
            masked = held["session"].mask(vector.vector, inbox)
            items.append(
                {"party": int(task["party"]), "vector": pack(masked, held["session"].params.encoding.k)}
            )
        self.send(MASKED, 0, round=msg.get("round"), items=items)

    def on_sa_unmask(self, msg: Any) -> None:
        items = []
        for request in msg.get("requests"):
            held = self._held(msg, request["party"])
            if held is None:
                continue
            answer = held["session"].unmask(request["survivors"], request["dropped"])
            party = int(request["party"])
            items.append({"party": party, "b": shares_to_wire(answer["b"]), "s": shares_to_wire(answer["s"])})
        self.send(UNMASKED, 0, round=msg.get("round"), items=items)
