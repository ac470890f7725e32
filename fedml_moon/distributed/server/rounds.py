"""The phases of a synchronous round on the distributed server: train, then the secure-aggregation steps
(server/secure.py) or the aggregation, then evaluation where the parties report, then the record,
the checkpoint (server/checkpoint.py) and the next round; after the last, FINISH.

A worker's message is checked and taken in its handler; everything the round does after that (the
aggregation, the record, the checkpoint, the next round's downloads) runs through `advance`, so a
failure there is the server's own: the run stops with the reason and the last checkpoint, and
nothing of the round is applied twice. A round is aggregated and recorded once, whatever fails.

`RoundPhases` is also the run's flow in a synchronous run (`ServerManager.flow`): what a RESULT,
BYE, CHECKPOINTED or a tick does, what the next round is, and how a phase's waiting ends. A
buffered run's flow (server/buffered.py) takes their place and uses the evaluation phases here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fedml_moon.core.digest import state_dict_sha256
from fedml_moon.core.validate import BadUpload
from fedml_moon.distributed.managers import EVAL, FINISH, TRAIN, quorum
from fedml_moon.distributed.protocol import reports_problem, result_problem
from fedml_moon.engine.resume import due
from fedml_moon.privacy.secagg import SecAggError

log = logging.getLogger(__name__)


class RoundPhases:
    """train -> (secure steps | aggregate) -> eval -> record -> checkpoint -> next round, once each."""

    def __init__(self, server: Any) -> None:
        self.server, self.state, self.settings, self.rounds = (
            server,
            server.state,
            server.settings,
            server.rounds,
        )

    def advance(self, step: Callable[[], None]) -> None:
        """Run a step of the round's progress; a failure in it stops the run (the server's own), with
        what it was doing and the checkpoint to go on from named."""
        r = self.state.round
        try:
            step()
        except BadUpload as err:
            self.server.fail(str(err))
        except SecAggError as err:
            self.server.fail(f"round {r.round_idx}: secure aggregation cannot go on, no sum revealed: {err}")
        except Exception as err:
            log.exception("the server failed while %s", r.doing)
            self.server.fail(
                f"the server failed while {r.doing}: {type(err).__name__}: {err}; {self.server.resume_hint()}"
            )

    # --- the flow's interface (a buffered run's flow replaces these) ----------------------------------
    def handlers(self) -> list:
        """Messages of this flow's own, beyond the synchronous round's."""
        return []

    def owed(self, phase: str, pending: set[int]) -> dict[int, int]:
        """What each rank owes in `phase`: one message each of `pending`."""
        return dict.fromkeys(pending, 1)

    def tick(self) -> None:
        """A synchronous round does nothing at a tick beyond the manager's waiting."""

    def upload_problem(self, party: int, upload: Any) -> str | None:
        return self.rounds.uploads.upload_problem(party, upload, finite=False)

    def send_work_again(self, rank: int) -> None:
        """A restarted worker lost its work of this phase: send it again, once per rank and phase of
        a round, whatever the HELLOs say."""
        r, site = self.state.round, self.state.sites[rank]
        key = (r.round_idx, r.phase)
        if rank not in r.pending or site.work is None or key in site.resent:
            return
        site.resent.add(key)
        self.server.grant(rank)  # its answer again, and a restarted silo's HELLO and READY
        msg_type, params = site.work
        log.info(
            "rank %d restarted during the %s phase of round %d; sent its work again",
            rank,
            r.phase,
            r.round_idx,
        )
        self.server.send(msg_type, rank, **params)

    # --- train -----------------------------------------------------------------------------------
    def start_round(self, round_idx: int) -> None:
        r = self.state.round
        r.doing = f"starting round {round_idx}"
        r.round_idx, r.results, r.missing = round_idx, {}, []
        self.server.secure.begin_training()
        tasks: dict[int, list] = {}
        for party, payload in self.rounds.downloads(round_idx).items():
            tasks.setdefault(self.settings.placement[party], []).append({"party": party, "payload": payload})
        self.server.enter("train", set(tasks))
        for rank, items in sorted(tasks.items()):
            self.server.assign(rank, TRAIN, round=round_idx, tasks=items)

    def on_result(self, msg: Any) -> None:
        """Take a worker's uploads for the parties this round gave it, and nothing else: each with the
        sample count the server fixed for the party and an upload that matches the algorithm's spec
        and meaning (engine/uploads.py). Anything else is refused whole, as if it never came."""
        if not self.server.expected(msg, "train"):
            return
        rank, items, r = msg.get_sender_id(), msg.get("results"), self.state.round
        if self.settings.secure:
            self.server.refused(rank, "secure aggregation is on: a party's upload is never sent in the clear")
            return
        mine = {t["party"] for t in self.state.sites[rank].work[1]["tasks"]}
        problem = result_problem(items, mine, self.rounds.samples, self.server.flow.upload_problem)
        if problem is not None:
            self.server.refused(rank, f"round {r.round_idx}: refused rank {rank}'s result: {problem}")
            return
        for item in items:
            r.results[item["party"]] = (self.rounds.weight(item["party"]), item["upload"])
        r.pending.discard(rank)
        if not r.pending:
            self.server.advance(self.after_train)

    def after_train(self) -> None:
        """The round's uploads are in (or the rest are given up on): aggregate them, once."""
        r = self.state.round
        if r.aggregated >= r.round_idx:
            log.error("round %d was aggregated already; it is not aggregated again", r.round_idx)
            return
        r.doing = f"aggregating round {r.round_idx}"
        self.server.status_board.took_part(sorted(r.results))  # uploads in, or (secure) keys
        if self.settings.secure:
            self.server.secure.guard(self.server.secure.after_keys)
            return
        r.missing = [p for p in self.rounds.parties(r.round_idx) if p not in r.results]
        r.aggregated = r.round_idx
        r.ordered = self.rounds.aggregate(r.round_idx, r.results)
        self.after_aggregate()

    # --- evaluate, record ------------------------------------------------------------------------
    def after_aggregate(self) -> None:
        r = self.state.round
        r.aggregated = max(r.aggregated, r.round_idx)
        if not self.rounds.evaluation.needs_party_eval(r.round_idx):
            self.server.flow.close_round(None)
            return
        alive = [rank for rank in self.settings.workers if not self.server.away(rank)]
        r.evaluating = set(self.rounds.evaluation.eval_parties(r.round_idx))  # validation_args.eval_parties
        ranks = {self.settings.placement.get(p) for p in r.evaluating}
        alive = [rank for rank in alive if rank in ranks]
        if not alive:
            self.server.flow.close_round(None)
            return
        r.reports, r.new_reports = {}, {}
        download = self.rounds.evaluation.eval_download()
        if len(r.evaluating) < self.rounds.n_parties:  # a sample: only these report
            download = {**download, "parties": sorted(r.evaluating)}
        if download.get("secure"):  # the parties' counts go into a secure sum (server/secure_eval.py)
            self.server.secure.begin_counts()
        self.server.enter("eval", set(alive))
        for rank in alive:
            self.server.assign(rank, EVAL, round=r.round_idx, payload=download)

    def on_report(self, msg: Any) -> None:
        """Take a worker's evaluation reports: one for each of its parties, as the algorithm declares
        (in the newtest phase: their counts of the parties' models combined). Under secure aggregation
        none, ever: only the secure sum of the parties' counts becomes a test figure."""
        r = self.state.round
        phase = "newtest" if r.phase == "newtest" else "eval"
        rank, reports = msg.get_sender_id(), msg.get("reports")
        if self.settings.secure:
            why = "secure aggregation is on: a party's test counts go only into their secure sum"
            self.server.refused(rank, f"round {r.round_idx}: refused rank {rank}'s report: {why}")
            return
        if not self.server.expected(msg, phase):
            return
        mine = sorted(p for p, at in self.settings.placement.items() if at == rank and p in r.evaluating)
        check = (
            self.rounds.uploads.new_report_problem
            if phase == "newtest"
            else self.rounds.uploads.report_problem
        )
        problem = reports_problem(reports, mine, check)
        if problem is not None:
            self.server.refused(rank, f"round {r.round_idx}: refused rank {rank}'s report: {problem}")
            return
        into = r.new_reports if phase == "newtest" else r.reports
        for party, report in zip(mine, sorted(reports, key=lambda x: x["party_id"]), strict=True):
            into[party] = report
        r.pending.discard(rank)
        if not r.pending:
            self.server.advance(self.after_eval if phase == "eval" else self.close_evaluated)

    def after_eval(self) -> None:
        """The reports are in: the new test next (federated, personalised), else the record."""
        r = self.state.round
        alive = [rank for rank in self.settings.workers if not self.server.away(rank)]
        if not self.rounds.evaluation.needs_new_test(r.reports) or not alive:
            self.server.flow.close_round(r.reports)
            return
        self.server.enter("newtest", set(alive))
        r.new_reports = {}
        download = self.rounds.evaluation.new_test_download(r.reports)
        for rank in alive:
            self.server.assign(rank, EVAL, round=r.round_idx, payload=download)

    def close_evaluated(self) -> None:
        r = self.state.round
        self.server.flow.close_round(r.reports, r.new_reports or None)

    def close_round(
        self, reports: dict | None, new_reports: dict | None = None, summed: dict | None = None
    ) -> None:
        """Record the round (once), then checkpoint it if due, else start the next."""
        r = self.state.round
        if r.recorded >= r.round_idx:
            log.error("round %d was recorded already; it is not recorded again", r.round_idx)
            return
        r.doing = f"recording round {r.round_idx}"
        extra: dict[str, Any] = self.server.wire_bytes()
        if r.missing:
            extra["missing_parties"] = r.missing
        r.recorded = r.round_idx
        self.rounds.finish_round(r.round_idx, r.ordered, reports, extra, new_reports, summed)
        if due(self.settings.checkpoint_every, r.round_idx, self.rounds.rounds):
            self.server.checkpoints.start(r.round_idx)
            return
        self.server.flow.next_round(r.round_idx + 1)

    def on_checkpointed(self, msg: Any) -> None:
        self.server.checkpoints.on_checkpointed(msg)

    def next_round(self, round_idx: int) -> None:
        if round_idx < self.rounds.rounds:
            self.start_round(round_idx)
            return
        alive = [rank for rank in self.settings.workers if not self.server.is_dead(rank)]
        self.server.enter("finish", set(alive))
        final = self.rounds.aggregator.global_state  # every site keeps it as its final_model.pt
        if alive:
            log.info("sending the final model (sha256 %s) to rank(s) %s", state_dict_sha256(final), alive)
        for rank in alive:
            self.server.assign(rank, FINISH, model=final)  # a silo restarted before its BYE gets it again
        if not alive:
            self.server.done("completed")

    def on_bye(self, msg: Any) -> None:
        rank, r = msg.get_sender_id(), self.state.round
        if r.phase == "finish":
            r.pending.discard(rank)
            if not r.pending:
                self.server.done("completed")
        elif rank in r.pending:  # leaving in the middle of a round: its parties are missing
            what = f"rank {rank} said BYE in the {r.phase} phase of round {r.round_idx}"
            # logged bounded, as refusals are (not counted as one: a BYE is the silo's to send)
            self.server.note(rank, what, reason="a BYE", counted=False)
            self.state.sites[rank].gone = True

    # --- giving up on ranks -------------------------------------------------------------------------
    def give_up_on(self, ranks: list[int], dead: list[int], waited: float) -> None:
        """The ranks still pending are dead or gone, or the deadline has passed: go on without them if
        the phase allows it, else (too few reports) wait for the deadline, then stop."""
        r, server = self.state.round, self.server
        why = server.why(ranks, dead, waited)
        if r.phase == "train":
            need = quorum(self.settings.comm.min_reports, len(self.rounds.parties(r.round_idx)))
            if len(r.results) < need:
                if waited <= self.settings.deadline_s:
                    return  # a dead worker may still come back before the deadline
                server.fail(
                    f"no answer from rank(s) {ranks} ({why}) for {waited:.0f} s in the train phase of round "
                    f"{r.round_idx}: {len(r.results)} parties reported, fewer than the {need} required "
                    f"(comm_args.min_reports); {server.resume_hint()}"
                )
                return
            log.warning("round %d goes on without %s: %s", r.round_idx, server.parties_of(ranks), why)
            r.pending.clear()
            server.advance(self.after_train)
        elif r.phase in ("share", "mask", "unmask"):
            log.warning(
                "round %d: secure aggregation goes on without %s: %s",
                r.round_idx,
                server.parties_of(ranks),
                why,
            )
            r.pending.clear()
            server.advance(server.secure.step)
        elif r.phase in ("eval", "newtest"):
            log.warning("round %d is evaluated without %s: %s", r.round_idx, server.parties_of(ranks), why)
            r.pending.clear()
            if (
                server.secure.summing_counts()
            ):  # the counts' secure sum goes on with the parties that have keys
                server.secure.guard(server.secure.after_keys)
                return
            server.advance(self.after_eval if r.phase == "eval" else self.close_evaluated)
        elif r.phase == "checkpoint":
            log.warning("checkpoint of round %d written without rank(s) %s: %s", r.round_idx, ranks, why)
            r.pending.clear()
            server.advance(server.checkpoints.write)
        else:  # finish: every round is recorded
            log.warning("no BYE from rank(s) %s; finishing anyway", ranks)
            server.done("completed")
