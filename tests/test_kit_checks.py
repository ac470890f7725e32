"""`fedml-moon check` fails the algorithms contributors break silently, naming the cause, and passes
a correct one whose loss is full of ReLU kinks; plugins load without installing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fedml_moon import conformance, registry
from fedml_moon.algorithms.base import ServerAlgorithm
from fedml_moon.config.load import load_config
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from fedml_moon.engine.summed import sum_form_problem
from fedml_moon.errors import ConfigError
from fedml_moon.privacy.sums import SUM, UPDATE

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = ROOT / "tests" / "support" / "kit_plugins.py"
FEDPROTO = ROOT / "examples" / "fedproto" / "fedproto.yaml"
needs_fmnist = pytest.mark.skipif(
    not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist"
)


def plugin(name: str) -> list[str]:
    """The overrides that load tests/support/kit_plugins.py's `name` and run it."""
    spec = {"hinge": "hinge_kinks"}.get(name, f"proto_{name}")
    return [*conformance.TINY, f"common_args.plugins=[{PLUGINS}:{name}]", f"train_args.algorithm={spec}"]


@pytest.fixture
def registry_copy(monkeypatch):
    monkeypatch.setattr(registry, "ALGORITHMS", dict(registry.ALGORITHMS))
    monkeypatch.setattr(registry, "_searched", {"entry points": [], "plugins": []})
    monkeypatch.setattr(sys, "path", list(sys.path))


def test_a_module_on_the_path_or_a_file_loads_without_installing(registry_copy):
    spec = registry.load_plugin("fedml_moon_fedproto:spec", [FEDPROTO.parent])
    assert registry.get_algorithm("fedproto") is spec and spec.server.__name__ == "FedprotoServer"
    again = registry.load_plugin(f"{PLUGINS}:hinge", [])
    assert again == registry.load_plugin("tests/support/kit_plugins.py:hinge", [ROOT])  # one module per file
    cfg = load_config(FEDPROTO, [])  # the config's own key, found beside the config
    assert cfg.common_args.plugins == ["fedml_moon_fedproto:spec"] and cfg.train_args.algorithm == "fedproto"


@pytest.mark.parametrize(
    ("ref", "says"),
    [
        ("no_module_of_this_name:spec", "no module 'no_module_of_this_name' on the Python path or in"),
        ("os:no_such_attribute", "module os has no 'no_such_attribute'"),
        ("os:getcwd", "not an AlgorithmSpec"),
        ("just_a_name", "is not module:attribute"),
        ("missing/file.py:spec", "no file missing/file.py"),
    ],
)
def test_a_plugin_that_cannot_load_is_named_with_why(registry_copy, ref, says):
    with pytest.raises(ConfigError, match="common_args.plugins") as err:
        registry.load_plugin(ref, [ROOT])
    assert says in str(err.value)


def test_an_unknown_name_says_where_it_looked(registry_copy):
    registry.load_plugin(f"{PLUGINS}:hinge", [])
    with pytest.raises(ConfigError) as err:
        registry.get_algorithm("fedprotoo")
    said = str(err.value)
    assert "unknown algorithm 'fedprotoo'" in said and "hinge_kinks" in said
    assert "entry points of group fedml_moon.algorithms (fedprox_head = fedml_moon_headprox:spec)" in said
    assert f"common_args.plugins / --plugin ({PLUGINS}:hinge)" in said and "--plugin module:spec" in said


def test_a_plugin_whose_name_is_taken_is_refused(registry_copy, tmp_path):
    (tmp_path / "thief.py").write_text(
        "from fedml_moon.registry import ALGORITHMS, AlgorithmSpec\n"
        "moon = ALGORITHMS['moon']\n"
        "spec = AlgorithmSpec('moon', moon.client, moon.server, dict, 'not MOON')\n"
    )
    with pytest.raises(ConfigError, match="names its algorithm 'moon', which fedml_moon.algorithms.moon"):
        registry.load_plugin("thief.py:spec", [tmp_path])
    assert registry.ALGORITHMS["moon"].summary == "model-contrastive FL (CVPR 2021)"


