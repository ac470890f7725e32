"""Local rounds of several parties at once through any algorithm's one form (pure PyTorch).

The parties' models are stacked (`core.batched.StackedModel`) and step in lockstep: at step s every
party that still has a batch draws it from its own loader (its own random stream, so the batches and
their order are the sequential path's), one vmapped forward of the algorithm's `loss` over all of
them, one backward, the step hooks on the stacked tensors and one masked SGD step. A party with fewer
batches stops stepping. Parties whose contexts differ in structure (e.g. MOON pools of different
lengths), in shared values or in learning rate train in separate groups. `train_parties` is the
entry: one party trains on the model itself (`engine.local`), several here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fedml_moon.algorithms.base import ClientAlgorithm, PartyRound, Payload
from fedml_moon.core.batched import StackedModel, StackedSGD, cuda_graph, select, vmapped
from fedml_moon.engine.grouping import groups, item_size, make, stream
from fedml_moon.engine.local import (
    PartyJob,
    filled_grads,
    finish,
    loss_context,
    overrides,
    prepare,
    stack_contexts,
    to_device,
    train_one,
)
from fedml_moon.engine.pace import graphs_on, together
from fedml_moon.engine.precision import BF16_STACKED, forward_precision, summable, training_precision
from fedml_moon.engine.streams import train_streams

log = logging.getLogger(__name__)


class PartyNet:
    """One party's model inside the vmapped step: callable like the module, with its parameters."""

    def __init__(self, stacked: StackedModel, params: dict, buffers: dict) -> None:
        self.stacked, self.params, self.buffers = stacked, params, buffers

    def __call__(self, x: torch.Tensor) -> Any:
        return self.stacked.forward(self.params, self.buffers, x)

    def frozen(self, state: dict, x: torch.Tensor) -> Any:
        """The eval-mode output of a model with weights `state` (a teacher)."""
        return self.stacked.frozen(state, x)


