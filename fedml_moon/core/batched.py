"""K parties' models as one: parameters, buffers and SGD state stacked along a leading dimension [K, ...].

A forward is `torch.func.functional_call` of one template module under `torch.func.vmap`, so each
party computes with its own weights and BatchNorm statistics on its own batch; summing the K losses
and calling backward gives every party its own gradient (the parties share no tensor that requires
grad). `StackedSGD.step` is `torch.optim.SGD`'s arithmetic (weight decay, momentum without dampening,
learning rate) applied only to the parties that stepped. Pure PyTorch.
"""

from __future__ import annotations

import copy
import os
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, vmap

Tensors = dict[str, torch.Tensor]


def stack_states(states: Sequence[Mapping[str, torch.Tensor]], names: Sequence[str]) -> Tensors:
    """{name: [K, ...]} from K state dicts (copies; the inputs are left alone)."""
    return {n: torch.stack([s[n].detach() for s in states]) for n in names}


def grad_layout(stacked: torch.Tensor) -> torch.Tensor:
    """A stacked matrix [K, out, in] stored as [K, in, out] transposed: the layout in which vmap's
    batched linear layer produces its weight gradient, so autograd need not transpose-copy it every
    step (tens of ms per step for a 512 x 784 layer of 10 parties). Other shapes are unchanged."""
    if stacked.dim() != 3:
        return stacked
    return stacked.transpose(1, 2).contiguous().transpose(1, 2)


def party_state(stacked: Mapping[str, torch.Tensor], k: int) -> OrderedDict:
    """Party k's slice of stacked tensors, as an independent state dict."""
    return OrderedDict((n, t[k].detach().clone()) for n, t in stacked.items())


def tree_map(fn: Callable[..., Any], *trees: Any) -> Any:
    """`fn` applied leaf by leaf across trees of the same structure (dicts, lists, tuples; tuples
    come back as lists); the first tree gives the structure."""
    first = trees[0]
    if isinstance(first, Mapping):
        return {k: tree_map(fn, *(t[k] for t in trees)) for k in first}
    if isinstance(first, list | tuple):
        return [tree_map(fn, *(t[i] for t in trees)) for i in range(len(first))]
    return fn(*trees)


def select(stacked: Any, idx: torch.Tensor | None) -> Any:
    """The rows `idx` of every stacked tensor in a tree (the tree itself when idx is None)."""
    if idx is None:
        return stacked
    return tree_map(
        lambda v: v.index_select(0, idx.to(v.device)) if isinstance(v, torch.Tensor) else v, stacked
    )


class StackedModel:
    """K copies of `template`'s architecture with their own weights, run as one vmapped module.

    Trainable parameters (`params`) are leaves that require grad; buffers and frozen parameters
    (`buffers`) are plain tensors that a train-mode forward updates in place (BatchNorm statistics).
    `frozen` runs an eval-mode copy with weights given per call (MOON's teachers)."""

    def __init__(self, template: nn.Module, states: Sequence[Mapping[str, torch.Tensor]]) -> None:
        self.student = template.train()
        self.teacher = copy.deepcopy(template).eval()
        trainable = [n for n, p in template.named_parameters() if p.requires_grad]
        rest = [n for n in states[0] if n not in set(trainable)]
        stacked = stack_states(states, trainable)
        self.params = {n: grad_layout(t).requires_grad_(True) for n, t in stacked.items()}
        self.buffers = stack_states(states, rest)
        self.k = len(states)

    @property
    def params_device(self) -> torch.device:
        return next(iter(self.params.values())).device

    def state(self, k: int) -> OrderedDict:
        """Party k's full state dict (parameters and buffers)."""
        return OrderedDict(**party_state(self.params, k), **party_state(self.buffers, k))

    def forward(self, params: Tensors, buffers: Tensors, x: torch.Tensor) -> Any:
        """The student's output for one party's weights (called inside vmap)."""
        return functional_call(self.student, {**params, **buffers}, (x,))

    def frozen(self, state: Mapping[str, torch.Tensor], x: torch.Tensor) -> Any:
        """The eval-mode output of a model with weights `state` (one party's, inside vmap)."""
        with torch.no_grad():
            return functional_call(self.teacher, dict(state), (x,))


def vmapped(fn: Callable, in_dims: tuple) -> Callable:
    """torch.func.vmap with randomness that differs per party (dropout would)."""
    return vmap(fn, in_dims=in_dims, randomness="different")


