"""The plugin's single-process round loop (FedML's `sp` backend ignores custom trainers).

It drives the same PluginClientTrainer / PluginServerAggregator objects, through the same calls and
in the same order, as FedML's cross-silo client and server managers do. It is handed to FedML as
`FedMLRunner(args, device, dataset, model, algorithm_flow=StandaloneSimulation(...)).run()`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from tqdm import tqdm

from fedml_moon.core.aggregation import payload_nbytes, payload_numel
from fedml_moon.core.personal import BestSoFar, local_test_accs, new_test
from fedml_moon.core.schedule import sample_schedule
from fedml_moon.glue.aggregator import PluginServerAggregator
from fedml_moon.glue.trainer import PluginClientTrainer
from fedml_moon.metrics import RunRecorder

log = logging.getLogger(__name__)


def _weighted_mean(values: list[tuple[float, dict[str, float]]], key: str) -> float | None:
    pairs = [(n, m[key]) for n, m in values if key in m]
    total = sum(n for n, _ in pairs)
    return sum(n * v for n, v in pairs) / total if total else None


class StandaloneSimulation:
    """Rounds of: send the global payload, train each sampled party, aggregate, evaluate, record."""

    def __init__(
        self,
        dataset: list,
        trainer: PluginClientTrainer,
        aggregator: PluginServerAggregator,
        device: torch.device,
        args: Any,
        recorder: RunRecorder,
        rounds: int,
        per_round: int,
        test_every: int,
        seed: int,
        local_test: bool = False,
    ) -> None:
        (_, _, _, self.test_global, self.num_local, self.train_local, self.test_local, _) = dataset
        self.trainer, self.aggregator = trainer, aggregator
        self.device, self.args, self.recorder = device, args, recorder
        self.rounds, self.test_every, self.local_test = rounds, test_every, local_test
        self.schedule = sample_schedule(len(self.train_local), per_round, rounds, seed)
        self.totals = {"bytes_up": 0, "bytes_down": 0, "params_up": 0, "params_down": 0}
        self.best_so_far = self._best_so_far()
        self.summary: dict[str, Any] = {}

    def _best_so_far(self) -> BestSoFar | None:
        """The authors' best-so-far reporting when the algorithm's `report_best` option is on."""
        options = self.trainer.algorithm.options
        if not getattr(options, "report_best", False):
            return None
        global_keys, _ = options.split(self.aggregator.global_state.keys())
        return BestSoFar(global_keys)

    def evaluates(self, round_idx: int) -> bool:
        """FedML's rule (round % frequency_of_the_test == 0, and the last round), plus any round the
        server algorithm asks for."""
        rule = round_idx % self.test_every == 0 or round_idx == self.rounds - 1
        return rule or self.aggregator.algorithm.wants_evaluation(round_idx)

    def train_party(self, party: int) -> tuple[float, dict]:
        """One party's local round, through FedML's ClientTrainer calls."""
        trainer = self.trainer
        download = self.aggregator.get_model_params_for(party)
        self.totals["bytes_down"] += payload_nbytes(download)
        self.totals["params_down"] += payload_numel(download)
        trainer.set_model_params(download)
        train_data = self.train_local[party]
        trainer.update_dataset(train_data, self.test_local[party], self.num_local[party])
        trainer.on_before_local_training(train_data, self.device, self.args)
        trainer.train(train_data, self.device, self.args)
        trainer.on_after_local_training(train_data, self.device, self.args)
        upload = trainer.get_model_params()
        self.totals["bytes_up"] += payload_nbytes(upload)
        self.totals["params_up"] += payload_numel(upload)
        return float(self.num_local[party]), upload

    def server_round(self, uploads: list[tuple[float, dict]]) -> None:
        """FedML cross-silo's order: on_before_aggregation, aggregate, on_after_aggregation, set."""
        uploads, _ = self.aggregator.on_before_aggregation(uploads)
        new_state = self.aggregator.aggregate(uploads)
        new_state = self.aggregator.on_after_aggregation(new_state)
        self.aggregator.set_model_params(new_state)

    def party_metrics(self) -> dict[str, float]:
        """Each party's model on its own test split (local test); for personalised algorithms also the
        global test set with the parties' models averaged or ensembled (new test), and with
        `report_best` the LG-FedAvg authors' best-so-far figures (`BestSoFar`).

        Simulation-side evaluation: the party's model is the server's model with the party's own
        state applied (`ClientAlgorithm.eval_state`); parties that never trained use the server's.
        """
        algo, model = self.trainer.algorithm, self.aggregator.model
        full = {"model": self.aggregator.global_state}
        parties = range(len(self.test_local))
        states = [algo.eval_state(full, self.trainer.store.get(p)) for p in parties]
        test_local = [self.test_local[p] for p in parties]
        accs = local_test_accs(model, states, test_local, self.device)
        out = {"local_test_acc": sum(accs) / len(accs)}
        if algo.personalized:
            method = getattr(algo.options, "new_test_method", "average")
            acc, loss = new_test(model, states, self.test_global, self.device, method)
            out.update(new_test_acc=acc, new_test_loss=loss)
        if self.best_so_far is not None:
            self.best_so_far.update(states, accs)
            out.update(self.best_so_far.evaluate(model, test_local, self.test_global, self.device))
        model.load_state_dict(self.aggregator.global_state)
        return out

    def one_round(self, round_idx: int, bar: tqdm) -> dict[str, Any]:
        started = time.perf_counter()
        self.args.round_idx = round_idx
        parties = self.schedule[round_idx]
        uploads = []
        for i, party in enumerate(parties):
            bar.set_postfix_str(f"party {i + 1}/{len(parties)} (id {party})")
            uploads.append(self.train_party(party))
        self.server_round(uploads)
        record: dict[str, Any] = {"round": round_idx, "parties": len(parties)}
        metrics = [(n, p.get("metrics", {})) for n, p in uploads]
        record["train_loss"] = _weighted_mean(metrics, "loss")
        for key in sorted({k for _, m in metrics for k in m} - {"loss"}):  # ce, l_con, l_glob, prox, ...
            record[key] = _weighted_mean(metrics, key)
        if self.evaluates(round_idx):
            record.update(self.aggregator.test(self.test_global, self.device, self.args))
            if self.local_test or self.trainer.algorithm.personalized:
                record.update(self.party_metrics())
            self.aggregator.after_evaluation(round_idx, record)
        record["round_time_s"] = time.perf_counter() - started
        record.update(self.totals)
        return record

    def run(self) -> None:
        status = "failed"
        try:
            with tqdm(range(self.rounds), desc="rounds", unit="round", disable=None) as bar:
                for round_idx in bar:
                    record = self.one_round(round_idx, bar)
                    self.recorder.log_round(record)
            status = "completed"
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        finally:
            torch.save(self.aggregator.global_state, self.recorder.out_dir / "final_model.pt")
            self.summary = self.recorder.finish(status, dict(self.totals))