@dataclass
class _Group:
    """What a step of a group of stacked parties needs; `sums` holds each party's running sums of
    its loss terms, [K] per term."""

    algorithm: ClientAlgorithm
    stacked: StackedModel
    sgd: StackedSGD
    step: Callable
    party_ctx: Any
    shared: Any
    sums: dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """What every step's hooks reuse: which the algorithm has, and the stacked parameters detached
        (views of the tensors the SGD step updates in place)."""
        self.before = overrides(self.algorithm, "before_step")
        self.after = overrides(self.algorithm, "after_step")
        self.detached = {n: p.detach() for n, p in self.stacked.params.items()}
        self.device = self.stacked.params_device
        self.precision = self.algorithm.train_args.precision
        self._rows: dict[tuple[int, ...], torch.Tensor] = {}

    def forward(self, *args: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The vmapped loss of the stacked parties, in the run's precision."""
        with forward_precision(self.precision, self.device):
            return self.step(*args)

    def rows(self, rows: list[int]) -> torch.Tensor:
        """`rows` as an index tensor on the parameters' device, made once per set of rows (a copy to a
        GPU waits for it, so the step loop must not make one per step)."""
        key = tuple(rows)
        if key not in self._rows:
            self._rows[key] = torch.tensor(rows, dtype=torch.long, device=self.stacked.params_device)
        return self._rows[key]


def train_group(
    algorithm: ClientAlgorithm, model: nn.Module, jobs: list[PartyJob], device: torch.device
) -> None:
    """E local epochs of the group's parties in lockstep; fills each job's final model, steps, sums.
    With `train_args.cuda_graphs` the steps of full batches go through one `MaskedStep`."""
    train = algorithm.train_args
    stacked = StackedModel(model, [job.ctx.start for job in jobs])

    def one_party(params: dict, buffers: dict, x: torch.Tensor, y: torch.Tensor, ctx: dict, common: dict):
        return algorithm.loss(PartyNet(stacked, params, buffers), x, y, loss_context(common, ctx))

    g = _Group(
        algorithm,
        stacked,
        StackedSGD(stacked.params, jobs[0].ctx.lr, train.momentum, train.weight_decay),
        vmapped(one_party, (0, 0, 0, 0, 0, None)),
        stack_contexts([job.ctx.party for job in jobs]),
        to_device(jobs[0].ctx.shared, device),
    )
    masked = MaskedStep(g, device) if graphs_on(train.cuda_graphs, device) else None
    loaders = [job.loader for job in jobs]
    streams = [stream(loader, train.epochs) for loader in loaders]
    while True:
        items = [next(s, None) for s in streams]
        ready = [k for k, item in enumerate(items) if item is not None]
        if not ready:
            break
        for k in ready:
            jobs[k].steps += 1
        if masked is not None:
            ready = masked.take(loaders, items, ready, train.batch_size)
        for size in sorted({item_size(items[k]) for k in ready}):
            rows = [k for k in ready if item_size(items[k]) == size]
            _step(g, *make(loaders, items, rows), rows)
    for k, job in enumerate(jobs):
        job.final = stacked.state(k)
        job.sums = {key: s[k] for key, s in g.sums.items()}


def _step(g: _Group, x: torch.Tensor, y: torch.Tensor, rows: list[int]) -> None:
    """One SGD step of the parties `rows` on their batches x [R, B, ...], y [R, B]."""
    stacked = g.stacked
    everyone = len(rows) == stacked.k
    idx = None if everyone else g.rows(rows)
    params, buffers = select(stacked.params, idx), select(stacked.buffers, idx)
    loss, terms = g.forward(params, buffers, x, y, select(g.party_ctx, idx), g.shared)
    loss.sum().backward()
    if not everyone:
        with torch.no_grad():
            for n, b in buffers.items():
                stacked.buffers[n].index_copy_(0, idx, b)
    _hooks(g, idx)
    _accumulate(g, {**terms, "loss": loss.detach()}, idx)


def _hooks(g: _Group, idx: torch.Tensor | None) -> None:
    """The algorithm's step hooks around the SGD step of the rows `idx` (None: all)."""
    if g.before:
        g.algorithm.before_step(g.detached, filled_grads(g.stacked.params), g.party_ctx, idx)
    g.sgd.step(idx)
    if g.after:
        g.algorithm.after_step(g.detached, g.party_ctx, idx, g.sgd.lr)


def _accumulate(g: _Group, terms: dict[str, torch.Tensor], idx: torch.Tensor | None) -> None:
    """Adds the step's loss terms ([len(rows)] each) to the rows' running sums."""
    with torch.no_grad():
        for key, value in terms.items():
            value = summable(value)
            if key not in g.sums:
                g.sums[key] = torch.zeros(g.stacked.k, dtype=value.dtype, device=value.device)
            if idx is None:
                g.sums[key].add_(value)
            else:
                g.sums[key].index_add_(0, idx, value)


class MaskedStep:
    """One SGD step of every party of the group on static input tensors, of which only the rows in
    `mask` keep the result: the others get their parameters, momentum and buffers back (torch.where,
    so bit for bit). Fixed shapes and no host synchronisation, so on CUDA it is captured once as a
    CUDA graph and replayed at every step of full batches (`train_args.cuda_graphs`), which removes
    the per-kernel launch cost that dominates small models. Elsewhere it runs as it is (the same
    arithmetic, tested on a CPU). Batches of another size take the eager step."""

    def __init__(self, g: _Group, device: torch.device) -> None:
        self.g, self.device, self.graph = g, device, None
        self.state = [*g.stacked.params.values(), *g.sgd.bufs.values(), *g.stacked.buffers.values()]
        self.masks: dict[tuple[int, ...], torch.Tensor] = {}
        self.x = self.y = self.mask = torch.empty(0)

    def take(self, loaders: list, items: list, ready: list[int], size: int) -> list[int]:
        """Steps the parties of `ready` whose batch holds `size` samples; returns the others."""
        rows = [k for k in ready if item_size(items[k]) == size]
        if not rows:
            return ready
        self._inputs(*make(loaders, items, rows), rows)
        if self.graph is None and self.device.type == "cuda":
            self.mask.zero_()  # warm-up steps change nothing
            self.graph = cuda_graph(self._run, self._run, self.device)
        self.mask.copy_(self._mask(rows))
        if self.graph is not None:
            self.graph.replay()
        else:
            self._run()
        return [k for k in ready if k not in rows]

    def _inputs(self, x: torch.Tensor, y: torch.Tensor, rows: list[int]) -> None:
        """The rows' batches into the static inputs (all of them at once when every party steps)."""
        if self.mask.numel() == 0:
            k = self.g.stacked.k
            self.x, self.y = x.new_zeros((k, *x.shape[1:])), y.new_zeros((k, *y.shape[1:]))
            self.mask = torch.zeros(k, dtype=torch.bool, device=x.device)
        if len(rows) == self.g.stacked.k:
            self.x.copy_(x)
            self.y.copy_(y)
        else:
            idx = self.g.rows(rows).to(x.device)
            self.x.index_copy_(0, idx, x)
            self.y.index_copy_(0, idx, y)

    def _mask(self, rows: list[int]) -> torch.Tensor:
        if tuple(rows) not in self.masks:
            mask = torch.zeros(self.g.stacked.k, dtype=torch.bool)
            mask[rows] = True
            self.masks[tuple(rows)] = mask.to(self.mask.device)
        return self.masks[tuple(rows)]

    def _run(self) -> None:
        g = self.g
        saved = [t.detach().clone() for t in self.state]
        loss, terms = g.forward(g.stacked.params, g.stacked.buffers, self.x, self.y, g.party_ctx, g.shared)
        loss.sum().backward()
        _hooks(g, None)
        with torch.no_grad():
            for t, old in zip(self.state, saved, strict=True):
                t.copy_(torch.where(self.mask.view(-1, *[1] * (t.dim() - 1)), t, old))
            kept = {k: torch.where(self.mask, v, 0) for k, v in {**terms, "loss": loss.detach()}.items()}
        _accumulate(g, kept, None)


def train_parties(
    algorithm: ClientAlgorithm, model: nn.Module, jobs: list[PartyJob], device: torch.device
) -> list[tuple[dict[str, float], Payload]]:
    """The local rounds of `jobs`: one job on the model itself (`engine.local`), several stacked in
    groups or each on its own stream (`train_args.together`, `engine.streams`), with CUDA graphs
    where `train_args.cuda_graphs`; (metrics, upload) per job, in order."""
    precision, device = algorithm.train_args.precision, torch.device(device)
    form = together(algorithm.train_args, model, device)
    if precision == "bf16" and len(jobs) > 1 and form == "stacked":
        raise ValueError(BF16_STACKED)
    model.to(device)
    for job in jobs:
        prepare(algorithm, job, device)
    with training_precision(precision):
        if len(jobs) == 1:
            train_one(algorithm, model, jobs[0], device)
        elif form == "streams":
            train_streams(algorithm, model, jobs, device)
        else:
            for group in groups(jobs):
                train_group(algorithm, model, group, device)
    return [finish(algorithm, model, job) for job in jobs]


def train_party(
    algorithm: ClientAlgorithm,
    model: nn.Module,
    received: Payload,
    state: dict,
    loader: Iterable,
    device: torch.device,
    round_idx: int,
    party: int,
) -> tuple[dict[str, float], Payload]:
    """One party's local round without FedML: (metrics, upload); `state` is updated in place and
    `model` ends holding the trained weights."""
    trainable = tuple(n for n, p in model.named_parameters() if p.requires_grad)
    job = PartyJob(PartyRound(received, state, round_idx, party, trainable), loader)
    return train_parties(algorithm, model, [job], device)[0]


__all__ = ["PartyJob", "PartyNet", "train_parties", "train_party"]
