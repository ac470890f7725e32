"""How a process trains its parties on its device: how many together and how, CUDA graphs or not, in
what precision. `auto` picks per device and model what measured faster there (docs: how-to/speed.md):
on a CPU one party after another (stacking only adds work there); on a GPU every step replayed from a
CUDA graph, and for a small model every sampled party that fits in memory stacked into one vmapped
step (in bf16, which cannot stack, each party on its own CUDA stream), for a large model one party
after another (stacked or on streams, its parties measured no faster). Pure PyTorch."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fedml_moon.config.schema import TrainArgs
from fedml_moon.core.batched import RANDOM_FORWARD, auto_parties, draws_random, stacking_error
from fedml_moon.engine.precision import BF16_STACKED
from fedml_moon.errors import ConfigError


@dataclass(frozen=True)
class Pace:
    """The resolved `parties_in_parallel`, `cuda_graphs` and `precision` of a process, and why."""

    device: torch.device
    parallel: int
    graphs: bool
    precision: str
    why: str
    together: str = "stacked"

    def line(self) -> str:
        """One log line that says how this process trains."""
        name = f" ({torch.cuda.get_device_name(self.device)})" if self.device.type == "cuda" else ""
        graphs = "on" if self.graphs else "off"
        how = f", {self.together}" if self.parallel > 1 else ""
        return (
            f"training on {self.device}{name}: parties_in_parallel {self.parallel} ({self.why}){how}, "
            f"CUDA graphs {graphs}, precision {self.precision}"
        )


LARGE_MODEL = 5_000_000  # trainable parameters from which a GPU's `auto` trains one party at a time


def graphs_on(setting: bool | str, device: torch.device) -> bool:
    """`train_args.cuda_graphs` on `device`: true, false, or auto (on with a CUDA device)."""
    return setting is True or (setting == "auto" and device.type == "cuda")


def together(train: TrainArgs, model: nn.Module, device: torch.device) -> str:
    """How parties trained together train (`train_args.together`): stacked or streams; auto: streams
    in bf16 (which cannot stack) and on a CUDA device for a model of `LARGE_MODEL` trainable
    parameters or more (where one vmapped step loses to each party's own), else stacked."""
    if train.together != "auto":
        return train.together
    if train.precision == "bf16":
        return "streams"
    return "streams" if device.type == "cuda" and large(model) else "stacked"


def large(model: nn.Module) -> bool:
    """Whether `model` has `LARGE_MODEL` trainable parameters or more."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad) >= LARGE_MODEL


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
    form = together(train, model, device)
    if parallel > 1:
        parallel, why = _stackable(train, device, model, input_shape, (parallel, why), form)
    if train.precision == "bf16" and parallel > 1 and form == "stacked":
        raise ConfigError(BF16_STACKED)
    return Pace(device, parallel, graphs_on(train.cuda_graphs, device), train.precision, why, form)


def _stackable(
    train: TrainArgs,
    device: torch.device,
    model: nn.Module,
    shape: tuple[int, ...],
    chosen: tuple[int, str],
    form: str = "stacked",
) -> tuple[int, str]:
    """`chosen` where the network's parties can train together in `form` (stacked:
    `batched.stacking_error`; streams: a network that draws no random numbers), tried on the CPU;
    else one party at a time for `parties_in_parallel: auto`, and a ConfigError naming why for a
    number."""
    cpu = torch.device("cpu")  # what the network does, tried where it costs no device memory
    if form == "stacked":
        error = stacking_error(model, shape, cpu)
    else:
        error = RANDOM_FORWARD if draws_random(model, shape, cpu) else None
    if error is None:
        return chosen
    if train.parties_in_parallel == "auto":
        return 1, f"auto: one after another: {error} ({form})"
    other = ", or together: streams on a CUDA device" if form == "stacked" and error != RANDOM_FORWARD else ""
    raise ConfigError(
        f"train_args.parties_in_parallel: {train.parties_in_parallel} parties trained together ({form}) "
        f"cannot run this network: {error}; set parties_in_parallel: 1 (one after another){other}"
    )


def _parallel(
    train: TrainArgs, device: torch.device, model: nn.Module, shape: tuple[int, ...], free: int | None
) -> tuple[int, str]:
    if train.parties_in_parallel != "auto":
        return int(train.parties_in_parallel), "set"
    if device.type != "cuda":
        return 1, "auto: one after another on a CPU, where stacking parties only adds work"
    if large(model):
        return 1, (
            f"auto: one after another, a model of {LARGE_MODEL:,} parameters or more, whose parties "
            "trained together measured no faster"
        )
    if train.precision == "bf16" and together(train, model, device) == "stacked":
        return 1, "auto: bf16 cannot stack parties (train_args.together: stacked)"
    batch = (train.batch_size, *shape)
    k = auto_parties(model, batch, device, train.client_num_per_round, free)
    return k, f"auto: as many of the {train.client_num_per_round} sampled parties as fit in free memory"
