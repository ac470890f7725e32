"""The server's READY phase (a mixin of `PluginServerManager`): what each worker's parties hold.

A worker says READY once its data are built, with a claim for each of its parties
(`engine.claims`). Where the server partitioned the data itself, a claim must equal the server's
own; where it holds no data (cross-silo on the sites' own data) the claims are all it knows: each is
bounded by `comm_args.max_party_samples` (or the cap the operator gave the site,
`transport.caps`), and the first claim of a party is fixed for the run (kept in the checkpoints). A
READY that does not fit is refused as if it never came (its rank is told why, with ABORT); a silo
whose data changed then has its results refused too (their sample count is not its claim). The
first round starts once every worker is ready.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fedml_moon.distributed.managers import ABORT
from fedml_moon.distributed.protocol import refusal_text
from fedml_moon.distributed.refusals import bounded
from fedml_moon.engine.claims import claim_problem, differs

log = logging.getLogger(__name__)


class ReadyPhase:
    """READY handling and the start of the run, for `PluginServerManager`."""

    rounds: Any
    placement: dict[int, int]
    workers: list[int]
    seen: set[int]
    phase: str
    start: int
    comm_args: Any

    def ready_reset(self) -> None:
        self.data_refused: dict[int, str] = {}  # rank -> why it refused its own data (REFUSE), until READY
        self.ready: set[int] = set()
        self.offered: dict[int, dict] = {}  # party -> its claim, before the run fixes them

    def cap(self, rank: int) -> int:
        """The most samples a party of `rank` may claim: the run's cap, or the site's own if lower."""
        own = getattr(self._transport, "caps", {}).get(rank)  # the site's certificate or token entry
        run = int(self.comm_args.max_party_samples)
        return run if own is None else min(run, int(own))

    def on_ready(self, msg: Any) -> None:
        """Take a worker's claims (all of its parties', each bounded and as fixed), then start the run
        if every worker is ready."""
        rank, items = msg.get_sender_id(), msg.get("claims")
        if rank not in self.seen:
            self.refused(rank, f"refused rank {rank}'s READY: it has not said HELLO to this server")
            return
        problem = self.ready_problem(rank, items)
        if problem is not None:
            reason = f"rank {rank}'s claims are refused: {problem}"
            if self.refusals.refused(f"rank {rank}", reason, level=logging.ERROR):
                self.send(ABORT, rank, reason=bounded(reason, 2000))
            return
        for item in items:
            if int(item["party"]) not in self.rounds.claims:
                self.offered[int(item["party"])] = dict(item["claim"])
        self.ready.add(rank)
        self.data_refused.pop(rank, None)
        self.maybe_start()

    def on_refuse(self, msg: Any) -> None:
        """A worker refuses its own data (and stops): before the run starts, wait for it as for one
        that has not said HELLO yet (within comm_args.timeout_s); in the middle of the run its parties
        count as missing, as an ERROR's would. The kind of problem only: the site's log names its files."""
        rank, why = msg.get_sender_id(), refusal_text(msg.get("kind"), msg.get("key"))
        if rank not in self.seen:
            self.refused(rank, f"refused rank {rank}'s REFUSE: it has not said HELLO to this server")
            return
        if self.phase == "hello":
            self.seen.discard(rank)
            self.ready.discard(rank)
            self.welcomed_at.pop(rank, None)
            self.process_of.pop(rank, None)
            self.data_refused[rank] = why
            what = (
                f"rank {rank} refused its own data: {why}; the run waits for it to start again with its "
                f"data fixed (up to comm_args.timeout_s = {self.comm_args.timeout_s:g} s from the start)"
            )
        else:  # it stopped: started again (its data fixed), it gets this phase's work again
            self.gone.add(rank)
            self.resent = {key for key in self.resent if key[0] != rank}
            what = (
                f"rank {rank} refused its own data in the {self.phase} phase of round {self.round_idx}: {why}"
            )
        self.refusals.refused(f"rank {rank}", what, reason="its own data", level=logging.ERROR, counted=False)
        self.publish_status(force=True)

    def ready_problem(self, rank: int, items: list) -> str | None:
        """Why a READY's claims cannot be taken, or None."""
        mine = sorted(p for p, r in self.placement.items() if r == rank)
        if sorted(int(i["party"]) for i in items) != mine:
            return f"claims are for parties {[i['party'] for i in items][:10]}, not its parties {mine}"
        num_classes = self.rounds.num_classes
        for item in items:
            party, claim = int(item["party"]), item["claim"]
            if (why := claim_problem(claim, self.cap(rank), num_classes)) is not None:
                return f"party {party}: {why}"
            fixed = self.rounds.claims.get(party) or self.offered.get(party)
            if fixed is not None and (how := differs(fixed, claim)) is not None:
                return (
                    f"party {party} claims {how}: a party's claims are fixed for the run (the server's "
                    "partition, or its first claim); a site whose data changed starts a new run"
                )
        return None

    def maybe_start(self) -> None:
        """Every worker said HELLO and READY: fix the claims (if the server holds no partition) and
        start the first round."""
        if self.phase != "hello" or self.seen != set(self.workers) or not set(self.workers) <= self.ready:
            return

        def start() -> None:
            if not self.rounds.claimed:
                self.rounds.set_claims(self.offered)
                out = self.rounds.recorder.out_dir / "claims.json"
                out.write_text(json.dumps({str(p): c for p, c in self.rounds.claims.items()}, indent=1))
                log.info("the parties' claims (%s): %s", out.name, self.rounds.claims)
            self.next_round(self.start)

        self._advance(start)
