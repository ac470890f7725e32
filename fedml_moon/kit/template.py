"""newalgo: a fedml_moon algorithm, as `fedml-moon new newalgo` wrote it.

As written it is FedAvg with label smoothing (`label_smoothing`, 0 by default: plain FedAvg), and it
passes `fedml-moon check newalgo --cf newalgo.yaml`. Every hook of both sides is here with what the
default does; change the ones your algorithm needs and delete the others (each falls back to the
same default). The contract: fedml_moon/algorithms/base.py; the tutorial "Write an algorithm".
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from fedml_moon.algorithms.base import (
    ClientAlgorithm,
    Context,
    LocalResult,
    Net,
    PartyRound,
    Payload,
    ServerAlgorithm,
)
from fedml_moon.config.schema import require
from fedml_moon.core.aggregation import clone_state
from fedml_moon.privacy.sums import UPDATE, Sums
from fedml_moon.registry import AlgorithmSpec


@dataclass
class NewAlgoOptions:
    """The config's `algorithm_args`: one field per option, each with a docstring (it is the
    option's entry in `fedml-moon config algorithm_args`) and a check of its values."""

    label_smoothing: float = 0.0
    """label smoothing of the cross-entropy, in [0, 1); 0 is plain cross-entropy (FedAvg)"""

    def check(self) -> None:
        require(0 <= self.label_smoothing < 1, "algorithm_args.label_smoothing", "must be in [0, 1)")


class NewAlgoClient(ClientAlgorithm):
    """The party side. The engine runs it for one party on the model itself or for several stacked
    (torch.func.vmap): write `loss` and the step hooks as functions of their arguments, with no
    Python `if` on a tensor's value (use torch.where), and keep nothing of a round on `self`."""

    name = "newalgo"
    terms = ("ce",)  # the named terms `loss` returns: the training metrics a party reports
    # personalized = True: each party predicts with its own model (`personal_state` names its entries)

    def context(self, r: PartyRound) -> Context:
        """Before the first step. `r.received`: what the server sent (`NewAlgoServer.download`);
        `r.state`: what this party kept from its earlier rounds; `r.round_idx`, `r.party`,
        `r.trainable`. Returns the model to start from, the learning rate and what `loss` reads:
        `shared` (equal for every party: the server's values) and `party` (this party's own
        tensors)."""
        return Context(r.received["model"], self.train_args.learning_rate, shared={}, party={})

    def loss(self, net: Net, x: torch.Tensor, y: torch.Tensor, ctx: dict) -> tuple[torch.Tensor, dict]:
        """One batch, x [B, ...], y [B]: the loss and its named terms (detached). `net(x)` gives
        (h, z, logits): the encoder's representation, the projection and the classifier's output;
        `net.params` the trainable parameters by name; `net.frozen(state, x)` a teacher's output."""
        ce = F.cross_entropy(net(x).logits, y, label_smoothing=self.options.label_smoothing)
        return ce, {"ce": ce.detach()}

    def before_step(self, params: dict, grads: dict, ctx: dict, rows: torch.Tensor | None) -> None:
        """After backward, before the SGD step: change `grads` in place (tensors [K, ...], K parties
        stacked, K = 1 for one; only the rows `rows` step, None: all). Nothing by default."""

    def after_step(self, params: dict, ctx: dict, rows: torch.Tensor | None, lr: float) -> None:
        """After the SGD step: change `params` in place (as `before_step`). Nothing by default."""

    def finish(self, r: PartyRound, ctx: Context, done: LocalResult) -> Payload:
        """After the last step: update what the party keeps (`r.state`, in place) and return its
        upload. `done.final` is the trained model's state, `done.model` a module holding it,
        `done.batches()` the party's data in a fixed order, `done.num_classes` the classes.
        Every field the upload holds is declared in `NewAlgoServer.upload_spec`."""
        return {"model": clone_state(done.final), "party_id": int(r.party)}

    def personal_state(self, state: dict) -> dict | None:
        """The entries of the party's model that are its own, not the server's (None: none)."""
        return None


class NewAlgoServer(ServerAlgorithm):
    """The server side. What it keeps across rounds goes into `state` and comes back in
    `load_state` (a stopped run resumes from them); under `privacy_args` (secure aggregation, DP),
    `train_args.stream_uploads` and `server_args.aggregation: buffered` it learns only the sums of
    what `summed` names, and `aggregate_sums` must make the same new state from them as `aggregate`
    from the uploads, whatever number of parties they hold (a buffer may hold one stale update).
    A server step that does not fit a buffered, staleness-discounted sum sets `not_buffered` to the
    reason instead; `fedml-moon check` tries the rest buffered."""

    # each upload field but the party's id: "update" (the weighted mean change from what was sent)
    # or "sum" (summed as it is); a field not named here is a config error under privacy_args
    summed: ClassVar[dict[str, str]] = {"model": UPDATE}
    # ServerAlgorithm declares the rest a server may set: averages = False (it averages nothing),
    # not_buffered = "the reason", standalone_only(options) (settings the standalone run alone honours)

    def download(self, global_state: OrderedDict, party_id: int | None = None) -> Payload:
        """What the server sends a party: the global model (add what `context` reads)."""
        return super().download(global_state, party_id)

    def upload_spec(self, global_state: OrderedDict, party_id: int) -> dict:
        """What party `party_id`'s upload must hold, exactly: tensors by name, shape and dtype (a
        tensor on the "meta" device stands for one, e.g. torch.empty(10, 256, device="meta")),
        other fields by value. The server refuses any upload that differs."""
        return super().upload_spec(global_state, party_id)

    def aggregate(self, global_state: OrderedDict, uploads: list[tuple[float, Payload]]) -> OrderedDict:
        """The new global state from (samples, upload) pairs: the sample-weighted average of the
        models, or `server_args.robust_aggregation`'s rule (`self.mean`), then server momentum."""
        return super().aggregate(global_state, uploads)

    def aggregate_sums(self, global_state: OrderedDict, sums: Sums) -> OrderedDict:
        """The same from the round's sums: `sums.fields[name]` for each field of `summed` (float64),
        `sums.weight` the sum of the parties' weights, `sums.count` the parties summed."""
        return super().aggregate_sums(global_state, sums)

    def state(self) -> dict:
        """What the server keeps across rounds (tensors and JSON values), for checkpoints."""
        return super().state()

    def load_state(self, state: dict) -> None:
        """Restore what `state()` returned."""
        super().load_state(state)


def spec() -> AlgorithmSpec:
    """The algorithm as the registry knows it (the package's entry point and `common_args.plugins`
    name this function)."""
    return AlgorithmSpec(
        "newalgo", NewAlgoClient, NewAlgoServer, NewAlgoOptions, "FedAvg with label smoothing"
    )
