"""LG-FedAvg (Liang et al., "Think Locally, Act Globally"): parties keep local layers, only the
global layers are averaged and travel, in both directions.

Optionally the run starts with `warmup_rounds` of plain FedAvg (the full model travels), or from a
FedAvg checkpoint; each party's local layers start from that model the first time it trains in the LG
phase (the server sends them to it once, and this is counted in params_down).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from fedml_moon.algorithms.base import (
    ClientAlgorithm,
    Context,
    LocalResult,
    PartyRound,
    Payload,
    ServerAlgorithm,
)
from fedml_moon.config.fields import choice
from fedml_moon.config.schema import ConfigError, require
from fedml_moon.core.aggregation import clone_state
from fedml_moon.core.personal import BestSoFar, new_test
from fedml_moon.core.split import PRESETS, SplitError, merge_states, resolve_split, split_state

NEW_TEST_METHODS = ("average", "ensemble")
WARMUP_STARTS = ("last", "best")
log = logging.getLogger(__name__)


@dataclass
class LGOptions:
    split_preset: str | None = choice(None, PRESETS)
    """a named global/local split; exactly one of the four split keys is given"""
    global_prefixes: list[str] | None = None
    """the global layers by module name, e.g. [encoder.fc1, classifier]; one of the four split keys"""
    global_layers_from_top: int | None = None
    """the last n layers (the output side) are global; one of the four split keys"""
    global_layers_from_bottom: int | None = None
    """the first n layers (the input side) are global; one of the four split keys"""
    warmup_rounds: int = 0
    """rounds of plain FedAvg (the whole model travels) before the LG phase; >= 0"""
    warmup_checkpoint: str | None = None
    """a FedAvg run's final_model.pt to start from in place of a warm-up; null: none"""
    uniform_average: bool = True
    """average the global layers uniformly over the sampled parties (the authors' code); false: by samples"""
    new_test_method: str = choice("average", NEW_TEST_METHODS)
    """the parties' models in the new test: average (of their parameters) or ensemble (of their softmax)"""
    warmup_lr: float | None = None
    """learning rate of the FedAvg warm-up (the authors use 0.1); null: train_args.learning_rate; > 0"""
    warmup_start: str = choice("last", WARMUP_STARTS)
    """the warm-up model the LG phase starts from: last, or best (by test accuracy, among evaluated rounds)"""
    report_best: bool = False
    """also report the authors' best-so-far figures (optimistic; LG start and LG rounds); standalone only"""

    def check(self) -> None:
        ways = [
            self.split_preset,
            self.global_prefixes,
            self.global_layers_from_top,
            self.global_layers_from_bottom,
        ]
        require(
            sum(w is not None for w in ways) == 1,
            "algorithm_args.split_preset",
            "give exactly one of split_preset (mnist-mlp, cifar-cnn, head), global_prefixes, "
            "global_layers_from_top, global_layers_from_bottom",
        )
        require(self.warmup_rounds >= 0, "algorithm_args.warmup_rounds", "must be >= 0")
        if self.warmup_checkpoint is not None:
            require(
                Path(self.warmup_checkpoint).expanduser().is_file(),
                "algorithm_args.warmup_checkpoint",
                f"{self.warmup_checkpoint!r} does not exist; give the final_model.pt of a FedAvg run",
            )
        require(
            self.new_test_method in NEW_TEST_METHODS,
            "algorithm_args.new_test_method",
            f"choose one of {', '.join(NEW_TEST_METHODS)}",
        )
        require(
            self.warmup_lr is None or self.warmup_lr > 0,
            "algorithm_args.warmup_lr",
            "must be > 0 (the authors' FedAvg uses 0.1), or null for train_args.learning_rate",
        )
        require(
            self.warmup_start in WARMUP_STARTS,
            "algorithm_args.warmup_start",
            f"choose one of {', '.join(WARMUP_STARTS)} (best: the warm-up model with the best test accuracy)",
        )

    def split(self, keys: Iterable[str]) -> tuple[list[str], list[str]]:
        """(global_keys, local_keys) for a model's state-dict keys; a ConfigError when invalid."""
        try:
            return resolve_split(
                list(keys),
                preset=self.split_preset,
                global_prefixes=self.global_prefixes,
                from_top=self.global_layers_from_top,
                from_bottom=self.global_layers_from_bottom,
            )
        except SplitError as err:
            raise ConfigError(str(err)) from None


class LGClient(ClientAlgorithm):
    """In the LG phase: global layers from the server, local layers from the party's own state."""

    name = "lg"
    personalized = True

    def context(self, r: PartyRound) -> Context:
        """The server's model in the warm-up; in the LG phase its global layers with the party's local
        ones (those the server sent once, before the party first trained). `warmup_lr` in the
        warm-up rounds when set (the authors' FedAvg trains at 0.1)."""
        if r.received.get("phase", "fedavg") != "lg":
            lr = self.options.warmup_lr or self.train_args.learning_rate
            return Context(r.received["model"], lr)
        local = r.state.get("local", r.received.get("local_init"))
        if local is None:
            raise RuntimeError(f"party {r.party} has no local layers and the server sent none")
        return Context(merge_states(r.received["model"], local), self.train_args.learning_rate)

    def finish(self, r: PartyRound, ctx: Context, done: LocalResult) -> Payload:
        """In the LG phase: keeps the local layers, uploads the global ones (the whole model before)."""
        full = clone_state(done.final)
        if r.received.get("phase", "fedavg") != "lg":
            return {"model": full, "party_id": int(r.party)}
        global_keys, local_keys = self.options.split(full.keys())
        r.state["local"] = split_state(full, local_keys)
        return {"model": split_state(full, global_keys), "party_id": int(r.party)}

    def personal_state(self, state: dict) -> dict | None:
        """The party's local layers (None before it first trains in the LG phase)."""
        return state.get("local")


