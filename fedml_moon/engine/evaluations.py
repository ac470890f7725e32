"""The evaluation side of `engine.rounds.ServerRounds`: which rounds are evaluated, what the parties
are sent, and the record's test fields, central or federated (`validation_args.evaluation`).

Central: the server tests the global model (or SOLO's models) on the test set it holds. Federated:
each party tests them on its own test split and reports counts (`engine.federated_eval`); for a
personalised algorithm (LG-FedAvg) a second request sends every party the parties' own models
combined (`new_test_models`), whose counts make the new test. Local test (each party's own model on
its own split) is reported in both.
"""

from __future__ import annotations

import logging
from typing import Any

from fedml_moon.algorithms.base import Payload
from fedml_moon.core.aggregation import payload_nbytes
from fedml_moon.core.seeds import rng
from fedml_moon.core.split import merge_states
from fedml_moon.engine import federated_eval

log = logging.getLogger(__name__)


class Evaluations:
    """The evaluation side of the server's rounds: a member of `ServerRounds` (`server`), whose
    aggregator, options and totals it reads; its own: the new test's download of the round."""

    def __init__(self, server: Any) -> None:
        self.server = server  # the ServerRounds this is part of
        self.new_download: Payload = {}

    @property
    def counts_summed(self) -> bool:
        """Federated evaluation under secure aggregation: the parties' counts are summed securely."""
        return self.server.federated and self.server.secure

    def evaluates(self, round_idx: int) -> bool:
        """FedML's rule (round % frequency_of_the_test == 0, and the last round), plus any round the
        server algorithm asks for."""
        rule = round_idx % self.server.test_every == 0 or round_idx == self.server.rounds - 1
        return rule or self.server.aggregator.algorithm.wants_evaluation(round_idx)

    def needs_party_eval(self, round_idx: int) -> bool:
        """Whether every party reports this round: its own model's local test, or (federated
        evaluation) its counts on its own test split."""
        return (self.server.party_eval or self.server.federated) and self.evaluates(round_idx)

    def eval_parties(self, round_idx: int) -> list[int]:
        """The parties that report on evaluation round `round_idx`: every party, or where the parties
        test their own models (central evaluation) and there are more than
        `validation_args.eval_parties`, that many drawn on the seed's "evaluation" stream for the
        round (the same in every mode and on resume). Federated evaluation takes every party: their
        counts are the test set."""
        if not self.sampled_eval():
            return list(range(self.server.n_parties))
        stream = rng(self.server.seed, "evaluation", round_idx)
        return sorted(
            int(p) for p in stream.choice(self.server.n_parties, self.server.eval_sample, replace=False)
        )

    def sampled_eval(self) -> bool:
        """Whether evaluated rounds take a sample of the parties (`eval_parties`)."""
        return not self.server.federated and 0 < self.server.eval_sample < self.server.n_parties

    def needs_new_test(self, reports: dict[int, Payload] | None) -> bool:
        """Whether the parties test their models combined (federated evaluation of a personalised
        algorithm whose parties reported their own layers)."""
        return self.server.federated and self.server.personalized and self.server.party_eval and bool(reports)

    def test_names(self) -> list[str]:
        """The models evaluated this round (`models_to_evaluate`: the global one, or SOLO's parties')."""
        return list(self.server.aggregator.algorithm.models_to_evaluate(self.server.aggregator.global_state))

    def eval_download(self) -> Payload:
        """What every party is sent on an evaluation round: the new global model; `local`: whether it
        tests its own model (local test); with federated evaluation `test`, the models to count on its
        test split ("global" is the download's model, the others in `test_models`)."""
        glob = self.server.aggregator.global_state
        out: Payload = {"model": glob, "local": self.server.party_eval}
        if self.server.federated:
            named = self.server.aggregator.algorithm.models_to_evaluate(glob)
            out["test"] = list(named)
            out["test_models"] = {k: v for k, v in named.items() if k != "global"}
            if self.counts_summed:
                out["secure"] = True  # each party's counts go into a secure sum, never in the clear
        return out

    def sum_counts(self, round_idx: int, reports: dict[int, Payload]) -> dict[str, Any]:
        """The parties' counts summed securely in this process (the standalone simulation): the
        session the distributed modes run over the network (`privacy.secure_counts`). Counted in
        eval_bytes_up, as there: each party's masked counts (int64 words)."""
        from fedml_moon.privacy.secure_counts import secure_counts

        tests = {p: r["test"] for p, r in reports.items()}
        counts, parties = secure_counts(round_idx, tests, self.test_names(), self.server.privacy.options)
        self.server.eval_totals["eval_bytes_up"] += 8 * 3 * len(self.test_names()) * len(tests)
        return {"counts": counts, "parties": parties}

    def summed_fields(self, summed: dict[str, Any]) -> dict[str, Any]:
        """The test fields of a secure sum of counts, if honest parties could have formed it: its samples
        what its parties claimed, each correct count in [0, samples], each loss sum >= 0 (a sum that is
        not, from a party that lied or a sum gone wrong, gives no test figures: logged)."""
        from fedml_moon.privacy.secure_counts import counts_problem

        names, counts = self.test_names(), summed["counts"]
        claimed = sum(self.server.test_samples.get(p, 0) for p in summed["parties"])
        if (problem := counts_problem(counts, names, claimed)) is not None:
            log.error(
                "the secure sum of parties %s's test counts %s: no test figures this round (a party "
                "lied in its counts, which the server cannot check one by one)",
                summed["parties"], problem,
            )  # fmt: skip
            return {}
        return federated_eval.summed(counts, names)

    def party_states(self, reports: dict[int, Payload]) -> list[dict]:
        """The reporting parties' own models (the global model with each one's personal layers)."""
        glob = self.server.aggregator.global_state
        return [merge_states(glob, reports[p].get("personal") or {}) for p in sorted(reports)]

    def new_test_download(self, reports: dict[int, Payload]) -> Payload:
        """What every party tests for the new test: the parties' models combined (`new_test_models`:
        their average, or all of them for the ensemble), counted as the model "new"."""
        method, states = self.server.aggregator.algorithm.new_test_models(self.party_states(reports))
        self.new_download: Payload = {"model": self.server.aggregator.global_state, "local": False,
                                      "test": ["new"], "combine": method, "states": states}  # fmt: skip
        return self.new_download

    def evaluation_fields(
        self,
        reports: dict[int, Payload] | None,
        new_reports: dict[int, Payload] | None,
        summed: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """An evaluated round's test fields: the server's test or the parties' counts, local test,
        new test; each party's own figures under `party_test`, and the pooled and site-mean figures
        (`federated_eval.headline_fields`) (federated)."""
        out: dict[str, Any] = {}
        if not self.server.federated:
            out.update(
                self.server.aggregator.test(self.server.test_global, self.server.device, self.server.args)
            )
        elif summed is not None:
            out.update(self.summed_fields(summed))
        elif reports:  # none when no party could report (every silo gone): no test figures
            out.update(federated_eval.totals(reports, self.test_names()))
        if (
            self.server.federated and "test_acc" in out
        ):  # pooled and (in the clear) site mean: one is test_acc
            out.update(federated_eval.headline_fields(out, self.server.headline))
        if reports:
            self.count_eval_bytes(self.eval_download(), reports)
        if reports and self.server.party_eval:
            out.update(self.party_metrics(reports))
            if self.sampled_eval():
                out["eval_parties"] = len(reports)  # the sample the party figures are means over
        if new_reports:
            self.count_eval_bytes(self.new_download, new_reports)
            new = federated_eval.totals(new_reports, ["new"])
            out.update(new_test_acc=new["test_acc"], new_test_loss=new["test_loss"])
            for party, figures in new["party_test"].items():
                out["party_test"][party]["new_test_acc"] = figures["test_acc"]
        return out

    def count_eval_bytes(self, download: Payload, reports: dict[int, Payload]) -> None:
        self.server.eval_totals["eval_bytes_down"] += payload_nbytes(download) * len(reports)
        self.server.eval_totals["eval_bytes_up"] += sum(payload_nbytes(r) for r in reports.values())

    def party_metrics(self, reports: dict[int, Payload]) -> dict[str, float]:
        """Local test (mean over every party of its own model on its own test split) and, for
        personalised algorithms evaluated centrally, new test (the parties' models combined, on the
        global test set)."""
        ordered = [reports[p] for p in range(self.server.n_parties) if p in reports]  # parties that reported
        accs = [float(r["local_test_acc"]) for r in ordered]
        out = {"local_test_acc": sum(accs) / len(accs)}
        if self.server.personalized and not self.server.federated:
            glob, model = self.server.aggregator.global_state, self.server.aggregator.model
            states = self.party_states(reports)
            out.update(
                self.server.aggregator.algorithm.new_test(
                    model, states, self.server.test_global, self.server.device
                )
            )
            model.load_state_dict(glob)
            if self.server.extra_metrics is not None:
                out.update(self.server.extra_metrics(states, accs))
                model.load_state_dict(glob)
        return out
