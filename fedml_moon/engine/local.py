"""Parties' local rounds through any algorithm's one form (`algorithms.base.ClientAlgorithm`).

For each party the algorithm's `context` gives the starting model, the learning rate and what the
loss reads; then E epochs of SGD steps (`loss`, backward, `before_step`, the step, `after_step`);
then `finish` updates what the party keeps and makes its upload. One party trains on the model
itself (`torch.optim.SGD`, no vmap: this module); several train stacked in lockstep
(`engine.batched`), each on its own batches from its own loader, so both ways run the same arithmetic
on the same batches. Pure PyTorch.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fedml_moon.algorithms.base import (
    ClientAlgorithm,
    Context,
    LocalResult,
    PartyRound,
    Payload,
    make_optimizer,
)
from fedml_moon.core.batched import tree_map
from fedml_moon.core.seeds import own_random
from fedml_moon.engine import data_parallel, sync_batchnorm
from fedml_moon.engine.graphed import PartyGraph
from fedml_moon.engine.pace import graphs_on
from fedml_moon.engine.precision import forward_precision, summable


@dataclass
class PartyJob:
    """One party's local round: its round, its training data, and (once trained) its context, final
    model state (None: the model holds it), number of steps and running sums of the loss terms."""

    round: PartyRound
    loader: Iterable
    ctx: Context | None = None
    final: dict | None = None
    steps: int = 0
    sums: dict = field(default_factory=dict)

    @property
    def party(self) -> int:
        return self.round.party


def to_device(tree: Any, device: torch.device) -> Any:
    """Every tensor of a tree (dicts, lists) on `device`."""
    return tree_map(lambda v: v.to(device) if isinstance(v, torch.Tensor) else v, tree)


def loss_context(shared: Mapping, party: Mapping) -> dict:
    """What `loss` reads: the shared and the party entries under their keys."""
    both = set(shared) & set(party)
    if both:
        raise ValueError(f"a context's shared and party entries share the keys {sorted(both)}; rename one")
    return {**shared, **party}


def stack_contexts(contexts: list[Any]) -> Any:
    """The parties' contexts stacked: each tensor [K, ...] (K = 1 for one party), other values the first's."""
    return tree_map(lambda *vs: torch.stack(vs) if isinstance(vs[0], torch.Tensor) else vs[0], *contexts)


def overrides(algorithm: ClientAlgorithm, member: str) -> bool:
    """Whether the algorithm defines `member` itself (the engine skips what a hook does not need)."""
    return getattr(type(algorithm), member) is not getattr(ClientAlgorithm, member)


class ModuleNet:
    """One party's network on the sequential path: the module itself, and its teachers as eval-mode
    copies loaded once per state (a state is the same object at every step of a round)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self._teachers: dict[int, tuple[Mapping, nn.Module]] = {}

    def __call__(self, x: torch.Tensor) -> Any:
        return self.model(x)

    @torch.no_grad()
    def frozen(self, state: Mapping[str, torch.Tensor], x: torch.Tensor) -> Any:
        """The eval-mode output of the model's architecture with the weights `state`."""
        if id(state) not in self._teachers:
            teacher = copy.deepcopy(self.model).eval().requires_grad_(False)
            teacher.load_state_dict(state)
            self._teachers[id(state)] = (state, teacher)  # the state is held, so its id stays its own
        return self._teachers[id(state)][1](x)


def prepare(algorithm: ClientAlgorithm, job: PartyJob, device: torch.device) -> None:
    """The party's context, its starting state and party entries on `device` (the shared entries
    move once per group)."""
    ctx = algorithm.context(job.round)
    job.ctx = Context(to_device(ctx.start, device), ctx.lr, ctx.shared, to_device(ctx.party, device))


def train_one(algorithm: ClientAlgorithm, model: nn.Module, job: PartyJob, device: torch.device) -> None:
    """E local epochs of one party on `model` itself; the step hooks see its parameters, gradients
    and party entries as [1, ...] views. The network's own draws (dropout) come from the party's
    and round's stream (`seeds.own_random`)."""
    with own_random(algorithm.seed, job.round.round_idx, job.party, device):
        for _ in party_steps(algorithm, model, job, device):
            pass


