"""One party's training step replayed from a CUDA graph (`train_args.cuda_graphs`), pure PyTorch.

The step (zero the gradients, the algorithm's loss and backward, the step hooks, the SGD step, the
running loss sums) reads its batch from static input tensors. On a CUDA device the party's first full
batch runs eagerly off the default stream (it creates the teachers, the momentum buffers and the sums, as a
capture requires), the second is captured and every later full batch replays the graph: the same
kernels on the same tensors, without the per-kernel launch cost that bounds a large model's small
batches. A partial last batch takes the eager step. Elsewhere the static-input step runs as it is (the
plumbing, tested on a CPU).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class PartyGraph:
    """`step(x, y)` of one party, its full batches (`size` samples) through static inputs and, on
    CUDA, a graph captured at the second full batch."""

    def __init__(self, step: Callable[[torch.Tensor, torch.Tensor], None], size: int, device: torch.device):
        self.step, self.size, self.device = step, size, device
        self.x: torch.Tensor | None = None
        self.y: torch.Tensor | None = None
        self.graph: Any = None
        self.warm = False

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        if x.shape[0] != self.size:
            self.step(x, y)
            return
        if self.x is None or self.y is None:
            self.x, self.y = x.clone(), y.clone()
        else:
            self.x.copy_(x)
            self.y.copy_(y)
        if self.device.type != "cuda":
            self.step(self.x, self.y)
        elif self.graph is not None:
            self.graph.replay()
        elif not self.warm:
            self._warm_up()
        else:
            self.graph = self._capture()
            self.graph.replay()  # a capture records the step without running it

    def _off_default(self) -> tuple[torch.cuda.Stream, torch.cuda.Stream]:
        """(the stream to work on, the current one): the party's own stream when it has one
        (`engine.streams`), else a side stream that waits for the current one, as warm-up and
        capture require. On its own stream, what the warm-up makes (teachers, momentum, sums) and
        the cuBLAS workspace the capture records belong to the stream that replays them, so no two
        parties' graphs share a workspace or hand each other memory still in use."""
        here = torch.cuda.current_stream(self.device)
        if here != torch.cuda.default_stream(self.device):
            return here, here
        side = torch.cuda.Stream(self.device)
        side.wait_stream(here)
        return side, here

    def _warm_up(self) -> None:
        """The first full batch's step, off the default stream."""
        work, here = self._off_default()
        with torch.cuda.stream(work):
            self.step(self.x, self.y)
        here.wait_stream(work)
        self.warm = True

    def _capture(self) -> Any:
        """The step captured off the default stream. Unlike `torch.cuda.graph`, without a device
        synchronisation, garbage collection and emptying of the allocator's cache at every capture
        (one per party and round here)."""
        work, here = self._off_default()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(work):
            graph.capture_begin()
            try:
                self.step(self.x, self.y)
            finally:
                graph.capture_end()
        here.wait_stream(work)
        return graph
