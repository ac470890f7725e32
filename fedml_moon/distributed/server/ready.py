"""The server's start phase: who takes part and what each worker's parties hold (HELLO, READY, REFUSE).

A worker says HELLO until it is welcomed with the run's config (and, before round one of a resumed
run, the round whose checkpoint it loads); one that set shared settings itself that differ from the
server's is refused with ABORT. It says READY once its data are built, with a claim for each of its
parties (`engine.claims`). Where the server partitioned the data itself, a claim must equal the
server's own; where it holds no data (cross-silo on the sites' own data) the claims are all it knows:
each is bounded by `comm_args.max_party_samples` (or the cap the operator gave the site,
`transport.caps`), and the first claim of a party is fixed for the run (kept in the checkpoints). A
READY that does not fit is refused as if it never came (its rank is told why, with ABORT); a silo
whose data changed then has its results refused too (their sample count is not its claim). The
first round starts once every worker is ready. A worker that refuses its own data says REFUSE and
stops: before the run it is waited for as one that has not said HELLO yet, in the run it is gone.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from fedml_moon.config.files import DIGEST_KEYS
from fedml_moon.distributed.managers import (
    ABORT,
    HELLO_EVERY_S,
    WELCOME,
    config_differences,
    described_differences,
)
from fedml_moon.distributed.protocol import refusal_text
from fedml_moon.engine.claims import claim_problem, differs
from fedml_moon.run_folder import write_json
from fedml_moon.status.refusals import bounded

log = logging.getLogger(__name__)
WELCOME_EVERY_S = 1.0


class ReadyPhase:
    """HELLO, READY and REFUSE, and the start of the run (module docstring)."""

    def __init__(self, server: Any) -> None:
        self.server, self.state, self.settings, self.rounds = (
            server,
            server.state,
            server.settings,
            server.rounds,
        )

    # --- HELLO ---------------------------------------------------------------------------------------
    def on_hello(self, msg: Any) -> None:
        """Welcome a worker of this run with the run's config (and, before round one of a resumed
        run, the round whose checkpoint it loads); refuse one that set other values itself."""
        rank = msg.get_sender_id()
        reason = self._hello_problem(rank, msg)
        if reason is not None:  # answered while the refusal log's budget for the rank lasts
            if self.server.note(rank, f"HELLO refused: {reason}", level=logging.ERROR):
                self.server.send(ABORT, rank, reason=bounded(reason, 2000))
            return
        site = self.state.sites[rank]
        started = self.state.round.phase != "hello"
        site.gone = False
        if not self._welcome(rank, started):
            return  # a HELLO within a second of the last WELCOME: the silo says HELLO again if it needs to
        process, before = msg.get("process"), site.process
        site.process = process
        if started:  # a worker that was gone is back: its next task brings it the current model
            for party in msg.get("fresh_parties"):
                if self.settings.placement.get(party) == rank:
                    self.rounds.aggregator.algorithm.party_reset(party)
            if before is not None and process != before:
                site.restarted = True  # its work goes out again at its READY, once its data are built
        if not site.seen:
            site.seen = True
            ready = f"rank {rank} is ready ({len(self.state.sites.seen())} of {len(self.settings.workers)})"
            if site.announced:  # again, after a REFUSE: bounded, as refusals are
                self.server.note(
                    rank, f"{ready} again", reason="ready again", level=logging.INFO, counted=False
                )
            else:
                log.info("%s", ready)
            site.announced = True
        if not started:
            self.maybe_start()

    def _hello_problem(self, rank: int, msg: Any) -> str | None:
        """Why a HELLO is refused with ABORT: another run's rank, or shared settings the silo set itself
        (`explicit`) that differ from the server's."""
        workers = self.settings.workers
        if rank not in self.state.sites:
            return (
                f"rank {rank} is not a worker of this run (ranks {workers[0]}..{workers[-1]}: "
                "train_args.client_num_in_total on the server)"
            )
        ours, theirs = self.settings.config, msg.get("config")
        differs = [
            k
            for k in config_differences(ours, theirs)
            if k in msg.get("explicit") or (k in DIGEST_KEYS and theirs.get(k) is not None)  # its own file
        ]
        if not differs:
            return None
        return (
            f"rank {rank}'s config differs from the server's in {bounded(', '.join(differs), 400)}: "
            f"{bounded(described_differences(ours, theirs, differs), 600)}; leave these --set out "
            "on the silo (it takes the run's config from the server) or give the server the same values"
        )

    def _welcome(self, rank: int, started: bool) -> bool:
        """WELCOME a worker, at most once a second per rank whatever process it says it is (a silo says
        HELLO every few seconds until welcomed, so a restarted one is welcomed within seconds; more
        HELLOs bring no more WELCOMEs and no more work); whether it was welcomed now."""
        site, now = self.state.sites[rank], time.monotonic()
        last = -1e9 if site.welcomed_at is None else site.welcomed_at
        if now - last < WELCOME_EVERY_S:
            return False
        if started and now - last > 4 * HELLO_EVERY_S:
            log.info("rank %d is back (round %d)", rank, self.state.round.round_idx)
        site.welcomed_at = now
        self.server.send(
            WELCOME,
            rank,
            resume_from=None if started else self.settings.resume_from,
            config=self.settings.config,
            config_sha256=self.server.digest,
            session=self.server.session,
            run=self.settings.run,
        )
        return True

    # --- READY and REFUSE -------------------------------------------------------------------------
    def cap(self, rank: int) -> int:
        """The most samples a party of `rank` may claim: the run's cap, or the site's own if lower."""
        own = getattr(self.server.transport, "caps", {}).get(rank)  # the site's certificate or token entry
        run = int(self.settings.comm.max_party_samples)
        return run if own is None else min(run, int(own))

    def on_ready(self, msg: Any) -> None:
        """Take a worker's claims (all of its parties', each bounded and as fixed), then start the run
        if every worker is ready."""
        rank, items = msg.get_sender_id(), msg.get("claims")
        site = self.state.sites[rank]
        if not site.seen:
            self.server.refused(rank, f"refused rank {rank}'s READY: it has not said HELLO to this server")
            return
        problem = self.ready_problem(rank, items)
        if problem is not None:
            reason = f"rank {rank}'s claims are refused: {problem}"
            if self.server.note(rank, reason, level=logging.ERROR):
                self.server.send(ABORT, rank, reason=bounded(reason, 2000))
            return
        for item in items:
            if int(item["party"]) not in self.rounds.claims:
                self.state.round.offered[int(item["party"])] = dict(item["claim"])
        site.ready, site.data_refused = True, None
        if site.restarted and self.state.round.phase != "hello":
            site.restarted = False
            self.server.flow.send_work_again(rank)
        self.maybe_start()

    def on_refuse(self, msg: Any) -> None:
        """A worker refuses its own data (and stops): before the run starts, wait for it as for one
        that has not said HELLO yet (within comm_args.timeout_s); in the middle of the run its parties
        count as missing, as an ERROR's would. The kind of problem only: the site's log names its files."""
        rank, why, r = msg.get_sender_id(), refusal_text(msg.get("kind"), msg.get("key")), self.state.round
        if not self.state.sites[rank].seen:
            self.server.refused(rank, f"refused rank {rank}'s REFUSE: it has not said HELLO to this server")
            return
        started = r.phase != "hello"
        self.state.sites.refused_data(rank, why, started)
        if not started:
            what = (
                f"rank {rank} refused its own data: {why}; the run waits for it to start again with its "
                f"data fixed (up to comm_args.timeout_s = {self.settings.comm.timeout_s:g} s from the start)"
            )
        else:  # it stopped: started again (its data fixed), it gets this phase's work again
            what = f"rank {rank} refused its own data in the {r.phase} phase of round {r.round_idx}: {why}"
        self.server.note(rank, what, reason="its own data", level=logging.ERROR, counted=False)
        self.server.status_board.publish(force=True)

    def ready_problem(self, rank: int, items: list) -> str | None:
        """Why a READY's claims cannot be taken, or None."""
        mine = sorted(p for p, r in self.settings.placement.items() if r == rank)
        if sorted(int(i["party"]) for i in items) != mine:
            return f"claims are for parties {[i['party'] for i in items][:10]}, not its parties {mine}"
        for item in items:
            party, claim = int(item["party"]), item["claim"]
            if (why := claim_problem(claim, self.cap(rank), self.rounds.num_classes)) is not None:
                return f"party {party}: {why}"
            fixed = self.rounds.claims.get(party) or self.state.round.offered.get(party)
            if fixed is not None and (how := differs(fixed, claim)) is not None:
                return (
                    f"party {party} claims {how}: a party's claims are fixed for the run (the server's "
                    "partition, or its first claim); a site whose data changed starts a new run"
                )
        return None

    def maybe_start(self) -> None:
        """Every worker said HELLO and READY: fix the claims (if the server holds no partition) and
        start the first round."""
        sites, workers = self.state.sites, set(self.settings.workers)
        if self.state.round.phase != "hello" or sites.seen() != workers or not workers <= sites.ready():
            return

        def start() -> None:
            if not self.rounds.claimed:
                self.rounds.set_claims(self.state.round.offered)
                out = self.rounds.recorder.folder.claims
                write_json(out, {str(p): c for p, c in self.rounds.claims.items()}, indent=1)
                log.info("the parties' claims (%s): %s", out.name, self.rounds.claims)
            self.server.flow.next_round(self.state.round.start)

        self.server.advance(start)
