"""Parties trained together, each on its own copy of the model (`train_args.together: streams`),
pure PyTorch.

Each party runs the one-party step of `engine.local` (its own module, optimizer, teachers and,
with `train_args.cuda_graphs`, its own CUDA graph); the host takes one step of each party in turn,
and on a CUDA device each party's work goes to its own stream, so the GPU runs the parties' kernels
side by side while the host queues the next. No vmap: every algorithm and every precision (bf16
too) runs as it does one party at a time, and each party's arithmetic is the sequential one (the
same kernels on the same batches), so the result equals one party after another. The cost is a
model, its gradients and its optimizer state per party. In a silo's data-parallel group
(`engine.data_parallel`) the parties take their steps in turn on one stream, so every process of
the group runs the group's collectives in the same order.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch
from torch import nn

from fedml_moon.algorithms.base import ClientAlgorithm
from fedml_moon.engine import data_parallel
from fedml_moon.engine.local import PartyJob, party_steps


def train_streams(
    algorithm: ClientAlgorithm, model: nn.Module, jobs: list[PartyJob], device: torch.device
) -> None:
    """E local epochs of every job's party, a step of each in turn; fills each job's final model
    (on `device`), steps and sums. `model` is copied for each party and left as it was."""
    cuda = device.type == "cuda" and data_parallel.current() is None  # a silo group: its collectives in order
    here = torch.cuda.current_stream(device) if cuda else None
    streams = [torch.cuda.Stream(device) for _ in jobs] if cuda else [None] * len(jobs)
    copies = [copy.deepcopy(model) for _ in jobs]
    running: list[tuple[int, Iterator[None]]] = []
    for k, job in enumerate(jobs):
        if streams[k] is not None:
            streams[k].wait_stream(here)
        with _on(streams[k]):
            running.append((k, party_steps(algorithm, copies[k], job, device)))
    while running:
        still = []
        for k, steps in running:
            with _on(streams[k]):
                if next(steps, StopIteration) is not StopIteration:
                    still.append((k, steps))
        running = still
    for k, job in enumerate(jobs):
        if streams[k] is not None:
            here.wait_stream(streams[k])
        job.final = copies[k].state_dict()


def _on(stream: torch.cuda.Stream | None) -> contextlib.AbstractContextManager:
    """Work queued inside goes to `stream` (None: the current one)."""
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