def test_the_sum_form_must_carry_every_upload_field():
    import torch

    spec = {"model": {}, "party_id": 0, "protos": torch.empty(2, device="meta")}

    class Unsummed(ServerAlgorithm):
        pass

    class Unread(ServerAlgorithm):
        summed = {"model": UPDATE, "protos": SUM}

    class Stray(ServerAlgorithm):
        summed = {"model": UPDATE, "protos": SUM, "extra": SUM}

        def aggregate_sums(self, global_state, sums):
            return global_state

    said = sum_form_problem(Unsummed, spec, "demo")
    assert "demo's uploads hold ['protos'], which Unsummed.summed does not name" in said
    assert (
        "Unread.summed names ['protos'], but Unread.aggregate_sums is ServerAlgorithm's"
        in sum_form_problem(Unread, spec, "demo")
    )
    assert "Stray.summed names ['extra'], which demo's upload_spec does not hold" in sum_form_problem(
        Stray, spec, "demo"
    )
    assert sum_form_problem(Stray, {**spec, "extra": torch.empty(1)}, "demo") is None


@pytest.mark.slow
@needs_fmnist
@pytest.mark.parametrize("key", ["privacy_args.secure_aggregation=true", "train_args.stream_uploads=true"])
def test_the_engine_refuses_a_sum_form_that_drops_a_field(tmp_path, key):
    """Through the command line: exit 2 before any round, naming the algorithm and the fields."""
    sets = [*plugin("unsummed"), "train_args.client_num_per_round=3", "validation_args.local_test=false", key]
    cmd = conformance.cli_command("simulate", FEDPROTO, sets, tmp_path)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    said = done.stderr
    assert (
        f"config error: {key.split('=')[0]}: proto_unsummed's uploads hold ['proto_sum', 'proto_weight']"
        in said
    )
    assert "UnsummedServer.summed does not name" in said and not (tmp_path / "metrics.jsonl").exists()


@needs_fmnist
@pytest.mark.slow
def test_check_names_server_state_that_a_resume_loses(tmp_path):
    overrides = plugin("forgetful")
    traced = conformance.traced_run(FEDPROTO, overrides, tmp_path / "traced")
    check = conformance.resume_check(FEDPROTO, overrides, tmp_path, traced)
    assert not check.ok
    assert (
        "at the start of round 2: server.protos: uninterrupted a tensor [10, 256] float32, resumed None"
        in check.detail
    )
    assert "state() / load_state() do not carry it" in check.detail


@needs_fmnist
def test_check_names_a_sum_form_that_drops_or_ignores_a_field(tmp_path):
    dropped = conformance.secure_vs_plain(FEDPROTO, plugin("unsummed"), tmp_path / "a", 3)
    assert "secure aggregation refuses" in dropped.error and "['proto_sum', 'proto_weight']" in dropped.error
    ignored = conformance.secure_vs_plain(FEDPROTO, plugin("sums_ignored"), tmp_path / "b", 3)
    assert any(p.startswith("server algorithm.protos: plain a tensor [10, 256]") for p in ignored.problems)
    assert "secure None" in ignored.problems[0] or any("secure None" in p for p in ignored.problems)
    fine = conformance.secure_vs_plain(
        FEDPROTO, ["common_args.random_seed=0", *conformance.TINY], tmp_path / "c", 3
    )
    assert not fine.problems and not fine.error, fine


@needs_fmnist
def test_check_names_a_branch_on_data_that_parties_trained_together_cannot_take(tmp_path):
    traced = conformance.traced_run(FEDPROTO, plugin("branchy"), tmp_path)
    assert not traced.error  # one party at a time runs it
    assert traced.replay and all(" trained together failed: RuntimeError" in r for r in traced.replay)
    assert traced.replay[0].startswith("round 0, parties [")
    assert "branches on a tensor's value" in traced.replay[0] and "torch.where" in traced.replay[0]


@needs_fmnist
@pytest.mark.slow
def test_a_correct_plugin_full_of_relu_kinks_passes(tmp_path):
    """Hinge losses on logits and norms: kinks everywhere, and 10 rounds of 3 parties, 2 epochs. In
    float32 a pre-activation within rounding of a kink can go one way stacked and the other
    sequentially, and the gap grows; in float64 the two agree within 1e-9 over every round, so
    the check passes, saying how far float32 drifted."""
    from fedml_moon.conformance.checks import _one_round_check

    overrides = [*plugin("hinge"), "train_args.comm_round=10", "train_args.client_num_per_round=3"]
    overrides += ["train_args.epochs=2"]
    config = ROOT / "config" / "fashion_mnist" / "fedavg.yaml"
    traced = conformance.traced_run(config, overrides, tmp_path / "traced")
    float64 = conformance.float64_rounds(config, overrides, tmp_path / "f64", 3)
    assert float64.ok and "groups of [3]" in float64.note, float64
    check = _one_round_check(traced, float64)
    assert check.ok and "groups of [3] parties trained together" in check.note, check
    print(check.note)  # how far float32 drifted, if it did: rounding, as float64 says


