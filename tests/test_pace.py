"""How a process trains its parties (`engine.pace`): `auto` picks per device, what a device cannot
run is refused naming the key, and a run says in its log how it trains. The CUDA choices are pure
functions of the device, the model and the free memory, so they are checked here without a GPU."""

from __future__ import annotations

import pytest
import torch

from fedml_moon.config.load import load_config
from fedml_moon.config.schema import ConfigError, TrainArgs
from fedml_moon.core.batched import auto_parties
from fedml_moon.core.models import build_model
from fedml_moon.engine.pace import graphs_on, large, resolve_pace, together
from tests.support.cli import restored_main
from tests.support.marks import CUDA_ONLY

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
SIMPLE = build_model("simple-cnn", (3, 32, 32), 10, use_head=True, out_dim=256)
GB = 2**30


def test_the_defaults_are_auto_and_on_a_cpu_train_one_party_after_another():
    cfg = load_config("config/fashion_mnist/moon.yaml", [])
    train = cfg.train_args
    assert (train.parties_in_parallel, train.cuda_graphs, train.precision) == ("auto", "auto", "fp32")
    assert cfg.device_args.using_gpu == "auto"
    pace = resolve_pace(train, CPU, SIMPLE, (1, 28, 28))
    assert (pace.parallel, pace.graphs, pace.precision) == (1, False, "fp32")
    assert "one after another on a CPU" in pace.why


def test_on_a_gpu_auto_trains_the_sampled_parties_that_fit_with_cuda_graphs():
    """The simple CNN's ten parties fit in a few MB and stack; ResNet-50 (a model of `LARGE_MODEL`
    parameters or more) trains one party at a time, each step from its own graph, and on streams
    where parties_in_parallel says K. In bf16, which cannot stack, parties train on streams."""
    train = TrainArgs(client_num_per_round=10)
    pace = resolve_pace(train, CUDA, SIMPLE, (3, 32, 32), free_bytes=40 * GB)
    assert (pace.parallel, pace.graphs, pace.together) == (10, True, "stacked")
    resnet = build_model("resnet50", (3, 32, 32), 100, use_head=True, out_dim=256)
    assert large(resnet) and not large(SIMPLE)
    pace = resolve_pace(train, CUDA, resnet, (3, 32, 32), free_bytes=40 * GB)
    assert (pace.parallel, pace.graphs) == (1, True)
    assert "one after another, a model of 5,000,000 parameters or more" in pace.why
    eight = resolve_pace(TrainArgs(parties_in_parallel=8), CUDA, resnet, (3, 32, 32), free_bytes=40 * GB)
    assert (eight.parallel, eight.together) == (8, "streams")
    bf16 = TrainArgs(client_num_per_round=10, precision="bf16")
    pace = resolve_pace(bf16, CUDA, SIMPLE, (3, 32, 32), free_bytes=40 * GB)
    assert (pace.parallel, pace.together) == (10, "streams")
    stacked = TrainArgs(client_num_per_round=10, precision="bf16", together="stacked")
    assert resolve_pace(stacked, CUDA, SIMPLE, (3, 32, 32), free_bytes=40 * GB).parallel == 1
    assert together(TrainArgs(), resnet, CPU) == "stacked"  # a CPU stacks only when told to train K


def test_auto_fits_the_parties_it_trains_together_in_free_memory():
    """ResNet-50's parties take 4.1 GB each (8 x 98 MB of state, 1.25 x 2.6 GB of saved activations
    at batch 64): 80 % of 40 GB of free memory holds 8 of them, 2 GB none but one."""
    resnet = build_model("resnet50", (3, 32, 32), 100, use_head=True, out_dim=256)
    assert auto_parties(resnet, (64, 3, 32, 32), CUDA, 10, 40 * GB) == 8
    assert auto_parties(resnet, (64, 3, 32, 32), CUDA, 10, 2 * GB) == 1
    assert auto_parties(SIMPLE, (64, 3, 32, 32), CUDA, 10, 40 * GB) == 10


