"""The server's side of every round, whatever carries the messages.

`ServerRounds` decides what each sampled party is sent, combines what comes back, evaluates and
records; the standalone loop calls it directly, the distributed server manager between messages.
It drives the PluginServerAggregator through FedML cross-silo's calls (`on_before_aggregation`,
`aggregate`, `on_after_aggregation`, `set_model_params`, `test`) and counts every payload's bytes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from fedml_moon.algorithms.base import Payload
from fedml_moon.core.aggregation import payload_nbytes, payload_numel
from fedml_moon.core.digest import state_dict_sha256
from fedml_moon.core.schedule import sample_schedule
from fedml_moon.core.validate import SERVER_FIELDS, BadUpload
from fedml_moon.engine.claim_table import ClaimTable
from fedml_moon.engine.claims import Claim, loaded_claims, saved_claims
from fedml_moon.engine.evaluations import Evaluations
from fedml_moon.engine.summed import Result, SummedRounds
from fedml_moon.engine.uploads import UploadChecks
from fedml_moon.errors import ConfigError
from fedml_moon.privacy.mod import PrivateAggregation
from fedml_moon.records.recorder import RunRecorder
from fedml_moon.run_folder import replacing

if TYPE_CHECKING:  # the FedML adapter it drives; the engine itself imports no fedml
    from fedml_moon.adapters.aggregator import PluginServerAggregator

log = logging.getLogger(__name__)
ExtraMetrics = Callable[[list[dict], list[float]], dict[str, float]]


def weighted_mean(values: list[tuple[float, dict[str, float]]], key: str) -> float | None:
    """Sample-weighted mean of `key` over the (n, metrics) pairs that have it."""
    pairs = [(n, m[key]) for n, m in values if key in m]
    total = sum(n for n, _ in pairs)
    return sum(n * v for n, v in pairs) / total if total else None


class ServerRounds:
    """Per round: `downloads`, then `aggregate` the results, then (on evaluation rounds that need the
    parties) `evaluation.eval_download` to every party, then `finish_round` with their reports. Its
    members: `evaluation` (which rounds are evaluated, what the parties are sent, the record's test
    fields), `uploads` (what the server checks of an upload or a report), `summing` (aggregation by
    sums: privacy_args, streamed uploads)."""

    def __init__(
        self,
        aggregator: PluginServerAggregator,
        recorder: RunRecorder,
        *,
        n_parties: int,
        per_round: int,
        rounds: int,
        test_every: int,
        seed: int,
        test_global: Iterable,
        device: torch.device,
        args: Any,
        party_eval: bool,
        personalized: bool,
        on_bad_upload: str = "skip",
        save_party_models: bool = False,
        claims: dict[int, Claim] | None = None,
        make_privacy: Callable[[dict[int, float]], PrivateAggregation] | None = None,
        terms: tuple[str, ...] | None = None,
        steps: tuple[int, int] = (1, 1),
        federated: bool = False,
        uniform: bool = False,
        eval_parties: int = 0,
    ) -> None:
        """`claims`: every party's claim (`engine.claims`), where the server computed the partition
        itself; else `set_claims` once the parties have made theirs. `make_privacy`: privacy_args'
        accounting from the parties' weights (built with the claims)."""
        self.aggregator, self.recorder = aggregator, recorder
        self.n_parties, self.rounds, self.test_every = n_parties, rounds, test_every
        self.schedule = sample_schedule(n_parties, per_round, rounds, seed)
        self.seed, self.eval_sample = seed, eval_parties  # validation_args.eval_parties (0: every party)
        self.test_global, self.device, self.args = test_global, device, args
        self.party_eval, self.personalized = party_eval, personalized
        self.on_bad_upload = on_bad_upload
        self.save_party_models = save_party_models
        self.claims: Mapping[int, Claim] = {}  # party -> what it holds (engine.claims), fixed for the run
        self.num_classes = 0  # the run's classes (build_server sets them): a claim's classes index them
        self.samples: dict[int, int] = {}  # party -> its training samples
        self.test_samples: dict[int, int] = {}  # party -> its test split's size (its reports' seen)
        self.uniform = uniform  # server_args.party_weights: uniform (every party weighs 1)
        self.terms, self.steps = terms, steps  # the training terms it records; (epochs, batch size)
        self.rejected: dict[int, str] = {}
        self.totals = {"bytes_up": 0, "bytes_down": 0, "params_up": 0, "params_down": 0}
        self.eval_totals = {"eval_bytes_up": 0, "eval_bytes_down": 0}
        self.extra_metrics: ExtraMetrics | None = None  # e.g. the standalone loop's best-so-far figures
        self.started = 0.0
        self.summary: dict[str, Any] = {}
        self.privacy: PrivateAggregation | None = None  # privacy_args: the server learns sums only
        self.buffered: Any = None  # server_args.aggregation: buffered: its BufferedRounds
        self.clock: Any = None  # a synchronous run's simulated clock (core.sim_clock), kept in checkpoints
        self.make_privacy = make_privacy
        self.secure = False  # privacy_args.secure_aggregation (build_server sets it)
        self.sent: dict[int, Payload] = {}  # this round's downloads, by party
        self.planned = rounds  # comm_round; `rounds` may stop earlier (dp_target_epsilon)
        self.federated = federated  # validation_args.evaluation: the parties test, the server adds up
        self.headline = "pooled"  # validation_args.headline: which federated figure is test_acc
        self.evaluation, self.uploads, self.summing = (
            Evaluations(self),
            UploadChecks(self),
            SummedRounds(self),
        )
        if claims:
            self.set_claims(claims)

    # --- the parties' claims ------------------------------------------------------------------------
    def set_claims(self, claims: Mapping[int, Claim]) -> None:
        """Fix every party's claim for the run: its samples, test samples and classes; then build the
        privacy accounting on the weights they give (privacy_args)."""
        if isinstance(claims, ClaimTable):  # columns (the server's own partition): no dict per party
            self.claims = claims
            self.samples, self.test_samples = claims.column("samples"), claims.column("test_samples")
            self.aggregator.algorithm.classes_held = claims.column("classes")
        else:
            self.claims = {int(p): dict(c) for p, c in sorted(claims.items())}
            self.samples = {p: c["samples"] for p, c in self.claims.items()}
            self.test_samples = {p: c["test_samples"] for p, c in self.claims.items()}
            self.aggregator.algorithm.classes_held = {p: list(c["classes"]) for p, c in self.claims.items()}
        if self.make_privacy is not None and self.privacy is None:
            self.privacy = self.make_privacy({p: self.weight(p) for p in self.claims})
            self.rounds = self.first_rounds_allowed()
            if self.privacy.scope is not None:  # the status (page, `fedml-moon status`) says it too
                self.recorder.publish(dp_scope=self.privacy.scope)

    @property
    def claimed(self) -> bool:
        return bool(self.claims)

    def weight(self, party: int) -> float:
        """The party's weight in the average: its claimed samples, or 1 (`party_weights: uniform`)."""
        return 1.0 if self.uniform else float(self.samples[party])

    def weighed(self, results: Mapping[int, tuple[float, Any]]) -> dict[int, tuple[float, Any]]:
        """`results` (party -> (samples, upload)) with each party's weight as the server fixed it."""
        return {p: (self.weight(p), upload) for p, (_, upload) in results.items()}

    def first_rounds_allowed(self) -> int:
        """The rounds privacy_args' epsilon allows the run from round 0 (a ConfigError for none)."""
        allowed = self._rounds_allowed(0)
        if allowed == 0:
            raise ConfigError(
                f"privacy_args.dp_target_epsilon: {self.privacy.options.dp_target_epsilon} is passed in the "
                "first round already; raise it, or raise dp_noise_multiplier"
            )
        return allowed

    def _rounds_allowed(self, start: int) -> int:
        """The rounds the run may train in all, from round `start` on, before the epsilon that
        `dp_target_epsilon` bounds would pass it (the accountant's releases so far included)."""
        more = self.privacy.rounds_allowed(self.planned - start, self.schedule[start:])
        if start + more < self.planned:
            log.warning(
                "privacy_args.dp_target_epsilon: the run stops after %d of %d rounds, where epsilon "
                "would pass %s",
                start + more,
                self.planned,
                self.privacy.options.dp_target_epsilon,
            )
        return start + more

    # --- one round ------------------------------------------------------------------------------
    def parties(self, round_idx: int) -> list[int]:
        return self.schedule[round_idx]

    def downloads(self, round_idx: int) -> dict[int, Payload]:
        """What each sampled party is sent this round (counted in bytes_down / params_down)."""
        self.started = time.perf_counter()
        self.args.round_idx = round_idx
        out = {}
        for party in self.parties(round_idx):
            payload = self.aggregator.get_model_params_for(party)
            self.totals["bytes_down"] += payload_nbytes(payload)
            self.totals["params_down"] += payload_numel(payload)
            out[party] = payload
        self.sent = out
        return out

    def aggregate(self, round_idx: int, results: dict[int, Result]) -> list[Result]:
        """FedML cross-silo's order: on_before_aggregation, aggregate, on_after_aggregation, set.
        Results are combined in the schedule's party order, whatever order they arrived in; a party
        that did not report, or whose upload is unusable (`check_uploads`: named in the log and in
        `rejected_parties`), is left out; the weights renormalise over the rest."""
        results = self.weighed(results)
        usable, self.rejected = self.uploads.check_uploads(round_idx, results)
        if not usable:
            raise BadUpload(
                f"round {round_idx}: no usable upload ({self.rejected}; what an upload holds is declared "
                "by the server algorithm's upload_spec)"
            )
        if self.privacy is not None:
            return self.summing.aggregate_private(round_idx, {p: results[p] for p in usable})
        ordered = [results[p] for p in usable]
        for _, upload in ordered:
            self.totals["bytes_up"] += payload_nbytes(upload)
            self.totals["params_up"] += payload_numel(upload)
        if self.save_party_models:
            self.save_uploads({p: results[p][1] for p in usable})
        uploads, _ = self.aggregator.on_before_aggregation(ordered)
        new_state = self.aggregator.aggregate(uploads)
        new_state = self.aggregator.on_after_aggregation(new_state)
        self.aggregator.set_model_params(new_state)
        return ordered

    def finish_round(
        self,
        round_idx: int,
        results: list[Result],
        reports: dict[int, Payload] | None,
        extra: dict[str, Any] | None = None,
        new_reports: dict[int, Payload] | None = None,
        summed: dict[str, Any] | None = None,
    ) -> dict:
        """The round's record: training terms, the test (the server's, or the parties' counts), the
        parties' reports (`new_reports`: their counts of the new test, federated), and `extra` (a
        transport's byte counts; `summed`: their counts summed securely, {"counts", "parties"}); logged."""
        record: dict[str, Any] = {"round": round_idx, "parties": len(results)}
        metrics = [(n, p.get("metrics", {})) for n, p in results]
        names = {k for _, m in metrics for k in m} - SERVER_FIELDS  # no party writes a server field
        for key in sorted(names if self.terms is None else names & set(self.terms)):  # ce, l_con, ...
            record[key] = weighted_mean(metrics, key)
        record["train_loss"] = weighted_mean(metrics, "loss")
        if self.privacy is not None:
            record.update(self.privacy.record_fields())
        if self.rejected:
            record["rejected_parties"] = sorted(self.rejected)
        if self.evaluation.evaluates(round_idx):
            record.update(self.evaluation.evaluation_fields(reports, new_reports, summed))
            if "test_acc" in record:
                self.aggregator.after_evaluation(round_idx, record)
        record["round_time_s"] = time.perf_counter() - self.started
        record.update(self.totals)
        if self.party_eval or self.federated:
            record.update(self.eval_totals)
        record.update(extra or {})
        self.recorder.log_round(record)
        return record

    # --- checkpoints ------------------------------------------------------------------------------
    def state(self, round_idx: int) -> dict[str, Any]:
        """Everything the server needs to go on after `round_idx` (tensors and JSON values)."""
        wandb = self.recorder.wandb
        return (
            {
                "round": round_idx,
                "global": self.aggregator.global_state,
                "algorithm": self.aggregator.algorithm.state(),
                "totals": dict(self.totals),
                "eval_totals": dict(self.eval_totals),
                "records": list(self.recorder.records),
                "schedule": self.schedule,
                "claims": saved_claims(self.claims),
                "wandb_id": getattr(getattr(wandb, "run", None), "id", None),
            }
            | ({} if self.privacy is None else {"privacy": self.privacy.state()})
            | ({} if self.buffered is None else {"buffered": self.buffered.state()})
            | ({} if self.clock is None else {"clock": self.clock.state()})
        )

    def load_state(self, state: dict[str, Any]) -> int:
        """Restore `state()`; returns the first round still to run."""
        if [list(r) for r in state["schedule"]] != self.schedule:
            raise ValueError(
                "the checkpoint's sampling schedule differs from this run's (another seed or party count?)"
            )
        claims = loaded_claims(state.get("claims"))
        if claims and self.claims and claims != self.claims:
            raise ValueError("the checkpoint's party claims differ from this run's partition (other data?)")
        if claims and not self.claims:  # a server without data: the claims the parties made
            self.set_claims(claims)
        self.aggregator.set_model_params({"model": state["global"]})
        self.aggregator.model.load_state_dict(self.aggregator.global_state)
        self.aggregator.algorithm.load_state(state["algorithm"])
        self.totals.update({k: int(v) for k, v in state["totals"].items()})
        self.eval_totals.update({k: int(v) for k, v in state["eval_totals"].items()})
        self.recorder.restore(state["records"])
        start = int(state["round"]) + 1
        if self.buffered is not None:  # server_args.aggregation: buffered (engine.buffer_rounds)
            self.buffered.load_state(state["buffered"])
        if self.clock is not None and "clock" in state:  # older checkpoints: replayed (engine.buffered)
            self.clock.load_state(state["clock"])
        if self.privacy is not None:
            self.privacy.load_state(state.get("privacy") or {})
            self.rounds = self._rounds_allowed(start)
        return start

    def local_round_cost(self, party: int, payload: Payload, spec: dict | None = None) -> tuple[float, int]:
        """What the simulated clock charges `party`'s local round for, besides its law: its training
        examples (a per-example law) and the bytes it moves: `payload` down, its upload's up (`spec`,
        its `upload_spec` where the caller holds it already)."""
        spec = self.uploads.upload_spec(party) if spec is None else spec
        return float(self.samples.get(party, 1)), payload_nbytes(payload) + payload_nbytes(spec)

    def save_uploads(self, uploads: dict[int, Payload]) -> None:
        """`train_args.save_party_models`: each party's latest uploaded model, written as it arrives
        (party_models/party_<id>.pt), so a stopped run keeps them too."""
        for party, upload in uploads.items():
            path = self.recorder.folder.party_model(party)
            with replacing(path, path.with_suffix(".tmp")) as tmp:  # the archive's records: party_<id>/
                torch.save(dict(upload["model"]), tmp)

    # --- the run --------------------------------------------------------------------------------
    def finish(self, status: str) -> dict[str, Any]:
        """Save the model and write summary.json (whatever the status), with the model's file and its
        digest (`state_dict_sha256`). Only a completed run's model is `final_model.pt`; a failed or
        interrupted run's is `model_at_<status>.pt`. Any other model file a run before this one left
        in the folder (a stale final_model.pt, the model_at_failed.pt of a run since resumed) goes."""
        state, folder = self.aggregator.global_state, self.recorder.folder
        path = folder.model(status)
        with replacing(path) as tmp:
            torch.save(state, tmp)
        for stale in [folder.final_model, *folder.models_at()]:
            if stale != path:
                stale.unlink(missing_ok=True)
        digest = state_dict_sha256(state)
        log.info("final model sha256 %s (%s)", digest, path.name)
        extra = {**self.totals, **self.eval_totals, "model_file": path.name, "final_model_sha256": digest}
        extra["headline"] = self.headline  # the figure final_test_acc and best_test_acc are of
        if self.privacy is not None:
            extra.update(self.privacy.summary())
        self.summary = self.recorder.finish(status, extra)
        return self.summary
