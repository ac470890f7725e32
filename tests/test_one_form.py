"""Each algorithm's party side is written once: a context, a loss, optional step hooks, a finish. The
contract an author implements is these six members; nothing of a round lives on the algorithm object;
every registered algorithm runs through the same members for one party and for several stacked."""

from __future__ import annotations

import copy
import inspect
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fedml_moon import registry
from fedml_moon.algorithms.base import ClientAlgorithm, Context, PartyRound, ServerAlgorithm
from fedml_moon.config.load import load_config
from fedml_moon.config.schema import require
from fedml_moon.core.models import build_model
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from fedml_moon.engine.batched import PartyJob, train_parties, train_party
from fedml_moon.registry import ALGORITHMS, AlgorithmSpec, get_algorithm
from tests.support.cli import restored_main
from tests.support.tiny import tiny_batches

ROOT = Path(__file__).resolve().parent.parent

CONTRACT = {"context", "loss", "before_step", "after_step", "finish", "personal_state"}
DERIVED = {"eval_state"}  # from personal_state; not for authors to write
PROVIDED = {"generator"}  # the run's random numbers for the contract's members; not to override


def test_the_contract_is_six_members():
    public = {n for n, v in vars(ClientAlgorithm).items() if callable(v) and not n.startswith("_")}
    assert public == CONTRACT | DERIVED | PROVIDED
    for name in CONTRACT:
        assert inspect.getdoc(getattr(ClientAlgorithm, name)), f"{name} is undocumented"


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_no_algorithm_adds_a_public_member_or_keeps_round_state_on_self(name):
    """Its own public methods are the contract's (and helpers it names itself, none of them a second
    form); after three local rounds of two parties, its attributes are what it was built with."""
    spec = get_algorithm(name)
    extra = {
        n
        for cls in spec.client.__mro__[:-1]
        if cls is not ClientAlgorithm and cls is not object
        for n, v in vars(cls).items()
        if callable(v) and not n.startswith("_") and n not in CONTRACT
    }
    assert not extra & {"local_train", "batch_loss", "functional_loss", "start_round", "end_round", "upload"}
    client, model = _client(name)
    before = {k: _fingerprint(v) for k, v in vars(client).items()}
    states: list[dict] = [{}, {}]
    for round_idx in range(3):
        for party in (0, 1):
            train_party(
                client,
                model,
                _received(name, model, round_idx),
                states[party],
                tiny_batches(seed=party + round_idx),
                torch.device("cpu"),
                round_idx,
                party,
            )
    assert {k: _fingerprint(v) for k, v in vars(client).items()} == before


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_one_party_alone_and_stacked_with_others_ends_the_same(name):
    """A party trained alone on the model itself and the same party stacked with two others (vmap):
    its upload and its kept state agree within 1e-5."""
    client, model = _client(name)
    received = _received(name, model, 1)
    alone_state: dict = {}
    _, alone = train_party(
        client, copy.deepcopy(model), received, alone_state, tiny_batches(seed=7), torch.device("cpu"), 1, 0
    )
    names = tuple(n for n, p in model.named_parameters() if p.requires_grad)
    jobs = [PartyJob(PartyRound(received, {}, 1, p, names), tiny_batches(seed=7 + p)) for p in range(3)]
    (_, stacked), *_ = train_parties(client, copy.deepcopy(model), jobs, torch.device("cpu"))
    for key, value in alone["model"].items():
        assert float((value.double() - stacked["model"][key].double()).abs().max()) <= 1e-5, key
    assert jobs[0].round.state.keys() == alone_state.keys()


def test_a_context_whose_shared_and_party_keys_clash_is_refused_with_the_keys_named():
    class Clash(ClientAlgorithm):
        def context(self, r):
            return Context(r.received["model"], 0.1, {"w": 1.0}, {"w": torch.zeros(1)})

    client, model = _client("fedavg")
    clash = Clash(None, client.train_args, client.model_factory, 0)
    with pytest.raises(ValueError, match=r"share the keys \['w'\]"):
        train_party(
            clash, model, {"model": model.state_dict()}, {}, tiny_batches(), torch.device("cpu"), 0, 0
        )


