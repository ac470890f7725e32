"""Data parallelism inside one silo (FedML's hierarchical cross-silo): the processes of a silo's
group train its party together, each step's batch split across them. Pure PyTorch.

Every process of the group draws the same batch from the party's own random stream (the one the
one-process silo would draw), keeps its slice (`shard`: contiguous, sizes differing by at most one),
computes the algorithm's loss on it, scaled by its share of the batch, and the gradients are summed
over the group (`sum_grads`, an all-reduce): the sum is the gradient of the whole batch's mean loss,
which the one-process silo computes, so every process takes the same SGD step (the algorithm's step
hooks see the same gradients everywhere). The loss terms for the metrics are summed the same way.
BatchNorm takes the whole batch's statistics (`engine.sync_batchnorm`, `sync_batchnorm`).
The algorithm never knows: `engine.local` asks `current()` and the group is entered with `active`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class DataParallel:
    """This process's place in its silo's group (`rank` of `size`) and the group's process group."""

    rank: int
    size: int
    group: Any = None  # a torch.distributed ProcessGroup (None: the default group)
    sync_batchnorm: bool = True  # BatchNorm over the whole batch; False: each slice's (DDP's default)

    def shard(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
        """This process's slice of the batch (x [B, ...], y [B]) and its share of the batch, n_k / B."""
        total = int(y.shape[0])
        base, extra = divmod(total, self.size)
        start = self.rank * base + min(self.rank, extra)
        stop = start + base + (1 if self.rank < extra else 0)
        return x[start:stop], y[start:stop], (stop - start) / max(total, 1)

    def sum_grads(self, params: Mapping[str, torch.Tensor]) -> None:
        """Each parameter's gradient summed over the group, in place (zeros where there was none)."""
        import torch.distributed as dist

        grads = []
        for p in params.values():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.group)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def sum_terms(self, terms: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The loss terms (each already scaled by this process's share) summed over the group."""
        import torch.distributed as dist

        names = sorted(terms)
        flat = torch.stack([terms[n].detach().reshape(()).to(torch.float64) for n in names])
        dist.all_reduce(flat, group=self.group)
        return {n: flat[i].to(terms[n].dtype) for i, n in enumerate(names)}


_current: DataParallel | None = None


def current() -> DataParallel | None:
    """The group the local training of this process runs in, or None (one process)."""
    return _current


@contextlib.contextmanager
def active(group: DataParallel | None) -> Iterator[None]:
    """Local training inside runs data-parallel over `group` (None: alone)."""
    global _current
    before, _current = _current, group
    try:
        yield
    finally:
        _current = before
