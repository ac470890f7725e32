"""The arithmetic of local training (`train_args.precision`), pure PyTorch.

* `fp32`: float32 throughout; TF32 is off for matrix products and cuDNN convolutions (PyTorch turns it
  on for cuDNN by default on Ampere and later GPUs).
* `tf32`: float32 tensors, TF32 tensor-core products and convolutions (CUDA only).
* `bf16`: the forward passes (the student's and the teachers') under `torch.autocast` to bfloat16;
  weights, gradients, SGD state, the loss reductions autocast keeps in float32, and the running loss
  sums stay float32. Runs on CPUs too; not with stacked parties (`BF16_STACKED` says why): parties
  trained together in bf16 each run their own step (`train_args.together: streams`).
* `fp64`: the whole run in float64 (the model, every batch, the server's state): slow, and for checks
  that must tell a real difference between two computations from float32 rounding (`fedml-moon
  check` compares stacked and sequential parties over rounds this way). `default_dtype` sets it.

Evaluation is not affected: the trained weights are float32 in every setting but fp64.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

PRECISIONS = ("fp32", "tf32", "bf16", "fp64")
BF16_STACKED = (
    "train_args.precision: bf16 cannot stack parties: autocast does not reach inside torch.func.vmap "
    "(a linear layer's bias is added in float32, and vmap's BatchNorm rule refuses bfloat16 inputs with "
    "float32 statistics; pytorch/pytorch#192617, #184890), so stacked parties cannot run in bf16. Set "
    "train_args.together to streams or auto (each party its own step), parties_in_parallel to 1, or "
    "precision to fp32 or tf32"
)


@contextlib.contextmanager
def training_precision(kind: str) -> Iterator[None]:
    """TF32 on (`tf32`) or off (otherwise) for the local training inside; restored after."""
    if kind not in PRECISIONS:
        raise ValueError(f"train_args.precision: {kind!r}; choose one of {', '.join(PRECISIONS)}")
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = kind == "tf32"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def default_dtype(kind: str) -> torch.dtype:
    """Set PyTorch's default float dtype for a run of precision `kind` (float64 for fp64, else
    float32) before its data loaders and model are made; returns it."""
    dtype = torch.float64 if kind == "fp64" else torch.float32
    torch.set_default_dtype(dtype)
    return dtype


def forward_precision(kind: str, device: torch.device) -> contextlib.AbstractContextManager:
    """What a training forward (the algorithm's `loss`) runs under: autocast to bfloat16 for `bf16`
    (without autocast's cache of cast weights, which a CUDA graph's capture cannot hold; each weight
    is cast once per forward either way)."""
    if kind == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False)
    return contextlib.nullcontext()


def summable(value: torch.Tensor) -> torch.Tensor:
    """A loss term as the running sums keep it: half-precision values (autocast's) as float32."""
    value = value.detach()
    return value.float() if value.dtype in (torch.bfloat16, torch.float16) else value
