"""`torch.optim.SGD` for a party's local round, without importing `torch._dynamo`.

`torch.optim.Optimizer` guards `add_param_group`, `zero_grad`, `state_dict` and `load_state_dict`
against TorchDynamo's tracing (`torch._disable_dynamo`), and `SGD.step` sets its grad mode around a
`torch._dynamo.graph_break()`. Outside `torch.compile` both only cost their first call an import of
`torch._dynamo`: about 1.2 s of a core, in every process that trains, on top of PyTorch's own import.
`EagerSGD` calls the same undecorated methods (their `__wrapped__`) in the same grad mode, so its
arithmetic is `torch.optim.SGD`'s bit for bit (tests/test_optim.py), and a process that trains with
it never imports `torch._dynamo`. Where a future PyTorch has no `__wrapped__` on them, each method is
`SGD`'s own. Under `torch.compile` the local round is traced with the optimizer's code inline, as a
subclass overriding these methods would be.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.optim import SGD, Optimizer

_RAW_ADD = getattr(Optimizer.add_param_group, "__wrapped__", None)
_RAW_ZERO = getattr(Optimizer.zero_grad, "__wrapped__", None)
_RAW_STEP = getattr(SGD.step, "__wrapped__", None)


class EagerSGD(SGD):
    """`torch.optim.SGD`, its guards against TorchDynamo left out (module docstring)."""

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if _RAW_ADD is None:
            super().add_param_group(param_group)
            return
        _RAW_ADD(self, param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if _RAW_ZERO is None:
            super().zero_grad(set_to_none)
            return
        _RAW_ZERO(self, set_to_none)

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        if _RAW_STEP is None:
            return super().step(closure)
        with torch.set_grad_enabled(self.defaults["differentiable"]):  # SGD.step's own grad mode
            return _RAW_STEP(self, closure)
