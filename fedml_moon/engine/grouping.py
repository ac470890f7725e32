"""What trains together in the batched path, and the stacked batches a step of it reads (pure PyTorch).

Jobs stack when their party contexts have the same structure, their shared contexts equal values and
their learning rates are equal (`groups`). A party's items are batch plans from its `PartyLoader`,
made into tensors for all the parties of a step at once (`make`), or the (x, y) batches of any other
iterable.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from fedml_moon.data.loader import PartyLoader, Plan, materialize
from fedml_moon.engine.local import PartyJob


def _key(tree: Any, leaf: Callable[[Any], Any]) -> Any:
    """A hashable image of `tree`: its structure with `leaf` of every leaf."""
    if isinstance(tree, dict):
        return tuple((k, _key(v, leaf)) for k, v in sorted(tree.items()))
    if isinstance(tree, list | tuple):
        return tuple(_key(v, leaf) for v in tree)
    return leaf(tree)


def _signature(leaf: Any) -> Any:
    """What must match for contexts to stack: shapes and dtypes of tensors, values of scalars."""
    return ("t", tuple(leaf.shape), leaf.dtype) if isinstance(leaf, torch.Tensor) else ("v", leaf)


def _same(a: Any, b: Any) -> bool:
    """Whether two shared contexts hold the same values: the same structure, scalars and tensors
    (shape, dtype, device and every element; the same object or two copies of it, e.g. one per
    party moved to the device)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        same_kind = a.shape == b.shape and a.dtype == b.dtype and a.device == b.device
        return a is b or (same_kind and bool(torch.equal(a, b)))
    return type(a) is type(b) and not isinstance(a, torch.Tensor) and a == b


def _epochs(loader: Iterable, epochs: int) -> Iterator:
    return itertools.chain.from_iterable(loader for _ in range(epochs))


def groups(jobs: list[PartyJob]) -> list[list[PartyJob]]:
    """Jobs that can stack: the same structure of the party context, equal shared contexts (by
    value: `_same`), the same lr; in the order the jobs come."""
    out: dict[Any, list[list[PartyJob]]] = {}
    for job in jobs:
        candidates = out.setdefault((_key(job.ctx.party, _signature), job.ctx.lr), [])
        group = next((g for g in candidates if _same(g[0].ctx.shared, job.ctx.shared)), None)
        if group is None:
            candidates.append([job])
        else:
            group.append(job)
    return [g for buckets in out.values() for g in buckets]


def stream(loader: Iterable, epochs: int) -> Iterator:
    """A party's items for `epochs` epochs: batch plans from a `PartyLoader` (made into tensors for
    all the step's parties at once, `make`), else its (x, y) batches."""
    if isinstance(loader, PartyLoader):
        return itertools.chain.from_iterable(loader.plans() for _ in range(epochs))
    return _epochs(loader, epochs)


def item_size(item: Any) -> int:
    """Samples in a stream item (a plan or an (x, y) batch)."""
    return int(item.idx.numel()) if isinstance(item, Plan) else int(item[1].shape[0])


def make(loaders: list, items: list, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The batches of the parties `rows`, one size, stacked: x [R, B, ...], y [R, B]."""
    if isinstance(items[rows[0]], Plan):
        return materialize([loaders[k] for k in rows], [items[k] for k in rows])
    return torch.stack([items[k][0] for k in rows]), torch.stack([items[k][1] for k in rows])
