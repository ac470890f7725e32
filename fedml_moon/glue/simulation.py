"""The plugin's single-process round loop (FedML's `sp` backend ignores custom trainers).

It drives the same objects as the distributed managers, in the same order: `ServerRounds` on the
server's side (PluginServerAggregator) and `PartyRunner` on the parties' (PluginClientTrainer, through
FedML's ClientTrainer calls). It is handed to FedML as
`FedMLRunner(args, device, dataset, model, algorithm_flow=StandaloneSimulation(...)).run()`.
"""

from __future__ import annotations

import logging
from typing import Any

from tqdm import tqdm

from fedml_moon.core.personal import BestSoFar
from fedml_moon.glue.rounds import ServerRounds
from fedml_moon.glue.trainer import PartyRunner

log = logging.getLogger(__name__)


class _NoBar:
    def set_postfix_str(self, _: str) -> None:
        pass


class StandaloneSimulation:
    """Rounds of: send each sampled party its payload, train it, aggregate, evaluate, record."""

    def __init__(self, server: ServerRounds, runner: PartyRunner) -> None:
        self.server, self.runner = server, runner
        self.trainer, self.aggregator = runner.trainer, server.aggregator
        self.rounds = server.rounds
        self.summary: dict[str, Any] = {}
        self._attach_best_so_far()

    def _attach_best_so_far(self) -> None:
        """LG-FedAvg's `report_best`: the authors' best-so-far figures need every party's test split
        beside every party's model, which only this single process has (standalone only)."""
        options = self.trainer.algorithm.options
        if not getattr(options, "report_best", False):
            return
        global_keys, _ = options.split(self.aggregator.global_state.keys())
        best, runner = BestSoFar(global_keys), self.runner
        test_local = [runner.test_local[p] for p in range(self.server.n_parties)]

        def extra(states: list[dict], accs: list[float]) -> dict[str, float]:
            best.update(states, accs)
            return best.evaluate(self.aggregator.model, test_local, self.server.test_global, runner.device)

        self.server.extra_metrics = extra

    def one_round(self, round_idx: int, bar: Any = None) -> dict[str, Any]:
        bar = bar or _NoBar()
        server, runner = self.server, self.runner
        downloads = server.downloads(round_idx)
        results = {}
        for i, (party, download) in enumerate(downloads.items()):
            bar.set_postfix_str(f"party {i + 1}/{len(downloads)} (id {party})")
            results[party] = runner.train(party, download, round_idx)
        ordered = server.aggregate(round_idx, results)
        reports = None
        if server.needs_party_eval(round_idx):
            download = server.eval_download()
            reports = {p: runner.evaluate(p, download) for p in range(server.n_parties)}
        return server.finish_round(round_idx, ordered, reports)

    def run(self) -> None:
        status = "failed"
        try:
            with tqdm(range(self.rounds), desc="rounds", unit="round", disable=None) as bar:
                for round_idx in bar:
                    self.one_round(round_idx, bar)
            status = "completed"
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        finally:
            self.summary = self.server.finish(status)