def party_steps(
    algorithm: ClientAlgorithm, model: nn.Module, job: PartyJob, device: torch.device
) -> Iterator[None]:
    """`train_one` a step at a time: yields after each SGD step (`engine.streams` interleaves
    parties this way). With `train_args.cuda_graphs` on the device, steps of full batches are
    replayed from a CUDA graph (`engine.graphed`; not in a silo's data-parallel group)."""
    ctx = job.ctx
    model.load_state_dict(ctx.start)
    model.train()
    net = ModuleNet(model)
    optimizer = make_optimizer(model, algorithm.train_args, ctx.lr)
    both = loss_context(to_device(ctx.shared, device), ctx.party)
    stacked = stack_contexts([ctx.party])
    params = {n: p.detach().unsqueeze(0) for n, p in net.params.items()}
    before, after = overrides(algorithm, "before_step"), overrides(algorithm, "after_step")
    train = algorithm.train_args
    sums: dict[str, torch.Tensor] = {}

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        optimizer.zero_grad(set_to_none=True)
        terms = backward(algorithm, net, x, y, both, train.precision, device)
        if before:
            algorithm.before_step(
                params, {n: g.unsqueeze(0) for n, g in filled_grads(net.params).items()}, stacked, None
            )
        optimizer.step()
        if after:
            algorithm.after_step(params, stacked, None, ctx.lr)
        for key, value in terms.items():
            value = summable(value)
            if key in sums:
                sums[key].add_(value)
            else:
                sums[key] = value.clone()

    graphed = graphs_on(train.cuda_graphs, device) and data_parallel.current() is None
    run = PartyGraph(step, train.batch_size, device) if graphed else step
    for _ in range(train.epochs):
        for x, y in job.loader:
            run(x, y)
            job.steps += 1
            yield
    job.final, job.sums = None, sums  # the model holds it


def backward(
    algorithm: ClientAlgorithm,
    net: ModuleNet,
    x: torch.Tensor,
    y: torch.Tensor,
    ctx: dict,
    precision: str,
    device: torch.device,
) -> dict[str, torch.Tensor]:
    """One batch's loss, backward; returns its terms and "loss" (detached). In a silo's data-parallel
    group (`engine.data_parallel`) this process takes its slice of the batch, its loss is scaled by
    its share, and the gradients and terms are summed over the group: the whole batch's."""
    group = data_parallel.current()
    if group is None:
        with forward_precision(precision, device):
            loss, terms = algorithm.loss(net, x, y, ctx)
        loss.backward()
        return {**terms, "loss": loss.detach()}
    if group.sync_batchnorm and y.shape[0] < group.size and sync_batchnorm.has_batchnorm(net.model):
        raise ValueError(
            f"a batch of {y.shape[0]} samples cannot be split over the silo's {group.size} processes with "
            "synchronised BatchNorm (each takes part in every batch's statistics): make "
            "train_args.batch_size and every party's samples at least the group's size"
        )
    x, y, share = group.shard(x, y)
    names = (*algorithm.terms, "loss")
    terms = {}
    if y.shape[0] > 0:  # else a batch smaller than the group: nothing here
        with forward_precision(precision, device):
            loss, terms = algorithm.loss(net, x, y, ctx)
        (loss * share).backward()
        terms = {**terms, "loss": loss.detach()}
    undeclared = sorted(set(terms) - set(names))
    if undeclared:
        raise ValueError(
            f"{type(algorithm).__name__}.loss returned the terms {undeclared}, which `terms` does not declare"
        )
    group.sum_grads(net.params)
    if not group.sync_batchnorm:
        sync_batchnorm.share_buffers(net.model, group.group)
    return group.sum_terms(
        {n: summable(terms[n]) * share if n in terms else torch.zeros((), device=device) for n in names}
    )


def filled_grads(params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each parameter's gradient (zeros, then kept on the parameter, where the loss did not reach
    it): what `before_step` may change in place, for one party or K stacked."""
    for p in params.values():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    return {n: p.grad for n, p in params.items()}


def finish(algorithm: ClientAlgorithm, model: nn.Module, job: PartyJob) -> tuple[dict[str, float], Payload]:
    """The party's metrics (each loss term's mean over its steps) and its upload (`finish`)."""
    if job.final is not None:
        model.load_state_dict(job.final)
    result = LocalResult(model.state_dict(), job.steps, model, job.loader)
    upload = algorithm.finish(job.round, job.ctx, result)
    undeclared = sorted(set(job.sums) - {"loss"} - set(algorithm.terms))
    if undeclared:
        raise ValueError(
            f"{type(algorithm).__name__}.loss returned the terms {undeclared}, which its `terms` "
            f"{algorithm.terms} does not declare: add them to `terms` (the server records declared ones only)"
        )
    metrics = {k: float(v) / max(job.steps, 1) for k, v in job.sums.items()}
    return metrics, upload
