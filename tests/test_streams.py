"""Parties trained together each on its own copy of the model and its own CUDA stream
(`train_args.together: streams`, `engine.streams`), and one party's step replayed from a CUDA graph
(`engine.graphed`): both run the sequential arithmetic, so two rounds of every built-in algorithm end
where one party after another, eager, ends: bit for bit on a CPU (where the graph's static-input step
runs as it is), within 1e-4 on CUDA. Nothing here imports FedML."""

from __future__ import annotations

import pytest
import torch

from tests.support.devices import BUILT_IN, CUDA, distances, round_trip, synchronising_calls

CPU = torch.device("cpu")
STREAMS = ("train_args.together=streams", "train_args.parties_in_parallel=4")


@pytest.mark.parametrize("algorithm", BUILT_IN)
def test_parties_on_streams_end_bit_for_bit_where_one_after_another_ends_on_the_cpu(algorithm) -> None:
    alone = round_trip(algorithm, CPU, parallel=False)
    together = round_trip(algorithm, CPU, parallel=True, sets=(*STREAMS, "train_args.cuda_graphs=false"))
    assert max(distances(alone, together).values()) == 0.0


@pytest.mark.parametrize("algorithm", BUILT_IN)
def test_one_partys_static_input_step_ends_bit_for_bit_where_the_eager_step_ends_on_the_cpu(algorithm):
    """Full batches copied into the static inputs a CUDA graph would read, partial ones eager."""
    eager = round_trip(algorithm, CPU, parallel=False)
    static = round_trip(algorithm, CPU, parallel=False, sets=("train_args.cuda_graphs=true",))
    assert max(distances(eager, static).values()) == 0.0


@CUDA
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "cuda-graphs"])
@pytest.mark.parametrize("algorithm", BUILT_IN)
def test_parties_on_streams_equal_one_after_another_on_cuda(algorithm: str, graphs: bool, no_tf32) -> None:
    alone = round_trip(algorithm, torch.device("cuda"), parallel=False)
    sets = (*STREAMS, f"train_args.cuda_graphs={str(graphs).lower()}")
    together = round_trip(algorithm, torch.device("cuda"), parallel=True, sets=sets)
    assert max(distances(alone, together).values()) <= 1e-4


@CUDA
@pytest.mark.parametrize("algorithm", BUILT_IN)
def test_one_partys_cuda_graph_equals_its_eager_step(algorithm: str, no_tf32) -> None:
    eager = round_trip(algorithm, torch.device("cuda"), parallel=False)
    graphed = round_trip(
        algorithm, torch.device("cuda"), parallel=False, sets=("train_args.cuda_graphs=true",)
    )
    assert max(distances(eager, graphed).values()) <= 1e-4


@CUDA
def test_bf16_parties_on_streams_with_cuda_graphs_add_no_error_beyond_bf16s_own() -> None:
    """bf16 cannot stack, but runs on streams: graphs and streams move the result by at most a
    tenth of what bf16 itself moves it from float32 (or 1e-4)."""
    cuda, bf16 = torch.device("cuda"), "train_args.precision=bf16"
    fp32 = round_trip("moon", cuda, parallel=False)
    alone = round_trip("moon", cuda, parallel=False, sets=(bf16, "train_args.cuda_graphs=false"))
    together = round_trip("moon", cuda, parallel=True, sets=(bf16, *STREAMS, "train_args.cuda_graphs=true"))
    bf16_error = max(distances(fp32, alone).values())
    assert bf16_error > 0
    assert max(distances(alone, together).values()) <= max(1e-4, bf16_error / 10)


@CUDA
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "cuda-graphs"])
def test_the_streams_step_loop_never_waits_for_the_gpu(graphs: bool) -> None:
    """As for stacked parties: three times the epochs add no synchronising call per step (each of the
    4 parties has about 5 steps an epoch), at most one per party and extra epoch."""
    more = synchronising_calls(3, graphs, "streams") - synchronising_calls(1, graphs, "streams")
    assert more <= 2 * 4