class StackedSGD:
    """`torch.optim.SGD(lr, momentum, weight_decay)` (no dampening, no Nesterov) over stacked
    parameters; a step touches only the parties in `active`. A new optimiser per local training call,
    as `make_optimizer`: the momentum buffer starts at zero, which gives SGD's first step
    (buf = grad) exactly."""

    def __init__(self, params: Tensors, lr: float, momentum: float, weight_decay: float) -> None:
        self.params, self.lr, self.momentum, self.weight_decay = params, lr, momentum, weight_decay
        self.bufs = {n: torch.zeros_like(p) for n, p in params.items()} if momentum else {}

    @torch.no_grad()
    def step(self, active: torch.Tensor | None = None) -> None:
        """One step for the parties `active` (a LongTensor of rows; None: all); clears the gradients."""
        for n, p in self.params.items():
            if p.grad is None:
                continue
            if active is None:
                self._update(p, p.grad, self.bufs.get(n))
            else:
                sub_p, sub_g = p.index_select(0, active), p.grad.index_select(0, active)
                buf = self.bufs[n].index_select(0, active) if self.momentum else None
                self._update(sub_p, sub_g, buf)
                p.index_copy_(0, active, sub_p)
                if buf is not None:
                    self.bufs[n].index_copy_(0, active, buf)
            p.grad = None

    def _update(self, p: torch.Tensor, grad: torch.Tensor, buf: torch.Tensor | None) -> None:
        d_p = grad.add_(p, alpha=self.weight_decay) if self.weight_decay else grad  # grad is spent
        if buf is not None:
            buf.mul_(self.momentum).add_(d_p)
            d_p = buf
        p.add_(d_p, alpha=-self.lr)


def cuda_graph(fn: Callable[[], None], warmup: Callable[[], None], device: torch.device) -> Any:
    """`fn` captured as a `torch.cuda.CUDAGraph` (run it with `.replay()`). `warmup` runs three times
    on a side stream first, as capture requires (cuDNN picks its kernels, autograd and the caching
    allocator set up their buffers); it must leave the training state as it found it."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(3):
            warmup()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def activation_bytes(model: nn.Module, batch_shape: tuple[int, ...]) -> int:
    """Bytes autograd saves in one training forward of a batch of `batch_shape`: counted on a copy on
    PyTorch's `meta` device (shapes without arithmetic, so it costs nothing and needs no GPU)."""
    probe = copy.deepcopy(model).to("meta").train()
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        probe(torch.zeros(batch_shape, device="meta"))
    return total


def free_memory(device: torch.device) -> int:
    """Free bytes on `device`: CUDA's free memory, or the host's available memory."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def auto_parties(
    model: nn.Module, batch_shape: tuple[int, ...], device: torch.device, most: int, free: int | None = None
) -> int:
    """How many parties to train together: as many as the round has (`most`) while their estimated
    footprint stays within 80 % of the free memory (`free`, default the device's). Per party: 8 model
    copies (weights, gradients, momentum, the starting state, MOON's two teachers, SCAFFOLD's or
    FedProx's terms) and 1.25 times one batch's saved activations (the student's; the teachers run
    without autograd). For ten stacked ResNet-50 parties at batch 64, 32 x 32 (2.6 GB of saved
    activations and 94 MB of state each) that is 40 GB, where an H100 run took 33 GB; an
    out-of-memory error is retried with fewer (`engine.parties.PartyRunner`)."""
    model_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    per_party = 8 * model_bytes + activation_bytes(model, batch_shape) * 5 // 4
    free = free_memory(device) if free is None else free
    return max(1, min(most, free * 4 // 5 // max(per_party, 1)))


RANDOM_FORWARD = (
    "this network draws random numbers in its training forward (dropout, stochastic depth), and parties "
    "trained together cannot each draw what they would alone"
)


def draws_random(model: nn.Module, input_shape: tuple[int, ...], device: torch.device) -> bool:
    """Whether a training-mode forward of `model` (a copy, on two zero inputs of `input_shape`)
    moves torch's random state: dropout or stochastic depth. The random state is restored."""
    return _moves_random(copy.deepcopy(model).to(device), input_shape, device)


def _moves_random(template: nn.Module, input_shape: tuple[int, ...], device: torch.device) -> bool:
    """`draws_random` on `template` itself (its BatchNorm statistics move)."""
    cuda = device.type == "cuda"

    def state() -> list[torch.Tensor]:
        return [torch.random.get_rng_state(), *([torch.cuda.get_rng_state(device)] if cuda else [])]

    with torch.random.fork_rng(devices=[device] if cuda else []), torch.no_grad():
        before = state()
        template.train()(torch.zeros(2, *input_shape, device=device))
        return any(not torch.equal(a, b) for a, b in zip(before, state(), strict=True))


def stacking_error(model: nn.Module, input_shape: tuple[int, ...], device: torch.device) -> str | None:
    """Why two copies of `model` cannot train stacked, or None when they can: a network that draws
    random numbers in its forward (`draws_random`), or one that a vmapped forward and backward (of
    two zero inputs of `input_shape` each, on `device`) fails, e.g. one that reads a tensor's value.
    The random state and `model` are left as they were."""
    template = copy.deepcopy(model).to(device)  # one copy for both tries
    if _moves_random(template, input_shape, device):
        return RANDOM_FORWARD
    template.load_state_dict(model.state_dict())  # the statistics its forward moved, as they were
    state = template.state_dict()
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        try:
            net = StackedModel(template, [state, state])
            x = torch.zeros(2, 2, *input_shape, device=device)
            out = vmapped(net.forward, (0, 0, 0))(net.params, net.buffers, x)
            sum(o.float().sum() for o in out).backward()
        except Exception as err:  # the error torch.func gives says what the network does
            return f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
    return None
