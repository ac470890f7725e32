"""`core.optim.EagerSGD`, the local rounds' optimizer: `torch.optim.SGD`'s arithmetic bit for bit,
its step hooks kept, and no import of `torch._dynamo` in a process that trains with it."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from fedml_moon.core.optim import EagerSGD


@pytest.mark.parametrize(("momentum", "weight_decay"), [(0.0, 0.0), (0.9, 1e-4), (0.5, 5e-3)])
def test_eager_sgd_is_torchs_sgd_bit_for_bit(momentum, weight_decay):
    torch.manual_seed(0)
    ours = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    theirs = copy.deepcopy(ours)
    x, y = torch.randn(32, 12), torch.randint(0, 4, (32,))
    optimizers = [
        EagerSGD(ours.parameters(), lr=0.05, momentum=momentum, weight_decay=weight_decay),
        torch.optim.SGD(theirs.parameters(), lr=0.05, momentum=momentum, weight_decay=weight_decay),
    ]
    steps = []
    optimizers[0].register_step_pre_hook(lambda *_: steps.append(1))
    for _ in range(15):
        for model, opt in zip((ours, theirs), optimizers, strict=True):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    assert len(steps) == 15  # the optimizer's step hooks run as torch.optim.SGD's do
    for a, b in zip(ours.state_dict().values(), theirs.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert all(p.grad is not None for p in ours.parameters())
    optimizers[0].zero_grad()
    assert all(p.grad is None for p in ours.parameters())


@pytest.mark.slow
def test_a_process_that_trains_never_imports_torch_dynamo():
    """It starts a process: what a fresh interpreter imports is the claim (this one has imported
    `torch._dynamo` already). The local round's optimizer, made as
    every algorithm makes it, steps without importing `torch._dynamo` (about 1.2 s of a core)."""
    code = (
        "import sys, torch\n"
        "from fedml_moon.algorithms.base import make_optimizer\n"
        "from fedml_moon.config.schema import TrainArgs\n"
        "model = torch.nn.Linear(4, 2)\n"
        "opt = make_optimizer(model, TrainArgs(momentum=0.9, weight_decay=1e-4))\n"
        "for _ in range(3):\n"
        "    opt.zero_grad(); model(torch.randn(8, 4)).sum().backward(); opt.step()\n"
        "print(sorted(m for m in sys.modules if m.startswith('torch._dynamo')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout
