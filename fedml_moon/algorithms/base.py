"""What every algorithm is made of: a local loss, what a party sends, what it keeps, and what the
server does with what it receives. Pure PyTorch; the round engine drives these objects.

Payloads are plain dicts: {"model": state_dict, ...extra tensors...}, plus a few JSON-able fields
(`party_id`). The same payload travels unchanged in every mode.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from fedml_moon.config.schema import ServerArgs, TrainArgs
from fedml_moon.core.aggregation import ServerMomentum, clone_state
from fedml_moon.core.optim import EagerSGD
from fedml_moon.core.personal import PartyFigures, new_test
from fedml_moon.core.robust import RobustMean, RobustOptions
from fedml_moon.core.seeds import torch_seed
from fedml_moon.core.server_opt import AdaptiveServer, server_step
from fedml_moon.core.split import merge_states
from fedml_moon.privacy.sums import UPDATE, Sums, apply_mean_update

Payload = dict[str, Any]
log = logging.getLogger(__name__)
ModelFactory = Callable[[], nn.Module]


@dataclass
class NoOptions:
    """Algorithms without options of their own."""


def make_optimizer(model: nn.Module, train: TrainArgs, lr: float | None = None) -> torch.optim.Optimizer:
    """SGD created anew at every local training call: momentum does not carry across rounds
    (`torch.optim.SGD`'s arithmetic, without its import of `torch._dynamo`: `core.optim`)."""
    params = [p for p in model.parameters() if p.requires_grad]
    lr = train.learning_rate if lr is None else lr
    return EagerSGD(params, lr=lr, momentum=train.momentum, weight_decay=train.weight_decay)


@dataclass(frozen=True)
class PartyRound:
    """One party's local round as the engine hands it to the algorithm: what the server sent, what
    the party keeps (`finish` updates it in place), which round and party, and the model's trainable
    parameters by state-dict name (buffers are not among them)."""

    received: Payload
    state: dict
    round_idx: int
    party: int
    trainable: tuple[str, ...]


@dataclass
class Context:
    """What a party's local round needs, computed once before its first step (`ClientAlgorithm.context`).

    `start`: the full model state the party starts from. `lr`: its local learning rate. `shared`:
    values equal for every party of the round (e.g. MOON's global model), `party`: the party's own
    tensors (e.g. SCAFFOLD's c - c_i); both may nest dicts and lists, and `loss` reads them merged
    under their keys (which must differ). Parties whose shared values are equal, whose party values
    have the same shapes and whose learning rates are equal train stacked."""

    start: Mapping[str, torch.Tensor]
    lr: float
    shared: dict = field(default_factory=dict)
    party: dict = field(default_factory=dict)


@dataclass
class LocalResult:
    """A party's finished local training, as `finish` receives it: the model state after the last
    step (read it, clone what you keep), the number of SGD steps taken, a module holding that
    state (to compute with it) and the party's training data."""

    final: Mapping[str, torch.Tensor]
    steps: int
    model: nn.Module
    data: Iterable

    def batches(self) -> Iterable:
        """The party's training data as (x, y) batches in a fixed order, without augmentation: for
        statistics of the final model (e.g. per-class mean representations)."""
        return self.data.plain() if hasattr(self.data, "plain") else self.data

    @property
    def num_classes(self) -> int:
        """The number of classes (the width of the model's classifier)."""
        return int(self.model.classifier.out_features)


class Net(Protocol):
    """A party's network inside a step: `net(x)` the model's output (`core.models.ModelOutput`) in
    train mode, `net.params` its trainable parameters by name, `net.frozen(state, x)` the eval-mode
    output, without gradient, of the same architecture with the weights `state` (a teacher)."""

    params: Mapping[str, torch.Tensor]

    def __call__(self, x: torch.Tensor) -> Any: ...

    def frozen(self, state: Mapping[str, torch.Tensor], x: torch.Tensor) -> Any: ...


class ClientAlgorithm:
    """The party side, written once: the engine (`engine/local.py`) runs it for one party on the
    model itself or for K parties stacked, with or without CUDA graphs. A local round is

        ctx = context(round)                         # before the first step
        for each of E epochs, for each batch (x, y):
            loss(net, x, y, ctx) -> backward -> before_step -> SGD(ctx.lr) -> after_step
        upload = finish(round, ctx, result)          # updates round.state

    An algorithm overrides `loss` and, where it needs them, `context`, the two step hooks, `finish`
    and `personal_state`, and sets the class attributes below that differ from FedAvg's. Nothing of a
    round lives on `self`."""

    name: ClassVar[str] = "fedavg"
    """A label for whoever reads the class; runs know an algorithm by its registry name
    (`AlgorithmSpec.name`, what `train_args.algorithm` gives)."""
    personalized: ClassVar[bool] = False
    """True: each party predicts with its own model (`eval_state`): every evaluated round tests the
    parties' own models on their test splits, and they report their personal state for the new test."""
    terms: ClassVar[tuple[str, ...]] = ("ce",)
    """The named terms `loss` returns (its total is recorded as train_loss): the only training metrics
    a party reports and the server records, each under its name (none may be a field the server
    writes: `core.validate.terms_problem`). A term `loss` returns but does not declare stops training."""

    def __init__(self, options: Any, train: TrainArgs, model_factory: ModelFactory, seed: int) -> None:
        self.options = options
        self.train_args = train
        self.model_factory = model_factory
        self.seed = seed

    def generator(self, r: PartyRound) -> torch.Generator:
        """A CPU generator of this run, round and party: the same numbers in every mode, on every
        resume, whatever else drew random numbers. Draw an algorithm's random numbers from it (in
        `context` or `finish`), never from torch's, numpy's or Python's global state."""
        return torch.Generator().manual_seed(torch_seed(self.seed, "algorithm", 0, r.round_idx, r.party))

    def context(self, r: PartyRound) -> Context:
        """The round's starting model, learning rate and what `loss` and the hooks read: the
        server's model at train_args.learning_rate, nothing else."""
        return Context(r.received["model"], self.train_args.learning_rate)

    def loss(self, net: Net, x: torch.Tensor, y: torch.Tensor, ctx: dict) -> tuple[torch.Tensor, dict]:
        """One batch's loss and its named terms (detached) for metrics: x [B, ...], y [B]; `ctx` the
        context's shared and party entries (the party's own). Cross-entropy (FedAvg)."""
        ce = F.cross_entropy(net(x).logits, y)
        return ce, {"ce": ce.detach()}

    def before_step(self, params: dict, grads: dict, ctx: dict, rows: torch.Tensor | None) -> None:
        """After backward, before the SGD step: `params` and `grads` [K, ...] by trainable name
        (K = 1 on the sequential path; write into `grads` in place), `ctx` the parties' stacked party
        entries [K, ...]; only the rows `rows` step (None: all)."""

    def after_step(self, params: dict, ctx: dict, rows: torch.Tensor | None, lr: float) -> None:
        """After the SGD step of the rows `rows` (as `before_step`; write into `params` in place)."""

    def finish(self, r: PartyRound, ctx: Context, done: LocalResult) -> Payload:
        """Updates what the party keeps (`r.state`) and returns its upload: the model (FedAvg)."""
        return {"model": clone_state(done.final), "party_id": int(r.party)}

    def personal_state(self, state: dict) -> dict | None:
        """The entries of this party's model that are its own rather than the server's (None: none)."""
        return None

    def eval_state(self, received: Payload, state: dict) -> dict:
        """The full model state this party would predict with, given the server's full model."""
        personal = self.personal_state(state)
        return received["model"] if not personal else merge_states(received["model"], personal)


def add_rows(target: torch.Tensor, source: torch.Tensor, rows: torch.Tensor | None, alpha: float) -> None:
    """target[rows] += alpha * source[rows] (every row when rows is None), in place: for step hooks."""
    if rows is None:
        target.add_(source, alpha=alpha)
    else:
        target.index_add_(0, rows, source.index_select(0, rows), alpha=alpha)


def robust_mean(server: ServerArgs) -> RobustMean:
    """The upload average of `server_args` (robust_aggregation and its keys; see `core.robust`)."""
    options = RobustOptions(
        server.robust_aggregation,
        server.trim_ratio,
        server.krum_byzantine,
        server.krum_select,
        server.clip_norm,
    )
    if options.rule != "none":
        log.info("server_args.robust_aggregation: %s (%s)", options.rule, options)
    return RobustMean(options)


class ServerAlgorithm:
    """The server side: what it sends, how it combines what it receives.

    Wherever it averages uploads it calls `self.mean(states, weights, reference)` (or `self.mean.total`
    / `self.mean.rows`), the rule of `server_args.robust_aggregation` (`core.robust`; `none`: the
    sample-weighted average). What a server may declare of itself are the class attributes below;
    the config's checks read them before a run starts."""

    averages: ClassVar[bool] = True
    """False for a server that averages nothing (each party keeps its own model): a robust rule
    (`server_args.robust_aggregation`) and `privacy_args` are then config errors."""
    summed: ClassVar[dict[str, str]] = {"model": UPDATE}
    """What `privacy_args`, `train_args.stream_uploads` and buffered aggregation sum of each upload,
    field by field: "update" (the weighted change from what the party received) or "sum" (as it is);
    `aggregate_sums` reads the sums back. Empty: the server sums nothing, and those settings are
    config errors."""
    not_buffered: ClassVar[str | None] = None
    """Why this server's step does not fit a buffered, staleness-discounted sum, in words: set, it
    makes `server_args.aggregation: buffered` a config error that gives the reason. None: it fits."""

    @classmethod
    def standalone_only(cls, options: Any) -> list[str]:
        """The settings (config keys) that, as the algorithm's `options` give them, only the standalone
        simulation honours: figures that need every party's model beside every party's test split
        (`party_figures`). Another mode, or secure aggregation, is then a config error naming them.
        None by default; LG-FedAvg names `algorithm_args.report_best` when it is on."""
        return []

    def __init__(self, options: Any, server: ServerArgs, train: TrainArgs, seed: int = 0) -> None:
        self.options = options
        self.train_args = train
        self.seed = seed
        self.round_idx = 0
        # the model's trainable parameters by state-dict name: set by the aggregator after __init__,
        # before `setup`
        self.trainable: list[str] = []
        self.optimizer = server_step(server)  # server momentum and rate, or FedAdam / FedYogi / FedAdagrad
        self.mean = robust_mean(server)
        self.class_counts: dict[int, list[int]] = {}  # party -> its training samples per class
        self.classes_held: dict[int, list[int]] = {}  # party -> the classes it claims (engine.claims)

    def generator(self, round_idx: int) -> torch.Generator:
        """A CPU generator of this run and round for the server's own draws (as
        `ClientAlgorithm.generator`): derived, so a checkpoint need not carry it."""
        return torch.Generator().manual_seed(torch_seed(self.seed, "algorithm", 1, round_idx))

    def setup(self, global_state: OrderedDict) -> OrderedDict:
        """Called once with the initial global state; may validate it or replace it (e.g. a checkpoint).
        `self.trainable` is set before it is called (not yet in `__init__`)."""
        return global_state

    def upload_spec(self, global_state: OrderedDict, party_id: int) -> dict:
        """What party `party_id`'s upload must hold this round, exactly (`core.validate.upload_problem`:
        tensors by name, shape and dtype, other fields by value): every entry of the global model and
        the party's id. The server refuses an upload that differs in any of them."""
        return {"model": global_state, "party_id": int(party_id)}

    def upload_problem(self, upload: Payload, party_id: int) -> str | None:
        """Why party `party_id`'s upload (already shaped as `upload_spec` says) cannot be what its
        local round produced, checked by meaning against what the server knows of the party (its
        class counts, `class_counts`), or None. None unless overridden (FedSSC binds `present`)."""
        return None

    def personal_spec(self, global_state: OrderedDict) -> dict:
        """The personal state a party of a personalised algorithm reports on evaluation rounds (as
        `upload_spec`): the whole model unless overridden (LG-FedAvg: its local layers)."""
        return global_state

    def download(self, global_state: OrderedDict, party_id: int | None = None) -> Payload:
        """What the server sends to a party (the same for every party unless overridden)."""
        return {"model": global_state}

    def combine(self, global_state: OrderedDict, uploads: list[tuple[float, Payload]]) -> OrderedDict:
        """Sample-count weighted average of the uploaded models (MOON Algorithm 1, line 7), or the
        `server_args.robust_aggregation` rule's combination of them around the current global state."""
        return self.mean([p["model"] for _, p in uploads], [n for n, _ in uploads], global_state)

    def aggregate(self, global_state: OrderedDict, uploads: list[tuple[float, Payload]]) -> OrderedDict:
        """New global state from this round's uploads, with server momentum when configured."""
        return self.step(global_state, self.combine(global_state, uploads))

    def sum_weight(self, samples: float) -> float:
        """A party's weight in the sums of `summed` (its sample count; LG-FedAvg's uniform mean: 1)."""
        return samples

    def aggregate_sums(self, global_state: OrderedDict, sums: Sums) -> OrderedDict:
        """New global state from the round's sums alone (`privacy_args`; `fedml_moon.privacy.sums`):
        the global state moved by the weighted mean update sums["model"] / weight, then `step`."""
        moved = apply_mean_update(global_state, sums.fields["model"], sums.weight)
        return self.step(global_state, merge_states(global_state, moved))

    def step(self, global_state: OrderedDict, averaged: OrderedDict) -> OrderedDict:
        """The round's last move from the averaged state: the server's optimiser (`core.server_opt`:
        server momentum and rate, or FedAdam / FedYogi / FedAdagrad) when configured."""
        self.round_idx += 1
        if self.optimizer is None:
            return averaged
        return self.optimizer.step(global_state, averaged, self.trainable or None)  # None: not known

    def state(self) -> dict:
        """What the server keeps across rounds, for checkpoints (tensors and JSON values): server
        momentum's velocity, an adaptive optimiser's moments. Subclasses that keep more extend it and
        `load_state`."""
        opt = self.optimizer
        velocity = opt.velocity if isinstance(opt, ServerMomentum) else {}
        moments = {"server_optimizer": opt.state()} if isinstance(opt, AdaptiveServer) else {}
        return {"round_idx": self.round_idx, "velocity": dict(velocity), **moments}

    def load_state(self, state: dict) -> None:
        """Restore what `state()` returned (after `setup`)."""
        self.round_idx = int(state["round_idx"])
        if isinstance(self.optimizer, ServerMomentum):
            self.optimizer.velocity = dict(state["velocity"])
        if isinstance(self.optimizer, AdaptiveServer):
            self.optimizer.load_state(state["server_optimizer"])

    def party_reset(self, party_id: int) -> None:
        """A party came back without its state (its silo lost it): forget what was sent to it only once."""

    def wants_evaluation(self, round_idx: int) -> bool:
        """Evaluate this round even where validation_args.frequency_of_the_test would skip it."""
        return False

    def after_evaluation(self, round_idx: int, metrics: dict, global_state: OrderedDict) -> OrderedDict:
        """Called with an evaluated round's test metrics; returns the global state to go on from."""
        return global_state

    def new_test(
        self, model: nn.Module, states: list[dict], test_global: Iterable, device: torch.device
    ) -> dict[str, float]:
        """Personalised algorithms' new test: the parties' own models `states` combined, on the global
        test set (a party never seen); the uniform parameter average unless overridden."""
        acc, loss = new_test(model, states, test_global, device, "average", self.mean)
        return {"new_test_acc": acc, "new_test_loss": loss}

    def new_test_models(self, states: list[dict]) -> tuple[str, list[dict]]:
        """The parties' own models `states` combined as `new_test` combines them, for the sites to
        test (federated evaluation): ("average", [their uniform average]) unless overridden."""
        return "average", [self.mean(states, [1.0] * len(states))]

    def party_figures(self) -> PartyFigures | None:
        """Figures that need every party's own model beside every party's test split, which only the
        standalone simulation holds (None: none; `standalone_only` names the settings that ask for them)."""
        return None

    def models_to_evaluate(self, global_state: OrderedDict) -> dict[str, OrderedDict]:
        """Named states the server evaluates on the global test set."""
        return {"global": global_state}
