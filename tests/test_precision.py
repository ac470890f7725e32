"""`train_args.precision`: what each setting computes in, and that batching adds no error beyond the
precision's own (bf16 runs on this CPU; TF32 needs CUDA and is checked where one is)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fedml_moon.algorithms.base import ClientAlgorithm, Context, PartyRound
from fedml_moon.core.models import build_model
from fedml_moon.engine.batched import PartyJob, train_parties
from fedml_moon.engine.precision import training_precision
from tests.support.tiny import train_args

CPU = torch.device("cpu")


class _Dtypes(ClientAlgorithm):
    """Cross-entropy that records the dtype its forward computed in."""

    name = "dtypes"
    seen: list[torch.dtype] = []

    def context(self, r: PartyRound) -> Context:
        return Context(r.received["model"], self.train_args.learning_rate, {}, {})

    def loss(self, net, x, y, ctx):
        logits = net(x).logits
        _Dtypes.seen.append(logits.dtype)
        ce = F.cross_entropy(logits, y)
        return ce, {"ce": ce}


def _jobs(parties: int, precision: str, together: str = "auto") -> tuple[_Dtypes, list[PartyJob], object]:
    def factory() -> torch.nn.Module:
        return build_model("simple-cnn", (1, 28, 28), 10, use_head=True, out_dim=16)

    torch.manual_seed(0)
    algo = _Dtypes(None, train_args(batch_size=4, precision=precision, together=together), factory, 0)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(4, 1, 28, 28, generator=g), torch.randint(0, 10, (4,), generator=g))] * 2
    names = tuple(n for n, p in factory().named_parameters() if p.requires_grad)
    start = factory().state_dict()
    return (
        algo,
        [PartyJob(PartyRound({"model": start}, {}, 0, p, names), batches) for p in range(parties)],
        factory,
    )


@pytest.mark.parametrize(("precision", "dtype"), [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_bf16_runs_the_forward_in_bfloat16_and_keeps_weights_and_sums_in_float32(precision, dtype):
    algo, jobs, factory = _jobs(1, precision)
    _Dtypes.seen = []
    [(metrics, upload)] = train_parties(algo, factory(), jobs, CPU)
    assert set(_Dtypes.seen) == {dtype}
    assert all(t.dtype == torch.float32 for t in upload["model"].values() if t.is_floating_point())
    assert set(metrics) == {"ce", "loss"} and all(v > 0 for v in metrics.values())


def test_stacked_parties_in_bf16_are_refused_naming_the_keys_and_the_reason():
    """Autocast does not reach inside torch.func.vmap (checked here: the stacked forward stays
    float32), so the batched path refuses bf16 rather than run something else than was asked."""
    algo, jobs, factory = _jobs(3, "bf16", together="stacked")
    with pytest.raises(ValueError, match="parties_in_parallel to 1.*or precision to fp32 or tf32"):
        train_parties(algo, factory(), jobs, CPU)
    _Dtypes.seen = []
    fp32, jobs, factory = _jobs(3, "fp32")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        train_parties(fp32, factory(), jobs, CPU)
    assert set(_Dtypes.seen) == {torch.float32}  # if PyTorch fixes this, bf16 can stack


def test_parties_trained_together_in_bf16_each_run_their_own_bf16_step():
    """`together: auto` trains bf16 parties on streams (each its own step, no vmap): every forward in
    bfloat16, and each party's upload equal to its training alone."""
    algo, jobs, factory = _jobs(3, "bf16")
    _Dtypes.seen = []
    together = train_parties(algo, factory(), jobs, CPU)
    assert set(_Dtypes.seen) == {torch.bfloat16}
    algo, jobs, factory = _jobs(3, "bf16")
    for job, (metrics, upload) in zip(jobs, together, strict=True):
        [(alone_metrics, alone)] = train_parties(algo, factory(), [job], CPU)
        assert metrics == alone_metrics
        assert all(torch.equal(upload["model"][k], t) for k, t in alone["model"].items())


def test_precision_sets_tf32_for_the_training_inside_and_restores_it():
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    for kind, on in (("tf32", True), ("fp32", False), ("bf16", False)):
        with training_precision(kind):
            assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (on, on)
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before
    with pytest.raises(ValueError, match="train_args.precision: 'fp16'; choose one of fp32, tf32, bf16"):
        with training_precision("fp16"):
            pass


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["train_args.precision=fp16"], "train_args.precision: choose fp32 .* got 'fp16'"),
        (
            ["train_args.precision=bf16", "train_args.parties_in_parallel=3", "train_args.together=stacked"],
            "bf16 cannot stack parties .* set train_args.together to streams or auto",
        ),
    ],
)
def test_the_config_refuses_what_cannot_run_naming_the_key(sets, message):
    from fedml_moon.config.load import ConfigError, load_config

    with pytest.raises(ConfigError, match=message):
        load_config("config/fashion_mnist/moon.yaml", sets)


def test_fp64_runs_everything_in_float64_and_fp32_stays_float32(tmp_path):
    """train_args.precision fp64: the model, every batch and the server's state in float64; the
    default dtype is the process's again afterwards; fp32 batches stay float32."""
    import torch

    from fedml_moon.conformance import TINY
    from fedml_moon.conformance.inprocess import quiet_run

    config = Path(__file__).resolve().parent.parent / "config" / "fashion_mnist" / "fedavg.yaml"
    for precision, dtype in (("fp64", torch.float64), ("fp32", torch.float32)):
        overrides = [*TINY, "train_args.comm_round=1", f"train_args.precision={precision}"]
        with quiet_run(config, overrides, tmp_path / precision) as run:
            x, _ = next(iter(run.dataset.train_data_local_dict[0]))
            run.loop.run()
            assert x.dtype == dtype
            assert {t.dtype for t in run.loop.server.aggregator.global_state.values()} == {dtype}
        assert torch.get_default_dtype() == torch.float32
