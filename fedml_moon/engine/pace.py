"""How a process trains its parties on its device: how many together, CUDA graphs or not, in what
precision. `auto` picks per device what is faster there (docs: how-to/speed.md): on a CPU one party after
another (stacking only adds work there), on a GPU every sampled party that fits in memory, stacked,
with each step replayed from a CUDA graph. Pure PyTorch."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fedml_moon.config_schema import TrainArgs
from fedml_moon.core.batched import auto_parties
from fedml_moon.errors import ConfigError


@dataclass(frozen=True)
class Pace:
    """The resolved `parties_in_parallel`, `cuda_graphs` and `precision` of a process, and why."""

    device: torch.device
    parallel: int
    graphs: bool
    precision: str
    why: str

    def line(self) -> str:
        """One log line that says how this process trains."""
        name = f" ({torch.cuda.get_device_name(self.device)})" if self.device.type == "cuda" else ""
        graphs = "on" if self.graphs else "off"
        return (
            f"training on {self.device}{name}: parties_in_parallel {self.parallel} ({self.why}), "
            f"CUDA graphs {graphs}, precision {self.precision}"
        )


def graphs_on(setting: bool | str, device: torch.device) -> bool:
    """`train_args.cuda_graphs` on `device`: true, false, or auto (on with a CUDA device)."""
    return setting is True or (setting == "auto" and device.type == "cuda")


def resolve_pace(
    train: TrainArgs,
    device: torch.device,
    model: nn.Module,
    input_shape: tuple[int, ...],
    free_bytes: int | None = None,
) -> Pace:
    """The pace of `train` on `device`; `free_bytes` (default: the device's) sizes `auto` on a GPU.
    Refuses, naming the key, what the device cannot run."""
    cuda = device.type == "cuda"
    if train.cuda_graphs is True and not cuda:
        raise ConfigError(
            f"train_args.cuda_graphs: CUDA graphs need a CUDA device and this run trains on {device} "
            "(device_args); set cuda_graphs to auto or false"
        )
    if train.precision == "tf32" and not cuda:
        raise ConfigError(
            f"train_args.precision: tf32 needs a CUDA device and this run trains on {device}; "
            "choose fp32, or bf16 (which runs on CPUs too)"
        )
    parallel, why = _parallel(train, device, model, input_shape, free_bytes)
    graphs = graphs_on(train.cuda_graphs, device) and parallel > 1
    if train.cuda_graphs is True and parallel == 1:
        raise ConfigError(
            f"train_args.cuda_graphs: true, but parties_in_parallel resolved to 1 on {device} ({why}); "
            "set cuda_graphs to auto, or parties_in_parallel to K > 1"
        )
    return Pace(device, parallel, graphs, train.precision, why)


def _parallel(
    train: TrainArgs, device: torch.device, model: nn.Module, shape: tuple[int, ...], free: int | None
) -> tuple[int, str]:
    if train.parties_in_parallel != "auto":
        return int(train.parties_in_parallel), "set"
    if device.type != "cuda":
        return 1, "auto: one after another on a CPU, where stacking parties only adds work"
    if train.precision == "bf16":
        return 1, "auto: bf16 trains one party at a time"
    batch = (train.batch_size, *shape)
    k = auto_parties(model, batch, device, train.client_num_per_round, free)
    return k, f"auto: as many of the {train.client_num_per_round} sampled parties as fit in free memory"