class LGServer(ServerAlgorithm):
    """Averages the global layers (uniformly over the sampled parties by default, as the authors' code)."""

    @classmethod
    def standalone_only(cls, options: LGOptions) -> list[str]:
        """`report_best` when it is on: the authors' figures need every party's model beside every
        party's test split."""
        return ["algorithm_args.report_best"] if options.report_best else []

    def setup(self, global_state: OrderedDict) -> OrderedDict:
        self.global_keys, self.local_keys = self.options.split(global_state.keys())
        self.served: set[int] = set()
        self.figures = BestSoFar(self.global_keys) if self.options.report_best else None
        self.best_warmup: tuple[float, int, OrderedDict] | None = None
        path = self.options.warmup_checkpoint
        if path is None:
            return global_state
        loaded = torch.load(Path(path).expanduser(), map_location="cpu", weights_only=True)
        loaded = loaded.get("model", loaded)
        if set(loaded) != set(global_state):
            missing = sorted(set(global_state) - set(loaded))
            extra = sorted(set(loaded) - set(global_state))
            raise ConfigError(
                f"algorithm_args.warmup_checkpoint: keys do not match the model (missing {missing[:5]}, "
                f"unexpected {extra[:5]}); use a checkpoint of the same model_args"
            )
        return OrderedDict((k, loaded[k].to(v.dtype)) for k, v in global_state.items())

    @property
    def phase(self) -> str:
        return "fedavg" if self.round_idx < self.options.warmup_rounds else "lg"

    def download(self, global_state: OrderedDict, party_id: int | None = None) -> Payload:
        if self.phase == "fedavg":
            return {"model": global_state, "phase": "fedavg"}
        if self.figures is not None and not self.figures.begun:  # the LG phase's first download
            self.figures.begin(global_state)
        payload: Payload = {"model": split_state(global_state, self.global_keys), "phase": "lg"}
        if party_id is not None and party_id not in self.served:
            payload["local_init"] = split_state(global_state, self.local_keys)
            self.served.add(int(party_id))
        return payload

    def upload_spec(self, global_state: OrderedDict, party_id: int) -> dict:
        """The whole model in the warm-up, the global layers in the LG phase."""
        if self.phase == "fedavg":
            return super().upload_spec(global_state, party_id)
        return {"model": split_state(global_state, self.global_keys), "party_id": int(party_id)}

    def personal_spec(self, global_state: OrderedDict) -> dict | None:
        """A party's local layers."""
        return split_state(global_state, self.local_keys)

    def new_test(
        self, model: nn.Module, states: list[dict], test_global: Iterable, device: torch.device
    ) -> dict[str, float]:
        """`new_test_method`: "average" (the authors' acc_test_avg) or "ensemble" (mean softmax)."""
        acc, loss = new_test(model, states, test_global, device, self.options.new_test_method, self.mean)
        return {"new_test_acc": acc, "new_test_loss": loss}

    def new_test_models(self, states: list[dict]) -> tuple[str, list[dict]]:
        """`new_test_method` for the sites: the average (one model) or the ensemble (every model)."""
        if self.options.new_test_method == "ensemble":
            return "ensemble", list(states)
        return super().new_test_models(states)

    def party_figures(self) -> BestSoFar | None:
        """`report_best`: the authors' best-so-far figures (core.personal.BestSoFar)."""
        return self.figures

    def sum_weight(self, samples: float) -> float:
        """1 for the uniform average (`uniform_average`), else the party's sample count."""
        return 1.0 if self.options.uniform_average else samples

    def combine(self, global_state: OrderedDict, uploads: list[tuple[float, Payload]]) -> OrderedDict:
        """The global layers' average (uniform or by samples; or the robust rule's, around the
        current global layers); the local layers stay as they are."""
        weights = [1.0 if self.options.uniform_average else n for n, _ in uploads]
        states = [p["model"] for _, p in uploads]
        averaged = self.mean(states, weights, {k: global_state[k] for k in states[0]})
        return merge_states(global_state, averaged)

    def state(self) -> dict:
        best = None if self.best_warmup is None else list(self.best_warmup)
        return {**super().state(), "served": sorted(self.served), "best_warmup": best}

    def load_state(self, state: dict) -> None:
        super().load_state(state)
        self.served = {int(p) for p in state["served"]}
        best = state["best_warmup"]
        self.best_warmup = None if best is None else (float(best[0]), int(best[1]), best[2])

    def party_reset(self, party_id: int) -> None:
        """It lost its local layers: send it initial ones again at its next LG round."""
        self.served.discard(int(party_id))

    def wants_evaluation(self, round_idx: int) -> bool:
        """With warmup_start "best", the last warm-up round is always evaluated."""
        last = self.options.warmup_rounds - 1
        return self.options.warmup_start == "best" and round_idx == last

    def after_evaluation(self, round_idx: int, metrics: dict, global_state: OrderedDict) -> OrderedDict:
        """warmup_start "best": LG starts from the warm-up model with the best global test accuracy
        among the evaluated warm-up rounds, the older on a tie (the authors start from their FedAvg
        run's best_<round>.pt, which a round replaces only when it is better)."""
        if self.options.warmup_start != "best" or round_idx >= self.options.warmup_rounds:
            return global_state
        acc = float(metrics["test_acc"])
        if self.best_warmup is None or acc > self.best_warmup[0]:  # ties: the older (main_fed.py)
            self.best_warmup = (acc, round_idx, clone_state(global_state))
        if round_idx < self.options.warmup_rounds - 1:
            return global_state
        acc, best_round, best = self.best_warmup
        log.info("LG-FedAvg starts from the best warm-up model: round %d, test_acc %.4f", best_round, acc)
        return best
