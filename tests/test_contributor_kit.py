"""An algorithm written outside the package: registered through an entry point, and run through the
conformance suite (`fedml-moon check`), which also fails where an algorithm breaks its rules."""

from __future__ import annotations

import logging
import shlex
import signal
import sys
from dataclasses import dataclass
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from fedml_moon import conformance, registry
from fedml_moon.algorithms.base import ClientAlgorithm, ServerAlgorithm
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from tests.support.doc_commands import KIT_CHECK

ROOT = Path(__file__).resolve().parent.parent
needs_fmnist = pytest.mark.skipif(
    not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist"
)


def test_the_installed_example_is_registered_through_its_entry_point():
    spec = registry.get_algorithm("fedprox_head")
    assert spec.client.__module__ == "fedml_moon_headprox" and spec.summary == "FedProx on the head only"


def test_entry_points_that_do_not_load_are_named_and_skipped(monkeypatch, caplog):
    spec = registry.AlgorithmSpec("kit_demo", ClientAlgorithm, ServerAlgorithm, dict, "demo")
    monkeypatch.setattr(sys.modules[__name__], "demo_spec", lambda: spec, raising=False)
    points = [
        EntryPoint("broken", "no_such_module_anywhere:spec", registry.ENTRY_POINT_GROUP),
        EntryPoint("demo", f"{__name__}:demo_spec", registry.ENTRY_POINT_GROUP),
        EntryPoint("wrong", "os:getcwd", registry.ENTRY_POINT_GROUP),
    ]
    monkeypatch.setattr(registry, "entry_points", lambda group: points)
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    monkeypatch.setattr(registry, "ALGORITHMS", dict(registry.ALGORITHMS))
    assert registry.load_plugins() == ["kit_demo"]
    assert "algorithm plugin broken" in caplog.text and "not an AlgorithmSpec" in caplog.text


@dataclass
class _NoOptions:
    pass


class _SetUploader(ClientAlgorithm):
    """Breaks the rules: sends a Python set, which no transport can carry without pickle."""

    def finish(self, r, ctx, done):
        payload = super().finish(r, ctx, done)
        payload["seen"] = {1, 2}
        return payload


@needs_fmnist
def test_payload_check_names_a_field_no_transport_can_carry(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    spec = registry.AlgorithmSpec("kit_bad", _SetUploader, ServerAlgorithm, _NoOptions, "bad")
    monkeypatch.setattr(registry, "ALGORITHMS", {**registry.ALGORITHMS, "kit_bad": spec})
    overrides = [*conformance.TINY, "train_args.algorithm=kit_bad", "train_args.comm_round=1"]
    problems = conformance.payload_problems(ROOT / "config/fashion_mnist/fedavg.yaml", overrides, tmp_path)
    assert problems and "upload: cannot encode a set" in problems[0]
    assert "upload has unexpected ['seen']" in problems[-1] and "upload_spec" in problems[-1]


@needs_fmnist
@pytest.mark.slow
def test_compare_sees_a_different_run(tmp_path):
    config = ROOT / "config/fashion_mnist/fedavg.yaml"
    a = conformance.run_mode("standalone", config, list(conformance.TINY), tmp_path / "a")
    b = conformance.run_mode(
        "standalone", config, [*conformance.TINY, "common_args.random_seed=1"], tmp_path / "b"
    )
    diff, problems = conformance.compare(a, b)
    assert diff > 1e-3 and problems


@needs_fmnist
@pytest.mark.slow
def test_the_example_passes_the_conformance_suite(tmp_path, monkeypatch, capsys):
    """The tutorial's command as written, from the repository root: its relative --cf must reach the
    check's processes, which run elsewhere."""
    from fedml_moon.cli import main

    words = shlex.split(KIT_CHECK)
    assert words[0] == ".venv/bin/fedml-moon"  # the entry point of main()
    monkeypatch.chdir(ROOT)
    for key, value in conformance.process_env(tmp_path).items():
        monkeypatch.setenv(key, value)  # the check's processes: HOME in tmp, mpirun as root
    root = logging.getLogger()
    handlers, level, sigterm = root.handlers[:], root.level, signal.getsignal(signal.SIGTERM)
    try:
        code = main(words[1:])
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        signal.signal(signal.SIGTERM, sigterm)
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert "fedprox_head: 14 of 14 checks passed" in out
    stacked = (
        "PASS  stacked parties: one local round from identical inputs equals sequential (float32, 1e-05)"
    )
    assert f"{stacked} (groups of [2] parties trained together)" in out  # one form: it runs stacked
    for said in ("over every round in float64", "stopped after round 1 and resumed", "secure aggregation"):
        assert f"PASS  {said}" in out or f"PASS  stacked parties equal sequential {said}" in out


def test_new_writes_a_plugin_package_that_loads_without_installing(tmp_path, monkeypatch):
    from fedml_moon.config.load import load_config
    from fedml_moon.kit import write_plugin

    monkeypatch.setattr(registry, "ALGORITHMS", dict(registry.ALGORITHMS))
    monkeypatch.setattr(sys, "path", list(sys.path))
    written = write_plugin("fed_demo", tmp_path / "fed_demo")
    names = sorted(str(p.relative_to(tmp_path)) for p in written)
    assert names == [
        "fed_demo/README.md",
        "fed_demo/fed_demo.yaml",
        "fed_demo/fedml_moon_fed_demo/__init__.py",
        "fed_demo/pyproject.toml",
        "fed_demo/tests/test_fed_demo.py",
    ]
    cfg = load_config(tmp_path / "fed_demo" / "fed_demo.yaml", [])  # its plugins key, beside the config
    spec = registry.get_algorithm("fed_demo")
    assert cfg.train_args.algorithm == "fed_demo" and spec.client.__name__ == "FedDemoClient"
    assert spec.server.__name__ == "FedDemoServer" and cfg.algorithm_args.label_smoothing == 0.0
    code = (tmp_path / "fed_demo" / "fedml_moon_fed_demo" / "__init__.py").read_text()
    for hook in ("context", "loss", "before_step", "after_step", "finish", "personal_state"):
        assert f"    def {hook}(" in code  # both sides' hooks, each with what the default does
    for hook in ("download", "upload_spec", "aggregate", "aggregate_sums", "state", "load_state"):
        assert f"    def {hook}(" in code
    test = (tmp_path / "fed_demo" / "tests" / "test_fed_demo.py").read_text()
    assert '"check", "fed_demo", "--cf"' in test
    assert 'fed_demo = "fedml_moon_fed_demo:spec"' in (tmp_path / "fed_demo" / "pyproject.toml").read_text()


@pytest.mark.parametrize(
    ("name", "says"),
    [("FedDemo", "lowercase identifier"), ("1st", "lowercase identifier"), ("class", "lowercase identifier")]
    + [("moon", "an algorithm of that name exists"), ("fedprox_head", "an algorithm of that name exists")],
)
def test_new_refuses_a_name_it_cannot_use(tmp_path, name, says):
    from fedml_moon.config.load import ConfigError
    from fedml_moon.kit import write_plugin

    with pytest.raises(ConfigError, match=says):
        write_plugin(name, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_new_leaves_a_folder_with_files_alone(tmp_path):
    from fedml_moon.config.load import ConfigError
    from fedml_moon.kit import write_plugin

    (tmp_path / "mine.txt").write_text("kept")
    with pytest.raises(ConfigError, match="is not empty"):
        write_plugin("fed_demo", tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]
