"""Secure aggregation's extra message rounds on the server, over whatever carries the plugin's messages
(MPI, gRPC, MQTT + S3); a worker's side is distributed/silo/secure.py.

After TRAIN, a worker's parties train and keep their uploads (in a buffered run, until the server
opens their buffer's session: server/buffered_secure.py); then, per round (Bonawitz et al. 2017,
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

What is summed is the session's job (`SecureState.job`): a round's uploads (`server/secure_round.py`),
the parties' test counts (`server/secure_eval.py`) or a buffer's updates (`server/buffered_secure.py`).
A job says which parties the sum is of, what each adds, which parties a rank may answer for, whether
the session may go on at the roster and at the mask, and what the sum is once read back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fedml_moon.distributed.protocol import MASK, ROSTER, UNMASK
from fedml_moon.distributed.secure_wire import keys_from_wire, keys_to_wire, shares_from_wire
from fedml_moon.distributed.server.secure_eval import CountsSum
from fedml_moon.distributed.server.secure_round import TrainSum
from fedml_moon.distributed.server.state import SecureState
from fedml_moon.privacy.party import plan_layout
from fedml_moon.privacy.secagg import SecAggError, ServerSession, unpack
from fedml_moon.privacy.secagg_common import check_keys, check_masked

log = logging.getLogger(__name__)


class SecureSum:
    """The server's side of a secure sum's messages (module docstring), for its job."""

    def __init__(self, server: Any) -> None:
        self.server, self.state, self.settings, self.rounds = (
            server,
            server.state,
            server.settings,
            server.rounds,
        )
        self.train_sum = TrainSum(server)
        self.counts_sum = CountsSum(server)
        self.state.secure = SecureState(job=self.train_sum)

    def begin(self, job: Any) -> None:
        """A new session of `job`: nothing of an earlier one is kept."""
        self.state.secure = SecureState(job=job)

    def begin_training(self) -> None:
        """A synchronous round's session: its sampled parties' uploads."""
        self.begin(self.train_sum)

    def begin_counts(self) -> None:
        """An evaluation round's session: the parties' test counts."""
        self.begin(self.counts_sum)

    def end(self) -> None:
        """The session's job is done (or dropped): messages of a sum are a training round's again until
        the next session begins (and a training round's own are refused outside its train phase)."""
        self.state.secure.job = self.train_sum

    def summing_counts(self) -> bool:
        return self.state.secure.job is self.counts_sum

    def _take(self, msg: Any, phase: str, parties: list[int], held: Callable[[], set[int]]) -> bool:
        """Whether a worker's message of `phase` may be taken: expected, and only for the parties it
        holds in this phase (`held()`, asked only of a message of the phase: another phase's
        message finds none of the phase's state to ask)."""
        if not self.server.expected(msg, phase):
            return False
        rank, allowed = msg.get_sender_id(), held()
        if not set(parties) <= allowed or len(set(parties)) != len(parties):
            problem = f"its {phase} message names parties {sorted(parties)[:10]}, not its {sorted(allowed)}"
            self.server.refused(rank, f"round {self.state.round.round_idx}: refused rank {rank}: {problem}")
            return False
        return True

    def _next(self, rank: int, then: Callable[[], None]) -> None:
        r = self.state.round
        r.pending.discard(rank)
        if not r.pending:
            self.guard(then)

    def guard(self, step: Callable[[], None]) -> None:
        """Run a step of the protocol through the manager's `advance`: one that cannot go on (too few
        parties left, a share that does not rebuild its secret) stops the run with the reason, and
        nothing is revealed; any other failure is the server's own and stops it too. A sum of test
        counts that cannot go on leaves the round without test figures instead (its job's `guarded`)."""
        self.server.advance(self.state.secure.job.guarded(step))

    def step(self) -> None:
        """Go on from the current phase with what arrived (every pending rank answered or gave up)."""
        steps = {"share": self.after_shares, "mask": self.after_masked, "unmask": self.after_unmasked}
        self.guard(steps[self.state.round.phase])

    def _send_each(self, phase: str, msg_type: str, body: Any, parties: set[int]) -> None:
        """Send each rank holding some of `parties` its part (body(its parties)); wait for them."""
        by_rank: dict[int, set[int]] = {}
        for party in parties:
            by_rank.setdefault(self.settings.placement[party], set()).add(party)
        alive = {rank: ps for rank, ps in by_rank.items() if not self.server.is_dead(rank)}
        self.server.enter(phase, set(alive))
        self.state.secure.holds = alive
        for rank, mine in sorted(alive.items()):
            self.server.assign(rank, msg_type, round=self.state.round.round_idx, **body(mine))
        if not alive:
            self.step()

    # --- keys ---------------------------------------------------------------------------------------
    def on_keys(self, msg: Any) -> None:
        items, rank, s = msg.get("keys"), msg.get_sender_id(), self.state.secure
        round_idx = self.state.round.round_idx
        if not self._take(msg, s.job.keys_phase, [i["party"] for i in items], lambda: s.job.holds(rank)):
            return
        try:
            for item in items:
                check_keys(round_idx, *keys_from_wire(item), "advertise keys")
        except SecAggError as err:
            self.server.refused(rank, f"round {round_idx}: refused rank {rank}: {err}")
            return
        for item in items:
            party, keys = keys_from_wire(item)
            s.keys[party] = keys
            s.job.keys_taken(party)
        self._next(rank, s.job.keys_in())

    def upload_session(self) -> ServerSession:
        """The session of a sum of uploads: the parties that sent keys, the plan's layout."""
        s, r, rounds = self.state.secure, self.state.round, self.rounds
        r.missing = [p for p in s.job.members() if p not in s.keys]
        params = rounds.privacy.params(len(s.keys))
        spec = rounds.uploads.upload_spec(min(s.keys))
        plan = s.plan = rounds.privacy.plan(min(s.keys))  # the layout, metrics'
        s.entries = plan_layout({f: spec[f] for f in rounds.privacy.summed}, plan)
        length = sum(_numel(shape) for _, _, shape in s.entries) + len(plan.metrics)
        return ServerSession(r.round_idx, params, length)

    def after_keys(self) -> None:
        """Every party that advertised keys takes part (at least 3: `secagg_params`): hand each its
        neighbourhood's keys in the round's graph and every participant's key digest."""
        s = self.state.secure
        if not s.job.ready_for_roster():
            return
        s.session = s.job.session()
        rosters, digests = s.session.collect_keys(s.keys)
        s.rosters = rosters
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

    # --- shares -------------------------------------------------------------------------------------
    def on_shares(self, msg: Any) -> None:
        items, rank, s = msg.get("shares"), msg.get_sender_id(), self.state.secure
        round_idx = self.state.round.round_idx
        senders = sorted({i["sender"] for i in items})
        if not self._take(msg, "share", senders, lambda: s.holds.get(rank, set())):
            return
        shares: dict[int, dict[int, bytes]] = {}
        for item in items:
            shares.setdefault(item["sender"], {})[item["receiver"]] = bytes.fromhex(item["ct"])
        for sender, sent in shares.items():
            expected = set(s.rosters[sender]) - {sender}
            if set(sent) != expected or sum(1 for i in items if i["sender"] == sender) != len(expected):
                problem = (
                    f"party {sender}'s shares go to {sorted(sent)[:10]}, not to its neighbours "
                    f"{sorted(expected)[:10]}"
                )
                self.server.refused(rank, f"round {round_idx}: refused rank {rank}: {problem}")
                return
        s.shares.update(shares)
        self._next(rank, self.after_shares)

    def after_shares(self) -> None:
        s = self.state.secure
        if not s.job.ready_for_mask():
            return
        inboxes = s.session.route(s.shares)

        def plan(party: int) -> dict:
            what = s.job.plan_for(party)
            return {} if what is None else what.to_dict()  # the test counts' sum adds no plan

        self._send_each(
            "mask",
            MASK,
            lambda mine: {
                "tasks": [
                    {
                        "party": p,
                        "plan": plan(p),
                        "inbox": [
                            {"sender": x, "ct": ct.hex()} for x, ct in sorted(inboxes.get(p, {}).items())
                        ],
                    }
                    for p in sorted(mine)
                ]
            },
            set(s.shares),
        )

    # --- masked vectors -----------------------------------------------------------------------------
    def on_masked(self, msg: Any) -> None:
        items, rank, s = msg.get("items"), msg.get_sender_id(), self.state.secure
        round_idx = self.state.round.round_idx
        if not self._take(msg, "mask", [i["party"] for i in items], lambda: s.holds.get(rank, set())):
            return
        k, length = s.session.params.encoding.k, s.session.length
        try:
            checked = {
                i["party"]: check_masked(round_idx, i["party"], unpack(i["vector"], k), length, k)
                for i in items
            }
            for i in items:
                self._check_accused(i["party"], i["accused"])
        except SecAggError as err:
            self.server.refused(rank, f"round {round_idx}: refused rank {rank}: {err}")
            return
        for item in items:
            s.masked[item["party"]] = checked[item["party"]]
            if item["accused"]:
                s.accused[item["party"]] = sorted(set(item["accused"]))
            s.job.count(item["vector"])
        self._next(rank, self.after_masked)

    def _check_accused(self, party: int, accused: list[int]) -> None:
        """A party may name only senders whose shares were routed to it."""
        strangers = sorted(set(accused) - (self.state.secure.session.holds(party) - {party}))
        if strangers:
            raise SecAggError(
                f"round {self.state.round.round_idx}: party {party} names parties {strangers[:10]} for bad "
                "shares, but no shares of theirs were routed to it"
            )

    def after_masked(self) -> None:
        """Drop the accused, check the crowd rules (`ServerSession.collect_masked`), then ask every
        survivor to unmask with the round's whole survivor and dropped lists."""
        s = self.state.secure
        s.session.collect_masked(s.masked, s.accused)
        survivors, dropped = s.session.unmask_request()
        if dropped:
            log.warning(
                "round %d: parties %s are not in the sum (dropped or named)",
                self.state.round.round_idx,
                dropped,
            )
        self._send_each(
            "unmask",
            UNMASK,
            lambda mine: {"survivors": survivors, "dropped": dropped, "parties": sorted(mine)},
            set(s.session.asked),  # the named parties too: each its own s-seed share
        )

    # --- unmasking ----------------------------------------------------------------------------------
    def on_unmasked(self, msg: Any) -> None:
        items, rank, s = msg.get("items"), msg.get_sender_id(), self.state.secure
        if not self._take(msg, "unmask", [i["party"] for i in items], lambda: s.holds.get(rank, set())):
            return
        for item in items:
            s.answers[item["party"]] = {"b": shares_from_wire(item["b"]), "s": shares_from_wire(item["s"])}
        self._next(rank, self.after_unmasked)

    def after_unmasked(self) -> None:
        """Rebuild the seeds, unmask, read the sum back (its job's); a secret that cannot be rebuilt
        stops the run."""
        s = self.state.secure
        total = s.session.decode(s.session.unmask(s.answers))
        s.job.summed(total, list(s.session.survivors))

    def sums(self, total: Any, survivors: list[int]) -> Any:
        """A sum of uploads read back (`PrivateAggregation.finish`); the members left out are missing."""
        s, r = self.state.secure, self.state.round
        r.missing = [p for p in s.job.members() if p not in survivors]
        return self.rounds.privacy.finish(total, s.entries, list(s.plan.metrics), survivors, r.round_idx)


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for size in shape:
        out *= int(size)
    return out
