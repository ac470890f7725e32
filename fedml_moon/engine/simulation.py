"""The plugin's single-process round loop (FedML's `sp` backend ignores custom trainers).

It drives the same objects as the distributed managers, in the same order: `ServerRounds` on the
server's side (PluginServerAggregator) and `PartyRunner` on the parties' (PluginClientTrainer, through
FedML's ClientTrainer calls). It is handed to FedML as
`FedMLRunner(args, device, dataset, model, algorithm_flow=StandaloneSimulation(...)).run()`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from tqdm import tqdm

from fedml_moon.config.files import file_digests
from fedml_moon.config.load import Config
from fedml_moon.core.sim_clock import SimClock
from fedml_moon.engine.parties import PartyRunner
from fedml_moon.engine.resume import Holding, check_resumable, due, flatten, restore, save
from fedml_moon.engine.rounds import ServerRounds

log = logging.getLogger(__name__)


class PartiesInOrder(Sequence):
    """Parties 0..n-1's loaders as a sequence, each made when it is read (`data.lazy`)."""

    def __init__(self, loaders: Mapping[int, Any], n: int) -> None:
        self.loaders, self.n = loaders, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self.loaders[p] for p in range(self.n)[i]]
        if not -self.n <= i < self.n:
            raise IndexError(i)
        return self.loaders[i % self.n]


class _NoBar:
    def set_postfix_str(self, _: str) -> None:
        pass


class StandaloneSimulation:
    """Rounds of: send each sampled party its payload, train it, aggregate, evaluate, record."""

    def __init__(
        self, server: ServerRounds, runner: PartyRunner, checkpoint_every: int = 0, stream: bool = False
    ) -> None:
        self.server, self.runner, self.stream = server, runner, stream  # stream: train_args.stream_uploads
        self.trainer, self.aggregator = runner.trainer, server.aggregator
        self.rounds, self.checkpoint_every = server.rounds, checkpoint_every
        self.start_round = 0
        self.clock: SimClock | None = None  # train_args.party_speed: the rounds' simulated seconds
        self.summary: dict[str, Any] = {}
        self.figures = self.aggregator.algorithm.party_figures()
        self._attach_party_figures()
        parties = list(range(server.n_parties))
        self.held = Holding(server, runner, parties, self.figures)  # everything: one process

    def _attach_party_figures(self) -> None:
        """The server algorithm's `party_figures` (e.g. LG-FedAvg's `report_best`) need every party's
        test split beside every party's model, which only this single process has."""
        figures, runner = self.figures, self.runner
        if figures is None:
            return
        self.server.eval_sample = 0  # its figures follow every party's model: every party reports
        test_local = PartiesInOrder(runner.test_local, self.server.n_parties)

        def extra(states: list[dict], accs: list[float]) -> dict[str, float]:
            model, test_global = self.aggregator.model, self.server.test_global
            return figures.figures(model, states, accs, test_local, test_global, runner.device)

        self.server.extra_metrics = extra

    def one_round(self, round_idx: int, bar: Any = None) -> dict[str, Any]:
        bar = bar or _NoBar()
        server, runner = self.server, self.runner
        downloads = server.downloads(round_idx)
        bar.set_postfix_str(f"{len(downloads)} parties")
        if self.stream:
            ordered = self.streamed(round_idx, list(downloads.items()))
        else:
            trained = runner.train_many(list(downloads.items()), round_idx)
            ordered = server.aggregate(round_idx, dict(zip(downloads, trained, strict=True)))
        extra = None if self.clock is None else {"sim_time_s": self.clock_round(downloads)}
        return self.close_round(round_idx, ordered, extra)

    def clock_round(self, downloads: Mapping[int, Any]) -> float:
        """The synchronous round on the simulated clock: its parties' local rounds, with what each costs."""
        costs = {p: self.server.local_round_cost(p, payload) for p, payload in downloads.items()}
        return self.clock.sync_round(list(downloads), costs)

    def close_round(
        self, round_idx: int, ordered: list, extra: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The round after its aggregation: the parties' evaluations where due, then its record."""
        server, runner = self.server, self.runner
        reports = new_reports = None
        if server.evaluation.needs_party_eval(round_idx):
            download = server.evaluation.eval_download()
            reports = {p: runner.evaluate(p, download) for p in server.evaluation.eval_parties(round_idx)}
        if server.evaluation.needs_new_test(reports):
            download = server.evaluation.new_test_download(reports)
            new_reports = {p: runner.evaluate(p, download) for p in range(server.n_parties)}
        if reports and server.evaluation.counts_summed:  # the server learns the sum only
            summed = server.evaluation.sum_counts(round_idx, reports)
            return server.finish_round(round_idx, ordered, None, extra, summed=summed)
        return server.finish_round(round_idx, ordered, reports, extra, new_reports=new_reports)

    def streamed(self, round_idx: int, tasks: list) -> list:
        """`train_args.stream_uploads`: the round's parties a chunk at a time (`parties_in_parallel`),
        each chunk's uploads folded into the server's running sums before the next trains."""
        done = 0
        while done < len(tasks):
            chunk = tasks[done : done + max(1, self.runner.parallel)]
            trained = self.runner.train_many(chunk, round_idx)
            self.server.summing.fold(round_idx, {p: r for (p, _), r in zip(chunk, trained, strict=True)})
            done += len(chunk)
        return self.server.summing.close_stream(round_idx)

    # --- checkpoints ------------------------------------------------------------------------------
    def checkpoint(self, round_idx: int, config: dict) -> None:
        """Everything this process holds after `round_idx`: the server's side and every party's."""
        save(self.server.recorder.out_dir, round_idx, config, self.held)

    def resume(self, cfg: Config) -> int:
        """Load the newest checkpoint of this run's output directory; returns the next round."""
        out_dir = self.server.recorder.out_dir
        round_idx = check_resumable(out_dir, cfg)
        self.start_round = restore(out_dir, round_idx, self.held)
        log.info("resuming after the checkpoint of round %d", round_idx)
        return self.start_round

    def checkpoint_config(self) -> dict[str, Any]:
        """The flat config a checkpoint holds, with the digest of each file its settings name
        (checked by --resume)."""
        config = flatten(self.server.recorder.config)
        config.update(file_digests(config))
        return config

    @contextlib.contextmanager
    def finishing(self) -> Iterator[None]:
        """A run's body: the model and summary.json written whatever ends it (`ServerRounds.finish`:
        completed, interrupted by Ctrl-C, or failed)."""
        status = "failed"
        try:
            yield
            status = "completed"
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        finally:
            self.summary = self.server.finish(status)

    def run(self) -> None:
        config = self.checkpoint_config()
        if self.start_round == 0:  # a new run: states an earlier run left in a disk store are not its own
            self.runner.load_state({})
        with self.finishing():
            rounds = range(self.start_round, self.rounds)
            with tqdm(rounds, desc="rounds", unit="round", disable=None, initial=self.start_round) as bar:
                for round_idx in bar:
                    self.one_round(round_idx, bar)
                    if due(self.checkpoint_every, round_idx, self.rounds):
                        self.checkpoint(round_idx, config)
