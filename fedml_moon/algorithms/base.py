"""What every algorithm is made of: a local loss, what a party sends, what it keeps, and what the
server does with what it receives. Pure PyTorch; the round engine drives these objects.

Payloads are plain dicts: {"model": state_dict, ...extra tensors...}, plus a few JSON-able fields
(`party_id`). The same payload travels unchanged in every mode.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from fedml_moon.config_schema import ServerArgs, TrainArgs
from fedml_moon.core.aggregation import ServerMomentum, clone_state
from fedml_moon.core.personal import PartyFigures, new_test
from fedml_moon.core.robust import RobustMean, RobustOptions
from fedml_moon.core.split import merge_states

Payload = dict[str, Any]
log = logging.getLogger(__name__)
ModelFactory = Callable[[], nn.Module]


BATCHED_PAIRS = (
    ("local_train", "batched_context"),
    ("batch_loss", "functional_loss"),
    ("before_step", "batched_before_step"),
    ("after_step", "batched_after_step"),
)


def _defined_in(cls: type, name: str) -> type:
    return next(c for c in cls.__mro__ if name in c.__dict__)


@dataclass
class NoOptions:
    """Algorithms without options of their own."""


def make_optimizer(model: nn.Module, train: TrainArgs, lr: float | None = None) -> torch.optim.Optimizer:
    """SGD created anew at every local training call: momentum does not carry across rounds."""
    params = [p for p in model.parameters() if p.requires_grad]
    lr = train.learning_rate if lr is None else lr
    return torch.optim.SGD(params, lr=lr, momentum=train.momentum, weight_decay=train.weight_decay)


class ClientAlgorithm:
    """The party side. Subclasses override `batch_loss` and, where needed, the round hooks."""

    name: ClassVar[str] = "fedavg"
    personalized: ClassVar[bool] = False  # parties predict with their own models (local test differs)

    def __init__(self, options: Any, train: TrainArgs, model_factory: ModelFactory, seed: int) -> None:
        self.options = options
        self.train_args = train
        self.model_factory = model_factory
        self.seed = seed
        self.steps = 0

    # --- hooks ---------------------------------------------------------------------------------
    def start_round(
        self, model: nn.Module, received: Payload, state: dict, round_idx: int, party_id: int
    ) -> None:
        """Load what the server sent into `model` before local training."""
        model.load_state_dict(received["model"])

    def batch_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """The local loss of one batch and its named terms (floats) for metrics."""
        ce = F.cross_entropy(model(x).logits, y)
        return ce, {"ce": ce.detach()}

    def learning_rate(self, received: Payload) -> float:
        """The local learning rate of this training call (train_args.learning_rate by default)."""
        return self.train_args.learning_rate

    def before_step(self, model: nn.Module) -> None:
        """Called after backward(), before the optimiser step (e.g. to correct gradients)."""

    def after_step(self, model: nn.Module) -> None:
        """Called after each optimiser step."""

    def end_round(
        self, model: nn.Module, state: dict, round_idx: int, party_id: int, loader: Iterable
    ) -> None:
        """Update what the party keeps after local training (`loader` is the party's training data)."""

    def personal_state(self, state: dict) -> dict | None:
        """The entries of this party's model that are its own rather than the server's (None: none)."""
        return None

    def eval_state(self, received: Payload, state: dict) -> dict:
        """The full model state this party would predict with, given the server's full model."""
        personal = self.personal_state(state)
        return received["model"] if not personal else merge_states(received["model"], personal)

    def upload(self, model: nn.Module, state: dict, party_id: int) -> Payload:
        """What the party sends to the server."""
        return {"model": clone_state(model.state_dict()), "party_id": int(party_id)}

    # --- the batched form (train_args.parties_in_parallel > 1; see algorithms/batched.py) ---------
    # `start_round` must depend only on its arguments: the batched path calls it once per party to
    # read the starting model and context, and again before `end_round` / `upload`.
    def batched_context(
        self, model: nn.Module, received: Payload, state: dict, round_idx: int, party_id: int
    ) -> dict | None:
        """Called right after `start_round`: {"shared": {...}, "party": {...}}, the tensors (nested
        dicts / lists allowed) `functional_loss` and the batched hooks read, the same for every party
        or the party's own. None: this party cannot train batched this round (sequential instead)."""
        return {"shared": {}, "party": {}}

    def has_batched_form(self) -> bool:
        """Whether each sequential member this class overrides (`local_train`, `batch_loss`,
        `before_step`, `after_step`) has its batched counterpart defined at the same level or below;
        a subclass that changes the loss but not `functional_loss` trains sequentially."""
        cls = type(self)
        return all(issubclass(_defined_in(cls, b), _defined_in(cls, s)) for s, b in BATCHED_PAIRS)

    def functional_loss(
        self, net: Any, x: torch.Tensor, y: torch.Tensor, ctx: dict
    ) -> tuple[torch.Tensor, dict]:
        """One party's `batch_loss` inside the vmapped step: `net(x)` is the party's model,
        `net.params` its trainable parameters by name, `net.frozen(state, x)` an eval-mode model with
        weights `state`; `ctx` holds the shared and the party's context entries."""
        return self.batch_loss(net, x, y)

    def batched_before_step(self, params: dict, ctx: dict, rows: torch.Tensor | None) -> None:
        """`before_step` for stacked parameters [K, ...] (their .grad set); `ctx` the parties' stacked
        contexts; only the parties `rows` (None: all) step."""

    def batched_after_step(self, params: dict, ctx: dict, rows: torch.Tensor | None, lr: float) -> None:
        """`after_step` for stacked parameters, after the SGD step of the parties `rows`."""

    # --- the local training call ---------------------------------------------------------------
    def local_train(
        self,
        model: nn.Module,
        received: Payload,
        state: dict,
        loader: Iterable,
        device: torch.device,
        round_idx: int,
        party_id: int,
    ) -> dict[str, float]:
        """E local epochs of SGD on the party's data; returns mean loss terms over the batches.

        `loader` yields batches on `device` (loaders are built for the run's device, see
        `build_fedml_dataset`), and so does every loader derived from it in `end_round`.
        """
        model.to(device)
        self.start_round(model, received, state, round_idx, party_id)
        model.train()
        optimizer = make_optimizer(model, self.train_args, self.learning_rate(received))
        sums: dict[str, torch.Tensor] = {}
        batches = 0
        for _ in range(self.train_args.epochs):
            for x, y in loader:
                optimizer.zero_grad(set_to_none=True)
                loss, terms = self.batch_loss(model, x, y)
                loss.backward()
                self.before_step(model)
                optimizer.step()
                self.after_step(model)
                terms["loss"] = loss.detach()
                for key, value in terms.items():
                    sums[key] = sums[key] + value if key in sums else value.clone()
                batches += 1
        self.steps = batches
        self.end_round(model, state, round_idx, party_id, loader)
        return {k: float(v) / max(batches, 1) for k, v in sums.items()}


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
    sample-weighted average). A server that averages nothing sets `averages = False`, and then a
    robust rule is a config error."""

    averages: ClassVar[bool] = True

    def __init__(self, options: Any, server: ServerArgs, train: TrainArgs, seed: int = 0) -> None:
        self.options = options
        self.train_args = train
        self.seed = seed
        self.round_idx = 0
        self.trainable: list[
            str
        ] = []  # the model's trainable parameters by state-dict name (the aggregator's)
        self.momentum = (
            ServerMomentum(server.server_momentum, server.server_momentum_style, server.server_lr)
            if server.server_momentum > 0 or server.server_lr != 1.0
            else None
        )
        self.mean = robust_mean(server)

    def setup(self, global_state: OrderedDict) -> OrderedDict:
        """Called once with the initial global state; may validate it or replace it (e.g. a checkpoint)."""
        return global_state

    def upload_spec(self, global_state: OrderedDict, party_id: int) -> dict:
        """What party `party_id`'s upload must hold this round, exactly (`core.validate.upload_problem`:
        tensors by name, shape and dtype, other fields by value): every entry of the global model and
        the party's id. The server refuses an upload that differs in any of them."""
        return {"model": global_state, "party_id": int(party_id)}

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
        averaged = self.combine(global_state, uploads)
        self.round_idx += 1
        if self.momentum is None:
            return averaged
        return self.momentum.step(global_state, averaged)

    def state(self) -> dict:
        """What the server keeps across rounds, for checkpoints (tensors and JSON values).
        Subclasses that keep more extend it and `load_state`."""
        velocity = self.momentum.velocity if self.momentum is not None else {}
        return {"round_idx": self.round_idx, "velocity": dict(velocity)}

    def load_state(self, state: dict) -> None:
        """Restore what `state()` returned (after `setup`)."""
        self.round_idx = int(state["round_idx"])
        if self.momentum is not None:
            self.momentum.velocity = dict(state["velocity"])

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
        acc, loss = new_test(model, states, test_global, device, "average")
        return {"new_test_acc": acc, "new_test_loss": loss}

    def party_figures(self) -> PartyFigures | None:
        """Figures that need every party's own model beside every party's test split, which only the
        standalone simulation holds (None: none; its options name them in `standalone_only`)."""
        return None

    def models_to_evaluate(self, global_state: OrderedDict) -> dict[str, OrderedDict]:
        """Named states the server evaluates on the global test set."""
        return {"global": global_state}
