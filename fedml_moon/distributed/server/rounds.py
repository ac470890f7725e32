"""The phases of a round on the distributed server (a mixin of `PluginServerManager`): train, then the
secure-aggregation steps (distributed/server/secure.py) or the aggregation, then evaluation where the
parties report, then the record, the checkpoint and the next round.

A worker's message is checked and taken in its handler; everything the round does after that (the
aggregation, the record, the checkpoint, the next round's downloads) runs through `_advance`, so a
failure there is the server's own: the run stops with the reason and the last checkpoint, and
nothing of the round is applied twice. A round is aggregated and recorded once, whatever fails.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fedml_moon.core.digest import state_dict_sha256
from fedml_moon.core.validate import BadUpload
from fedml_moon.distributed.managers import CHECKPOINT, EVAL, FINISH, TRAIN, quorum
from fedml_moon.distributed.protocol import reports_problem, result_problem
from fedml_moon.engine.resume import Holding, due, save
from fedml_moon.privacy.secagg import SecAggError

log = logging.getLogger(__name__)


class RoundPhases:
    """train -> (secure steps | aggregate) -> eval -> record -> checkpoint -> next round, once each."""

    rounds: Any
    aggregated: int = -1  # the last round aggregated: never twice
    recorded: int = -1  # the last round recorded
    doing: str = "starting"  # what the round's progress is doing now, for a failure's message

    def _advance(self, step: Callable[[], None]) -> None:
        """Run a step of the round's progress; a failure in it stops the run (the server's own), with
        what it was doing and the checkpoint to go on from named."""
        try:
            step()
        except BadUpload as err:
            self.fail(str(err))
        except SecAggError as err:
            self.fail(f"round {self.round_idx}: secure aggregation cannot go on, no sum revealed: {err}")
        except Exception as err:
            log.exception("the server failed while %s", self.doing)
            self.fail(
                f"the server failed while {self.doing}: {type(err).__name__}: {err}; {self._resume_hint()}"
            )

    # --- train -----------------------------------------------------------------------------------
    def start_round(self, round_idx: int) -> None:
        self.doing = f"starting round {round_idx}"
        self.round_idx, self.results, self.missing = round_idx, {}, []
        self.secure_reset()
        tasks: dict[int, list] = {}
        for party, payload in self.rounds.downloads(round_idx).items():
            tasks.setdefault(self.placement[party], []).append({"party": party, "payload": payload})
        self._phase("train", set(tasks))
        for rank, items in sorted(tasks.items()):
            self.assign(rank, TRAIN, round=round_idx, tasks=items)

    def _upload_problem(self, party: int, upload: Any) -> str | None:
        return self.rounds.upload_problem(party, upload, finite=False)

    def on_result(self, msg: Any) -> None:
        """Take a worker's uploads for the parties this round gave it, and nothing else: each with the
        sample count the server fixed for the party and an upload that matches the algorithm's spec
        and meaning (engine/uploads.py). Anything else is refused whole, as if it never came."""
        if not self._expected(msg, "train"):
            return
        rank, items = msg.get_sender_id(), msg.get("results")
        if self.secure:
            self.refused(rank, "secure aggregation is on: a party's upload is never sent in the clear")
            return
        mine = {t["party"] for t in self.assigned[rank][1]["tasks"]}
        problem = result_problem(items, mine, self.rounds.samples, self._upload_problem)
        if problem is not None:
            self.refused(rank, f"round {self.round_idx}: refused rank {rank}'s result: {problem}")
            return
        for item in items:
            self.results[item["party"]] = (self.rounds.weight(item["party"]), item["upload"])
        self.pending.discard(rank)
        if not self.pending:
            self._advance(self.after_train)

    def after_train(self) -> None:
        """The round's uploads are in (or the rest are given up on): aggregate them, once."""
        if self.aggregated >= self.round_idx:
            log.error("round %d was aggregated already; it is not aggregated again", self.round_idx)
            return
        self.doing = f"aggregating round {self.round_idx}"
        if self.secure:
            self._guard(self.secure_after_keys)
            return
        self.missing = [p for p in self.rounds.parties(self.round_idx) if p not in self.results]
        self.aggregated = self.round_idx
        self.ordered = self.rounds.aggregate(self.round_idx, self.results)
        self.after_aggregate()

    # --- evaluate, record, checkpoint --------------------------------------------------------------
    def after_aggregate(self) -> None:
        self.aggregated = max(self.aggregated, self.round_idx)
        if not self.rounds.needs_party_eval(self.round_idx):
            self.close_round(None)
            return
        alive = [r for r in self.workers if not self.is_dead(r) and r not in self.gone]
        self.evaluating = set(self.rounds.eval_parties(self.round_idx))  # validation_args.eval_parties
        ranks = {self.placement.get(p) for p in self.evaluating}
        alive = [r for r in alive if r in ranks]
        if not alive:
            self.close_round(None)
            return
        self.reports, self.new_reports = {}, {}
        download = self.rounds.eval_download()
        if len(self.evaluating) < self.rounds.n_parties:  # a sample: only these report
            download = {**download, "parties": sorted(self.evaluating)}
        if download.get("secure"):  # the parties' counts go into a secure sum (secure_eval.py)
            self.start_secure_eval(alive, download)
            return
        self._phase("eval", set(alive))
        for rank in alive:
            self.assign(rank, EVAL, round=self.round_idx, payload=download)

    def on_report(self, msg: Any) -> None:
        """Take a worker's evaluation reports: one for each of its parties, as the algorithm declares
        (in the newtest phase: their counts of the parties' models combined). Under secure aggregation
        none, ever: only the secure sum of the parties' counts becomes a test figure."""
        phase = "newtest" if self.phase == "newtest" else "eval"
        rank, reports = msg.get_sender_id(), msg.get("reports")
        if self.secure:
            why = "secure aggregation is on: a party's test counts go only into their secure sum"
            self.refused(rank, f"round {self.round_idx}: refused rank {rank}'s report: {why}")
            return
        if not self._expected(msg, phase):
            return
        mine = sorted(p for p, r in self.placement.items() if r == rank and p in self.evaluating)
        check = self.rounds.new_report_problem if phase == "newtest" else self.rounds.report_problem
        problem = reports_problem(reports, mine, check)
        if problem is not None:
            self.refused(rank, f"round {self.round_idx}: refused rank {rank}'s report: {problem}")
            return
        into = self.new_reports if phase == "newtest" else self.reports
        for party, report in zip(mine, sorted(reports, key=lambda r: r["party_id"]), strict=True):
            into[party] = report
        self.pending.discard(rank)
        if not self.pending:
            self._advance(self.after_eval if phase == "eval" else self.close_evaluated)

    def after_eval(self) -> None:
        """The reports are in: the new test next (federated, personalised), else the record."""
        alive = [r for r in self.workers if not self.is_dead(r) and r not in self.gone]
        if not self.rounds.needs_new_test(self.reports) or not alive:
            self.close_round(self.reports)
            return
        self._phase("newtest", set(alive))
        self.new_reports = {}
        download = self.rounds.new_test_download(self.reports)
        for rank in alive:
            self.assign(rank, EVAL, round=self.round_idx, payload=download)

    def close_evaluated(self) -> None:
        self.close_round(self.reports, self.new_reports or None)

    def close_round(
        self, reports: dict | None, new_reports: dict | None = None, summed: dict | None = None
    ) -> None:
        """Record the round (once), then checkpoint it if due, else start the next."""
        if self.recorded >= self.round_idx:
            log.error("round %d was recorded already; it is not recorded again", self.round_idx)
            return
        self.doing = f"recording round {self.round_idx}"
        extra: dict[str, Any] = {
            "wire_bytes_sent": self._transport.bytes_sent,
            "wire_bytes_received": self._transport.bytes_received,
        }
        if self.missing:
            extra["missing_parties"] = self.missing
        self.recorded = self.round_idx
        self.rounds.finish_round(self.round_idx, self.ordered, reports, extra, new_reports, summed)
        if due(self.checkpoint_every, self.round_idx, self.rounds.rounds):
            alive = [r for r in self.workers if not self.is_dead(r)]
            self._phase("checkpoint", set(alive))
            for rank in alive:  # the workers first: the server's LATEST then implies theirs
                self.assign(rank, CHECKPOINT, round=self.round_idx)
            if not alive:
                self.write_checkpoint()
            return
        self.next_round(self.round_idx + 1)

    def on_checkpointed(self, msg: Any) -> None:
        if not self._expected(msg, "checkpoint"):
            return
        self.pending.discard(msg.get_sender_id())
        if not self.pending:
            self._advance(self.write_checkpoint)

    def write_checkpoint(self) -> None:
        self.doing = f"writing the checkpoint of round {self.round_idx}"
        save(self.rounds.recorder.out_dir, self.round_idx, self.full_config, Holding(server=self.rounds))
        self.last_checkpoint = self.round_idx
        self.next_round(self.round_idx + 1)

    def next_round(self, round_idx: int) -> None:
        if round_idx < self.rounds.rounds:
            self.start_round(round_idx)
            return
        alive = [r for r in self.workers if not self.is_dead(r)]
        self._phase("finish", set(alive))
        final = self.rounds.aggregator.global_state  # every site keeps it as its final_model.pt
        if alive:
            log.info("sending the final model (sha256 %s) to rank(s) %s", state_dict_sha256(final), alive)
        for rank in alive:
            self.assign(rank, FINISH, model=final)  # a silo restarted before its BYE gets it again
        if not alive:
            self.done("completed")

    def on_bye(self, msg: Any) -> None:
        rank = msg.get_sender_id()
        if self.phase == "finish":
            self.pending.discard(rank)
            if not self.pending:
                self.done("completed")
        elif rank in self.pending:  # leaving in the middle of a round: its parties are missing
            what = f"rank {rank} said BYE in the {self.phase} phase of round {self.round_idx}"
            # logged bounded, as refusals are (not counted as one: a BYE is the silo's to send)
            self.refusals.refused(f"rank {rank}", what, reason="a BYE", counted=False)
            self.gone.add(rank)

    # --- giving up on ranks -------------------------------------------------------------------------
    def give_up_on(self, ranks: list[int], dead: list[int], waited: float) -> None:
        """The ranks still pending are dead or gone, or the deadline has passed: go on without them if
        the phase allows it, else (too few reports) wait for the deadline, then stop."""
        why = self._why(ranks, dead, waited)
        if self.phase == "train":
            need = quorum(self.comm_args.min_reports, len(self.rounds.parties(self.round_idx)))
            if len(self.results) < need:
                if waited <= self.deadline_s:
                    return  # a dead worker may still come back before the deadline
                self.fail(
                    f"no answer from rank(s) {ranks} ({why}) for {waited:.0f} s in the train phase of round "
                    f"{self.round_idx}: {len(self.results)} parties reported, fewer than the {need} required "
                    f"(comm_args.min_reports); {self._resume_hint()}"
                )
                return
            log.warning("round %d goes on without %s: %s", self.round_idx, self._parties_of(ranks), why)
            self.pending.clear()
            self._advance(self.after_train)
        elif self.phase in ("share", "mask", "unmask"):
            log.warning(
                "round %d: secure aggregation goes on without %s: %s",
                self.round_idx,
                self._parties_of(ranks),
                why,
            )
            self.pending.clear()
            self._advance(self.secure_step)
        elif self.phase in ("eval", "newtest"):
            log.warning("round %d is evaluated without %s: %s", self.round_idx, self._parties_of(ranks), why)
            self.pending.clear()
            if self.sa_purpose == "eval":  # the counts' secure sum goes on with the parties that have keys
                self._guard(self.secure_after_keys)
                return
            self._advance(self.after_eval if self.phase == "eval" else self.close_evaluated)
        elif self.phase == "checkpoint":
            log.warning("checkpoint of round %d written without rank(s) %s: %s", self.round_idx, ranks, why)
            self.pending.clear()
            self._advance(self.write_checkpoint)
        else:  # finish: every round is recorded
            log.warning("no BYE from rank(s) %s; finishing anyway", ranks)
            self.done("completed")

    def _why(self, ranks: list[int], dead: list[int], waited: float) -> str:
        gone = sorted(set(ranks) & self.gone)
        if gone and dead == ranks:
            return f"rank(s) {ranks} said BYE or ERROR ({gone})"
        if dead == ranks:
            return f"rank(s) {ranks} stopped sending heartbeats"
        return f"rank(s) {ranks} silent for {waited:.0f} s"

    def _parties_of(self, ranks: list[int]) -> str:
        parties = sorted(p for p, r in self.placement.items() if r in ranks)
        return f"parties {parties} (rank(s) {ranks})"

    def _resume_hint(self) -> str:
        if self.last_checkpoint is None:
            return "no checkpoint was written yet"
        out = self.rounds.recorder.out_dir
        return f"the checkpoint of round {self.last_checkpoint} is kept: go on with --resume {out}"

    def _expected(self, msg: Any, phase: str) -> bool:
        """Whether a worker's message belongs to the phase and round the server is in, from a rank it
        still waits for; any other (late, repeated, out of round) is dropped, as if it never came."""
        rank, round_idx = msg.get_sender_id(), msg.get("round")
        if rank in self.gone:  # it said BYE, ERROR or REFUSE: missing until it says HELLO again
            why = f"rank {rank} said it stopped (BYE, ERROR or REFUSE); it counts again once it says HELLO"
            self.refusals.refused(
                f"rank {rank}", f"dropped a {msg.get_type()} message: {why}", reason=why[7:]
            )
            return False
        if self.phase != phase or round_idx != self.round_idx or rank not in self.pending:
            self.refusals.refused(
                f"rank {rank}",
                f"dropped a late {msg.get_type()} message from rank {rank} for round {round_idx}: the server "
                f"is in the {self.phase} phase of round {self.round_idx}"
                + ("" if rank in self.pending else ", and waits for nothing more from it"),
                reason=f"late or repeated {msg.get_type()}",
            )
            return False
        return True
