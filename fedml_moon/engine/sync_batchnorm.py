"""BatchNorm in a silo's data-parallel group (`engine.data_parallel`). Pure PyTorch.

A group splits each batch, and BatchNorm's statistics over a slice are not the batch's. With
`sync` (the default, `device_args.sync_batchnorm`) each BatchNorm layer of a group's model takes
its mean and variance over the whole batch: per-channel sums all-reduced across the group, twice
(the sum, then the sum of squared deviations from the batch mean, as a two-pass variance), with
the gradient flowing back through the all-reduce, so the group trains what the one-process silo
trains (what torch.nn.SyncBatchNorm computes; that module takes CUDA inputs only, this one runs
under gloo on CPUs and nccl on GPUs alike). Without `sync`, DDP's default: each process normalises
with its slice's statistics and the running statistics are the leader's (broadcast after every
step, as DDP broadcasts buffers before every forward).

The model's BatchNorm modules become `GroupBatchNorm` subclasses of their own classes (`convert`):
the same parameters, buffers and state-dict keys; outside a group, or in eval mode, they are the
plain modules.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from fedml_moon.engine import data_parallel


class _GroupSum(torch.autograd.Function):
    """An all-reduce (sum) over the group whose backward is the all-reduce of the gradients."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, group: Any) -> torch.Tensor:
        import torch.distributed as dist

        ctx.group = group
        out = tensor.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _GroupSum.apply(grad, ctx.group), None


def group_sum(tensor: torch.Tensor, group: Any = None) -> torch.Tensor:
    """`tensor` summed over the process group (every process gets the sum), differentiably."""
    return _GroupSum.apply(tensor, group)


def synced_batch_norm(bn: _BatchNorm, x: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Training-mode batch norm of x [N, C, *] (this process's slice) with the statistics of the
    whole batch across `group`: mean = sum x / n, var = sum (x - mean)^2 / n (biased, for
    normalising; the running variance takes the unbiased n / (n - 1) form, as BatchNorm does)."""
    dims = [0, *range(2, x.dim())]
    shape = [1, -1] + [1] * (x.dim() - 2)
    count = torch.tensor([x.numel() / max(x.shape[1], 1)], dtype=x.dtype, device=x.device)
    totals = group_sum(torch.cat([x.sum(dims), count]), group)
    n = totals[-1]
    mean = totals[:-1] / n
    centered = x - mean.view(shape)
    var = group_sum((centered * centered).sum(dims), group) / n
    out = centered * torch.rsqrt(var + bn.eps).view(shape)
    if bn.affine:
        out = out * bn.weight.view(shape) + bn.bias.view(shape)
    if bn.track_running_stats and bn.running_mean is not None:
        _track(bn, mean.detach(), var.detach(), float(n.item()))
    return out


def _track(bn: _BatchNorm, mean: torch.Tensor, var: torch.Tensor, n: float) -> None:
    """BatchNorm's running statistics, updated as its own training forward updates them."""
    with torch.no_grad():
        bn.num_batches_tracked.add_(1)
        factor = 1.0 / float(bn.num_batches_tracked) if bn.momentum is None else bn.momentum
        unbiased = var * (n / (n - 1)) if n > 1 else var
        bn.running_mean.mul_(1 - factor).add_(mean.to(bn.running_mean.dtype), alpha=factor)
        bn.running_var.mul_(1 - factor).add_(unbiased.to(bn.running_var.dtype), alpha=factor)


class GroupBatchNorm:
    """Mixed into a BatchNorm class by `convert`: whole-batch statistics inside a synchronised group."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        group = data_parallel.current()
        if group is None or group.size == 1 or not self.training or not group.sync_batchnorm:
            return super().forward(x)  # type: ignore[misc]
        self._check_input_dim(x)  # type: ignore[attr-defined]
        return synced_batch_norm(self, x, group.group)  # type: ignore[arg-type]


_CLASSES: dict[type, type] = {}


def convert(model: nn.Module) -> int:
    """Make every BatchNorm module of `model` a GroupBatchNorm of its own class, in place; how many."""
    count = 0
    for module in model.modules():
        if isinstance(module, _BatchNorm) and not isinstance(module, GroupBatchNorm):
            cls = type(module)
            if cls not in _CLASSES:
                _CLASSES[cls] = type(f"Group{cls.__name__}", (GroupBatchNorm, cls), {})
            module.__class__ = _CLASSES[cls]
            count += 1
    return count


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, _BatchNorm) for m in model.modules())


def share_buffers(model: nn.Module, group: Any = None) -> None:
    """Every process takes the leader's BatchNorm running statistics (without `sync`: DDP's
    broadcast of buffers)."""
    import torch.distributed as dist

    for module in model.modules():
        if isinstance(module, _BatchNorm) and module.running_mean is not None:
            for buffer in (module.running_mean, module.running_var, module.num_batches_tracked):
                dist.broadcast(buffer, src=0, group=group)
