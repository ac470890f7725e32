"""Secure aggregation's extra message rounds, over whatever carries the plugin's messages (MPI, gRPC,
MQTT + S3): the server's side (`SecureServer`, mixed into the server manager) and a worker's
(`SecureWorker`, mixed into the client manager).

After TRAIN, a worker's parties train and keep their uploads (in a buffered run, until the server
opens their buffer's session: distributed/server/buffered_secure.py); then, per round (Bonawitz et al. 2017,
Fig. 4; `fedml_moon.privacy.secagg`):

    worker -> server  sa_keys      each party's public keys
    server -> worker  sa_roster    each party's neighbourhood's keys, every participant's key digest
                                   (each party draws the round's graph from them) and how many take part
    worker -> server  sa_shares    each party's encrypted shares, addressed to its neighbours
    server -> worker  sa_mask      each party's inbox and its plan (what it adds, its noise share)
    worker -> server  sa_masked    each party's masked vector, and the senders whose shares did not open
    server -> worker  sa_unmask    the round's survivors and dropped (whole lists), and the parties asked
    worker -> server  sa_unmasked  each survivor's shares of the survivors' and the dropped seeds

A rank that dies or is silent past the round's deadline drops its parties at the step it missed; a
party named for shares that do not open is dropped too. The round completes with the survivors' sum
when the survivors are a connected crowd of the round's graph (`secagg_min_group`) and every secret
it needs can be rebuilt, and otherwise stops the run with the reason (nothing is revealed: the server
asks for no share, and no party answers an unmask request, below the crowd rules). The server never
holds a party's upload.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fedml_moon.distributed.protocol import MASK, ROSTER, UNMASK
from fedml_moon.distributed.secure_wire import keys_from_wire, keys_to_wire, shares_from_wire
from fedml_moon.privacy.party import plan_layout
from fedml_moon.privacy.secagg import SecAggError, ServerSession, unpack
from fedml_moon.privacy.secagg_common import check_keys, check_masked

log = logging.getLogger(__name__)


class SecureServer:
    """The server manager's secure-aggregation phases (mixed into PluginServerManager)."""

    rounds: Any

    def secure_reset(self) -> None:
        self.sa_keys: dict[int, dict] = {}
        self.sa_shares: dict[int, dict[int, bytes]] = {}
        self.sa_masked: dict[int, Any] = {}
        self.sa_accused: dict[int, list[int]] = {}
        self.sa_answers: dict[int, dict] = {}
        self.sa_session: ServerSession | None = None
        self.sa_purpose = "train"  # or "eval": the parties' test counts (distributed/server/secure_eval.py)

    def _mine(self, rank: int) -> set[int]:
        return {t["party"] for t in self.assigned[rank][1]["tasks"]} if rank in self.assigned else set()

    def _take(self, msg: Any, phase: str, parties: list[int], held: Callable[[], set[int]]) -> bool:
        """Whether a worker's message of `phase` may be taken: expected, and only for the parties it
        holds in this phase (`held()`, asked only of a message of the phase: another phase's
        message finds none of the phase's state to ask)."""
        if not self._expected(msg, phase):
            return False
        rank, allowed = msg.get_sender_id(), held()
        if not set(parties) <= allowed or len(set(parties)) != len(parties):
            problem = f"its {phase} message names parties {sorted(parties)[:10]}, not its {sorted(allowed)}"
            self.refused(rank, f"round {self.round_idx}: refused rank {rank}: {problem}")
            return False
        return True

    def on_sa_keys(self, msg: Any) -> None:
        items, rank = msg.get("keys"), msg.get_sender_id()
        phase = {"eval": "eval", "buffer": "keys"}.get(self.sa_purpose, "train")
        if not self._take(msg, phase, [i["party"] for i in items], lambda: self.sa_ranks_parties(rank)):
            return
        try:
            for item in items:
                check_keys(self.round_idx, *keys_from_wire(item), "advertise keys")
        except SecAggError as err:
            self.refused(rank, f"round {self.round_idx}: refused rank {rank}: {err}")
            return
        for item in items:
            party, keys = keys_from_wire(item)
            self.sa_keys[party] = keys
            if phase == "train":
                self.results[party] = (float(self.rounds.samples[party]), {})  # counts for the quorum
        self._next(rank, self.after_train if phase == "train" else self.secure_after_keys)

    def sa_ranks_parties(self, rank: int) -> set[int]:
        if self.sa_purpose == "eval":  # every party a rank holds tests
            return {p for p, r in self.placement.items() if r == rank}
        if (
            self.sa_purpose == "buffer"
        ):  # the buffer's parties it holds (distributed/server/buffered_secure.py)
            return {p for p in self.sa_members() if self.placement[p] == rank}
        return self._mine(rank)

    def sa_members(self) -> list[int]:
        """The parties whose vectors this training sum is of: the round's sampled parties."""
        return self.rounds.parties(self.round_idx)

    def sa_plan_for(self, party: int) -> Any:
        """What `party` adds to this training sum (`PrivateAggregation.plan`)."""
        return self.rounds.privacy.plan(party)

    def _next(self, rank: int, then: Any) -> None:
        self.pending.discard(rank)
        if not self.pending:
            self._guard(then)

    def secure_after_keys(self) -> None:
        """Every party that advertised keys takes part (at least 3: `secagg_params`): hand each its
        neighbourhood's keys in the round's graph and every participant's key digest."""
        if self.sa_purpose == "eval":
            self.sa_session = self.eval_session()
        else:
            self.missing = [p for p in self.sa_members() if p not in self.sa_keys]
            params = self.rounds.privacy.params(len(self.sa_keys))
            spec = self.rounds.upload_spec(min(self.sa_keys))
            summed = self.rounds.privacy.summed
            plan = self.sa_plan = self.rounds.privacy.plan(min(self.sa_keys))  # the layout, metrics'
            self.sa_entries = plan_layout({f: spec[f] for f in summed}, plan)
            length = sum(_numel(shape) for _, _, shape in self.sa_entries) + len(plan.metrics)
            self.sa_session = ServerSession(self.round_idx, params, length)
        rosters, digests = self.sa_session.collect_keys(self.sa_keys)
        self.sa_rosters = rosters
        wire = [{"party": p, "digest": d.hex()} for p, d in sorted(digests.items())]
        self._send_each(
            "share",
            ROSTER,
            lambda mine: {
                "participants": len(digests),
                "digests": wire,
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
        self._guard(step[self.phase])

    def _guard(self, step: Any) -> None:
        """Run a step of the protocol through the manager's `_advance`: one that cannot go on (too few
        parties left, a share that does not rebuild its secret) stops the run with the reason, and
        nothing is revealed; any other failure is the server's own and stops it too. A sum of test
        counts that cannot go on leaves the round without test figures instead."""
        self._advance(self.eval_guarded(step) if self.sa_purpose == "eval" else step)

    def on_sa_shares(self, msg: Any) -> None:
        items, rank = msg.get("shares"), msg.get_sender_id()
        senders = sorted({i["sender"] for i in items})
        if not self._take(msg, "share", senders, lambda: self.sa_holds.get(rank, set())):
            return
        shares: dict[int, dict[int, bytes]] = {}
        for item in items:
            shares.setdefault(item["sender"], {})[item["receiver"]] = bytes.fromhex(item["ct"])
        for sender, sent in shares.items():
            expected = set(self.sa_rosters[sender]) - {sender}
            if set(sent) != expected or sum(1 for i in items if i["sender"] == sender) != len(expected):
                problem = (
                    f"party {sender}'s shares go to {sorted(sent)[:10]}, not to its neighbours "
                    f"{sorted(expected)[:10]}"
                )
                self.refused(rank, f"round {self.round_idx}: refused rank {rank}: {problem}")
                return
        self.sa_shares.update(shares)
        self._next(rank, self.after_shares)

    def after_shares(self) -> None:
        inboxes = self.sa_session.route(self.sa_shares)
        self._send_each(
            "mask",
            MASK,
            lambda mine: {
                "tasks": [
                    {
                        "party": p,
                        "plan": {} if self.sa_purpose == "eval" else self.sa_plan_for(p).to_dict(),
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
        if not self._take(msg, "mask", [i["party"] for i in items], lambda: self.sa_holds.get(rank, set())):
            return
        k, totals = self.sa_session.params.encoding.k, self.rounds.totals
        length = self.sa_session.length
        try:
            checked = {
                i["party"]: check_masked(self.round_idx, i["party"], unpack(i["vector"], k), length, k)
                for i in items
            }
            for i in items:
                self._check_accused(i["party"], i["accused"])
        except SecAggError as err:
            self.refused(rank, f"round {self.round_idx}: refused rank {rank}: {err}")
            return
        for item in items:
            vector = item["vector"]
            self.sa_masked[item["party"]] = checked[item["party"]]
            if item["accused"]:
                self.sa_accused[item["party"]] = sorted(set(item["accused"]))
            if self.sa_purpose == "eval":  # test counts: what evaluation carried
                self.rounds.eval_totals["eval_bytes_up"] += vector.numel() * vector.element_size()
                continue
            totals["bytes_up"] += vector.numel() * vector.element_size()
            totals["params_up"] += vector.numel()
        self._next(rank, self.after_masked)

    def _check_accused(self, party: int, accused: list[int]) -> None:
        """A party may name only senders whose shares were routed to it."""
        strangers = sorted(set(accused) - (self.sa_session.holds(party) - {party}))
        if strangers:
            raise SecAggError(
                f"round {self.round_idx}: party {party} names parties {strangers[:10]} for bad shares, but "
                "no shares of theirs were routed to it"
            )

    def after_masked(self) -> None:
        """Drop the accused, check the crowd rules (`ServerSession.collect_masked`), then ask every
        survivor to unmask with the round's whole survivor and dropped lists."""
        self.sa_session.collect_masked(self.sa_masked, self.sa_accused)
        survivors, dropped = self.sa_session.unmask_request()
        if dropped:
            log.warning("round %d: parties %s are not in the sum (dropped or named)", self.round_idx, dropped)
        self._send_each(
            "unmask",
            UNMASK,
            lambda mine: {"survivors": survivors, "dropped": dropped, "parties": sorted(mine)},
            set(self.sa_session.asked),  # the named parties too: each its own s-seed share
        )

    def on_sa_unmasked(self, msg: Any) -> None:
        items, rank = msg.get("items"), msg.get_sender_id()
        if not self._take(msg, "unmask", [i["party"] for i in items], lambda: self.sa_holds.get(rank, set())):
            return
        for item in items:
            self.sa_answers[item["party"]] = {
                "b": shares_from_wire(item["b"]),
                "s": shares_from_wire(item["s"]),
            }
        self._next(rank, self.after_unmasked)

    def after_unmasked(self) -> None:
        """Rebuild the seeds, unmask, read the sum back; a secret that cannot be rebuilt stops the run."""
        session = self.sa_session
        total = session.decode(session.unmask(self.sa_answers))
        survivors = list(session.survivors)
        if self.sa_purpose == "eval":
            self.eval_summed(total, survivors)
            return
        self.missing = [p for p in self.sa_members() if p not in survivors]
        names = list(self.sa_plan.metrics)
        sums = self.rounds.privacy.finish(total, self.sa_entries, names, survivors, self.round_idx)
        if self.sa_purpose == "buffer":
            self.buffer_summed(sums)
            return
        self.ordered = self.rounds.apply_sums(sums)
        self.after_aggregate()


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for s in shape:
        out *= int(s)
    return out