def test_explicit_settings_are_kept_and_what_the_device_cannot_run_is_refused():
    assert resolve_pace(TrainArgs(parties_in_parallel=4), CPU, SIMPLE, (3, 32, 32)).parallel == 4
    assert not resolve_pace(
        TrainArgs(parties_in_parallel=4, cuda_graphs=False), CUDA, SIMPLE, (3, 32, 32)
    ).graphs
    one = resolve_pace(TrainArgs(parties_in_parallel=1, cuda_graphs=True), CUDA, SIMPLE, (3, 32, 32))
    assert (one.parallel, one.graphs) == (1, True)  # one party's own step is replayed too
    with pytest.raises(ConfigError, match="train_args.precision: bf16 cannot stack parties"):
        TrainArgs(parties_in_parallel=4, precision="bf16", together="stacked").check()
    TrainArgs(parties_in_parallel=4, precision="bf16", together="streams").check()
    with pytest.raises(ConfigError, match="train_args.together: stacked .* got 'vmap'"):
        TrainArgs(together="vmap").check()
    cases = [
        (
            TrainArgs(parties_in_parallel=4, cuda_graphs=True),
            CPU,
            "cuda_graphs: CUDA graphs need a CUDA device",
        ),
        (TrainArgs(precision="tf32"), CPU, "train_args.precision: tf32 needs a CUDA device"),
        (
            TrainArgs(parties_in_parallel="auto", precision="bf16", together="stacked", cuda_graphs=True),
            CPU,
            "cuda_graphs: CUDA graphs need a CUDA device",
        ),
    ]
    for train, device, message in cases:
        with pytest.raises(ConfigError, match=message):
            resolve_pace(train, device, SIMPLE, (3, 32, 32), free_bytes=40 * GB)
    assert [graphs_on(s, d) for s in (True, False, "auto") for d in (CPU, CUDA)] == [
        True,
        True,
        False,
        False,
        False,
        True,
    ]


def test_a_run_says_how_it_trains_before_its_first_round(tmp_path, capsys):
    args = ["simulate", "--cf", "config/fashion_mnist/fedavg.yaml", "--output-dir", str(tmp_path)]
    for key in (
        "train_args.comm_round=1",
        "data_args.max_train_samples=300",
        "data_args.max_test_samples=100",
        "device_args.using_gpu=false",  # the CPU, on a GPU machine too
    ):
        args += ["--set", key]
    with restored_main() as main:
        assert main([*args, "--set", "tracking_args.enable_wandb=false"]) == 0
    lines = [line.split(": ", 1)[-1] for line in capsys.readouterr().err.splitlines()]
    said = lines.index(
        "training on cpu: parties_in_parallel 1 (auto: one after another on a CPU, where stacking parties "
        "only adds work), CUDA graphs off, precision fp32"
    )
    assert said < next(i for i, line in enumerate(lines) if line.startswith("round 0"))
    assert lines[0] == "device: cpu (device_args.using_gpu: false)"  # the run's first line says where


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA_ONLY)])
def test_a_checkpoint_from_another_kind_of_device_is_refused_naming_it(tmp_path, monkeypatch, device):
    """A GPU run's parties draw their data streams on the GPU (16-byte generator states), a CPU run's
    on the host; resuming a checkpoint on the other kind of device cannot continue those streams,
    and says so instead of failing inside PyTorch."""
    pytest.importorskip("fedml")  # a run: where FedML is not installed (a GPU machine's own Python), skipped
    from fedml_moon import conformance
    from fedml_moon.adapters.run import assemble
    from tests.support.tiny import TINY_RUN

    monkeypatch.setenv("HOME", str(tmp_path))
    on_gpu = f"device_args.using_gpu={'true' if device == 'cuda' else 'false'}"
    cfg = load_config("config/fashion_mnist/fedavg.yaml", [*conformance.TINY, *TINY_RUN, on_gpu])
    runner = assemble(cfg, tmp_path / "run").loop.runner
    other = torch.Generator(device="cpu") if device == "cuda" else None
    foreign = other.get_state() if other else torch.zeros(16, dtype=torch.uint8)  # a CUDA stream's size
    with pytest.raises(
        ConfigError, match=f"party 0's data stream .* another kind of device than this run's {device}"
    ):
        runner.load_state({"0": {"state": {}, "rng": foreign}})
