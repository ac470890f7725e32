"""The marks several test files put on their tests: what a test needs of the machine."""

from collections.abc import Callable

import pytest
import torch

from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST

needs_fmnist = pytest.mark.skipif(
    not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist"
)
"""A test that reads Debian's Fashion-MNIST: skipped without it."""

SLOW_WITH_DATA = [pytest.mark.slow, needs_fmnist]
"""A test file's marks (`pytestmark`) whose tests start processes that read Fashion-MNIST."""

# A test of what only a CUDA device runs: skipped without one, and selected by `pytest -m cuda`
# (benchmarks/gpu_check.sh runs these on a GPU machine). For a parameter: pytest.param(..., marks=CUDA_ONLY).
CUDA_ONLY = (pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"))


def cuda_only(test: Callable) -> Callable:
    """Mark `test` as needing a CUDA device (both marks of `CUDA_ONLY`)."""
    for mark in CUDA_ONLY:
        test = mark(test)
    return test