def _client(name: str):
    config = (
        "config/fashion_mnist/fedprox.yaml" if name == "fedprox_head" else f"config/fashion_mnist/{name}.yaml"
    )
    sets = ["train_args.learning_rate=0.05", "train_args.comm_round=3"]
    cfg = load_config(config, [*sets, *(["algorithm_args.split_preset=head"] if name == "lg" else [])])

    def factory() -> torch.nn.Module:
        return build_model("mlp", (1, 4, 4), 3, use_head=True, out_dim=8)

    torch.manual_seed(0)
    spec = get_algorithm(name)
    return spec.client(cfg.algorithm_args, cfg.train_args, factory, 0), factory()


def _received(name: str, model: torch.nn.Module, round_idx: int) -> dict:
    state = {k: v.clone() for k, v in model.state_dict().items()}
    if name == "lg":  # its warm-up, then its own phase: the global layers and, once, local ones
        return (
            {"model": state, "phase": "fedavg"}
            if round_idx == 0
            else {"model": state, "phase": "lg", "local_init": state}
        )
    if name == "fedssc" and round_idx > 0:
        return {"model": state, "prototypes": torch.randn(3, 8), "present": torch.tensor([True, False, True])}
    return {"model": state}


def _fingerprint(value):
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), float(value.double().sum()))
    if isinstance(value, dict | list | tuple | set):
        return (type(value).__name__, len(value))
    return repr(value)


@dataclass
class SmoothOptions:
    smoothing: float = 0.1

    def check(self) -> None:
        require(0 <= self.smoothing < 1, "algorithm_args.smoothing", "must be in [0, 1)")


class LabelSmoothing(ClientAlgorithm):
    """A new algorithm in a few lines: a loss (cross-entropy with label smoothing) and what a party
    keeps (how many rounds it trained) beside FedAvg's upload."""

    name = "smooth_demo"

    def loss(self, net, x, y, ctx):
        ce = F.cross_entropy(net(x).logits, y, label_smoothing=self.options.smoothing)
        return ce, {"ce": ce.detach()}

    def finish(self, r, ctx, done):
        r.state["rounds"] = int(r.state.get("rounds", 0)) + 1
        return super().finish(r, ctx, done)


def spec() -> AlgorithmSpec:
    """The entry point the conformance suite's processes load (see the test below)."""
    return AlgorithmSpec("smooth_demo", LabelSmoothing, ServerAlgorithm, SmoothOptions, "label smoothing")


@pytest.mark.slow
@pytest.mark.skipif(not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist")
def test_an_algorithm_written_here_passes_the_conformance_suite_batched_included(
    tmp_path, monkeypatch, capsys
):
    """Registered through an entry point (a dist-info folder on the path of this process and of the
    check's), `fedml-moon check` runs it: payloads and states, stacked parties (K = 2 of the tiny run's
    sampled parties) against sequential, determinism, float64 rounds, resume and secure sums."""
    site = tmp_path / "site"
    dist = site / "smooth_demo-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: smooth-demo\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(
        "[fedml_moon.algorithms]\nsmooth_demo = tests.test_one_form:spec\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(ROOT)]))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    monkeypatch.setattr(registry, "ALGORITHMS", dict(registry.ALGORITHMS))
    config = str(ROOT / "config" / "fashion_mnist" / "fedavg.yaml")
    with restored_main() as main:
        code = main(["check", "smooth_demo", "--cf", config, "--modes", "standalone"])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert "smooth_demo: 14 of 14 checks passed" in out
    stacked = (
        "PASS  stacked parties: one local round from identical inputs equals sequential (float32, 1e-05)"
    )
    assert f"{stacked} (groups of [2] parties trained together)" in out


def test_trainable_is_set_after_the_constructor_and_before_setup_as_the_tutorial_says():
    from types import SimpleNamespace

    from fedml_moon.adapters.aggregator import PluginServerAggregator
    from fedml_moon.algorithms.base import NoOptions
    from fedml_moon.config.schema import ServerArgs
    from tests.support.tiny import tiny_factory, train_args

    seen = {}

    class Watching(ServerAlgorithm):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            seen["init"] = list(self.trainable)

        def setup(self, global_state):
            seen["setup"] = list(self.trainable)
            return global_state

    model = tiny_factory()()
    PluginServerAggregator(model, SimpleNamespace(), Watching(NoOptions(), ServerArgs(), train_args()))
    assert seen["init"] == []
    assert seen["setup"] == [n for n, p in model.named_parameters() if p.requires_grad] != []