def test_a_silo_never_takes_plugins_from_the_server(registry_copy):
    """`common_args.plugins` is each process's own: not among the settings a server shares, and a
    server that sends it anyway is refused before anything is imported."""
    from fedml_moon.distributed.deploy import shared_config, with_shared

    cfg = load_config(FEDPROTO, [])
    shared = shared_config(cfg)
    assert "common_args.random_seed" in shared and not any(
        k.startswith("common_args.plugins") for k in shared
    )
    hostile = {**shared, "common_args.plugins": [f"{PLUGINS}:hinge"]}
    with pytest.raises(ConfigError, match=r"never takes from it: \['common_args.plugins'\]"):
        with_shared(cfg, hostile)
    for key, value in (("common_args.scenario", "hierarchical"), ("device_args.n_proc_per_node", 8)):
        assert key not in shared  # a silo's own settings, which no server sends
        with pytest.raises(ConfigError, match=f"never takes from it: \\['{key}'\\]"):
            with_shared(cfg, {**shared, key: value})
    assert "hinge_kinks" not in registry.ALGORITHMS
    assert with_shared(cfg, shared).train_args.algorithm == "fedproto"


def test_a_mode_that_ends_elsewhere_is_named_by_tensor_entry_and_both_values(tmp_path):
    import json

    import torch

    from fedml_moon.conformance.checks import run_differences
    from fedml_moon.conformance.processes import RunResult

    runs = []
    for name, bias in (("standalone", 0.5), ("grpc", 0.5 + 1.37e-4)):
        out = tmp_path / name
        out.mkdir()
        torch.save(
            {"w": torch.zeros(2, 2), "classifier.bias": torch.tensor([0.0, bias])}, out / "final_model.pt"
        )
        (out / "metrics.jsonl").write_text(json.dumps({"round": 0, "test_acc": 0.5}) + "\n")
        runs.append(RunResult(name, out, [0], []))
    (found,) = run_differences(*runs, 1e-5, ("standalone", "cross-silo-grpc"))
    assert found.startswith("final model.classifier.bias[1]: standalone 0.5, cross-silo-grpc 0.50013697")
    assert "differ by 0.000137; allowed 1e-05" in found
    assert run_differences(*runs, 1e-3, ("standalone", "cross-silo-grpc")) == []


@needs_fmnist
def test_check_tries_the_example_buffered_and_refuses_without_failing_what_cannot_buffer(tmp_path):
    """FedProto buffered with every party at once is its synchronous round (model and prototypes);
    with a buffer of one, 3 updates of staleness 0, 1 and 2 end finite. A plugin that says why it
    does not buffer is not tried: not applicable, with its reason, and no run is made."""
    fine = conformance.buffered_vs_sync(FEDPROTO, list(conformance.TINY), tmp_path / "fine", 3)
    assert fine.ok and not fine.skipped, fine
    assert fine.note == "within 1e-05; then 3 updates of staleness 0 to 2, one a round"
    assert sorted(p.name for p in (tmp_path / "fine").iterdir()) == ["buffered", "stale", "sync"]
    refused = conformance.buffered_vs_sync(FEDPROTO, plugin("not_buffered"), tmp_path / "refused", 3)
    assert refused.skipped == (
        "proto_not_buffered cannot buffer: its prototypes are a round's class means, which a buffer of "
        "stale ones would blur"
    )
    assert not (tmp_path / "refused").exists()


@needs_fmnist
def test_check_names_a_buffered_step_that_ignores_a_sum_or_needs_a_whole_round(tmp_path):
    """sums_ignored's aggregate_sums drops the prototypes: the buffered server keeps none where the
    synchronous one keeps [10, 256]. round_sized equals the synchronous round, every party in the
    buffer, and stops at the first buffer of one update, which the check names."""
    ignored = conformance.buffered_vs_sync(FEDPROTO, plugin("sums_ignored"), tmp_path / "ignored", 3)
    assert not ignored.ok and not ignored.error
    assert any(
        p.startswith("server algorithm.protos: synchronous a tensor [10, 256]") and "buffered None" in p
        for p in ignored.problems
    ), ignored.problems
    assert not (tmp_path / "ignored" / "stale").exists()  # the first comparison failed: no stale run
    sized = conformance.buffered_vs_sync(FEDPROTO, plugin("round_sized"), tmp_path / "sized", 3)
    assert sized.error == "the stale buffered run failed: ValueError: sums of 1 parties; a round samples 3"
