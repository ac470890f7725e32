"""Tests for fedml_moon.adapters.compat: FedML 0.9.6's parts without its package `__init__`s, and its
runner's writes kept in the run's folder."""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import textwrap
from pathlib import Path

import pytest

from fedml_moon.adapters import compat
from tests.support.processes import fresh_python

ROOT = Path(__file__).resolve().parents[1]

# What a server or silo process imports of FedML, and what the probe reports of the process after.
PARTS_PROBE = textwrap.dedent(
    """
    import json, sys
    import fedml_moon.adapters.aggregator, fedml_moon.adapters.trainer, fedml_moon.distributed.managers
    import fedml_moon.distributed.deploy
    from fedml.runner import FedMLRunner
    import fedml, fedml.core, fedml.core.mlops
    heavy = ("fedml", "wandb", "pandas", "sklearn", "scipy", "matplotlib", "torchvision", "torch")
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in heavy and not m.startswith("torch."))
    loaded += ["torch._dynamo"] if "torch._dynamo" in sys.modules else []
    json.dump({
        "loaded": loaded,
        "fedml_init_ran": "init" in vars(fedml),
        "core_init_ran": "ClientTrainer" in vars(fedml.core),
        "mlops_init_ran": "log" in vars(fedml.core.mlops),
        "dlg_attack_imported": "__file__" in vars(sys.modules["fedml.core.security.attack.dlg_attack"]),
    }, sys.stdout)
    """
)


class _NoopFlow:
    """The smallest `algorithm_flow` FedMLRunner accepts."""

    def run(self) -> None:
        return None


@pytest.mark.slow
def test_a_process_imports_fedmls_parts_only(tmp_path: Path) -> None:
    """The trainer, aggregator, managers and runner import without FedML's package __init__ (its
    scheduler, MLOps and device modules, wandb internals), and without pandas, scikit-learn,
    torchvision (FedML's DLG attack module, which imports it, is a stand-in until used), SciPy
    (FedML's defences, DP accountant and contribution assessor: stand-ins too) or matplotlib (a
    process imports it where it draws)."""
    proc = fresh_python(PARTS_PROBE, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout)
    assert not found["fedml_init_ran"] and not found["mlops_init_ran"]
    assert found["core_init_ran"]  # FedML's algorithm frame (ClientTrainer, ServerAggregator) runs whole
    loaded = found["loaded"]
    assert "fedml.core.distributed.fedml_comm_manager" in loaded and "fedml.runner" in loaded
    for never in ("fedml.computing", "fedml.core.mlops.stats_impl", "fedml.core.mlops.mlops_runtime_log"):
        assert not any(m == never or m.startswith(never + ".") for m in loaded), never
    unwanted = ("wandb", "pandas", "sklearn", "scipy", "matplotlib", "torchvision")
    assert not [m for m in loaded if m.split(".")[0] in unwanted], loaded
    assert "torch._dynamo" not in loaded and not found["dlg_attack_imported"]
    assert proc.stderr == "", proc.stderr  # no import warnings either


def test_fedmls_dlg_attack_is_the_real_one_once_used() -> None:
    """The stand-in for FedML's DLG attack module: FedML's attacker, told to run that attack, builds
    it with FedML's own DLGAttack (torchvision imported then), which needs FedML's whole package as it
    always did; the module's other names are the real module's."""
    from fedml.core.security.attack import dlg_attack as early
    from fedml.core.security.fedml_attacker import FedMLAttacker

    with pytest.raises(AttributeError):
        early.__wrapped__  # noqa: B018 (a probe: dunder names never import the module)
    assert "__file__" not in vars(early)
    args = compat.minimal_fedml_args(enable_attack=True, attack_type="dlg", attack_round_num=1)
    with pytest.raises(ImportError, match="fedml.device needs fedml/__init__.py") as stand_in:
        FedMLAttacker().init(args)
    real = sys.modules["fedml.core.security.attack.dlg_attack"]
    assert real is not early and "__file__" in vars(real) and "torchvision" in sys.modules
    where = [Path(entry.frame.code.path) for entry in stand_in.traceback]
    assert Path(real.__file__) in where  # raised inside FedML's own class
    assert early.BaseAttackMethod is real.BaseAttackMethod


def test_fedmls_rdp_analysis_is_the_real_one_once_called() -> None:
    """The stand-in for FedML's RDP analysis (SciPy's importer): FedML's RDP accountant, asked for a
    privacy budget, gets the real module's figures, and the module is the real one after."""
    from fedml.core.dp.budget_accountant import rdp_accountant

    name = "fedml.core.dp.budget_accountant.rdp_analysis"
    orders = [2.0, 8.0, 32.0]
    got = rdp_accountant.compute_rdp(q=0.01, noise_multiplier=1.1, steps=100, orders=orders)
    real = sys.modules[name]
    assert "__file__" in vars(real) and "scipy" in sys.modules
    assert list(got) == list(real.compute_rdp(q=0.01, noise_multiplier=1.1, steps=100, orders=orders))
    assert len(got) == 3 and all(0 < a < b for a, b in zip(got[:-1], got[1:], strict=True))  # grows with α


@pytest.mark.slow
def test_fedmls_whole_package_fails_naming_why(tmp_path: Path) -> None:
    """Canary: FedML's whole package (fedml.init, MLOps) still needs the 2022 libraries it pins (wandb
    internals current wandb lacks), which is why the plugin imports its parts only. If an upgrade makes
    it import, this fails, and the docs' statement can change."""
    proc = fresh_python("import fedml_moon, fedml; fedml.init", tmp_path)
    assert proc.returncode != 0
    assert "fedml.init needs fedml/__init__.py, which failed to import" in proc.stderr
    assert "docs/explanation/fedml-compat.md" in proc.stderr


def test_a_probe_of_a_deferred_package_runs_nothing() -> None:
    """copy, pickle and inspect look up dunder names: those never run a package's __init__."""
    import fedml

    assert compat.use_fedml_parts()
    assert not hasattr(fedml, "__wrapped__") and not hasattr(fedml, "__deepcopy__")
    assert "init" not in vars(fedml)


def test_fedml_files_stay_in_fedml_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards FedMLRunner.run's write of ~/.fedml/fedml_trace/<pid>."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    fedml_home = tmp_path / "run" / ".fedml"
    compat.run_flow(_NoopFlow(), fedml_home, compat.minimal_fedml_args())
    assert list(home.iterdir()) == []
    assert (fedml_home / "fedml_trace" / str(os.getpid())).is_file()


def test_redirect_home_is_idempotent_and_moves(tmp_path: Path) -> None:
    """Guards against double patching; a second call with another home moves the ~ redirect."""
    compat.redirect_home(tmp_path / "one" / ".fedml")
    other = tmp_path / "other" / ".fedml"
    compat.redirect_home(other)
    import fedml.runner

    assert fedml.runner.expanduser("~/.fedml") == str(other)
    assert fedml.runner.expanduser("~user/x") == os.path.expanduser("~user/x")
    assert len(compat.PATCHED_NAMES) == len(compat.HOME_REDIRECTED_MODULES)
    with pytest.raises(ValueError, match="named '.fedml'"):
        compat.redirect_home(tmp_path / "not-dot-fedml")


def test_version_mismatch_warns(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Guards against silently running the 0.9.6 workarounds on another FedML version."""
    real = compat.importlib.metadata.version
    monkeypatch.setattr(compat.importlib.metadata, "version", lambda name: "0.9.7")
    with caplog.at_level(logging.WARNING, logger=compat.__name__):
        assert not compat.check_fedml_version()
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("0.9.7" in m and compat.FEDML_VERSION in m for m in messages)
    monkeypatch.setattr(compat.importlib.metadata, "version", real)
    assert compat.check_fedml_version()


def test_minimal_fedml_args_defaults_and_overrides() -> None:
    """Guards the fields FedML's pieces read without a default (rank, role, worker_num, run_id)."""
    args = compat.minimal_fedml_args(rank=2, client_num_per_round=5, model="resnet")
    assert (args.rank, args.role, args.worker_num, args.model, args.run_id) == (2, "client", 5, "resnet", "0")
    assert compat.minimal_fedml_args().role == "server"
    assert compat.minimal_fedml_args(role="client", worker_num=1).worker_num == 1


_NETWORK_EVENTS = frozenset({"socket.getaddrinfo", "socket.gethostbyname", "socket.connect"})
_AUDIT: dict[str, list | None] = {"events": None}


def _audit(event: str, args: tuple) -> None:
    if _AUDIT["events"] is not None and event in _NETWORK_EVENTS:
        _AUDIT["events"].append((event, repr(args)[:200]))


def test_a_run_never_contacts_fedmls_cloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Docs (deployment modes): "FedML's cloud is never contacted". A standalone run through FedML's
    runner, its trainer and aggregator, with every name lookup and connection of the process recorded
    (an audit hook: it cannot be removed, so it records only while `events` is a list): none."""
    from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
    from tests.support.cli import restored_main

    if not DEBIAN_FASHION_MNIST.is_dir():
        pytest.skip("apt-get install dataset-fashion-mnist")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    sets = ["data_args.max_train_samples=200", "data_args.max_test_samples=100", "train_args.comm_round=1"]
    sets += ["train_args.client_num_in_total=2", "train_args.client_num_per_round=2"]
    sets += ["tracking_args.enable_wandb=false", "device_args.torch_threads=1"]
    argv = ["simulate", "--cf", str(ROOT / "config/fashion_mnist/moon.yaml"), "--output-dir", str(tmp_path)]
    argv += [a for s in sets for a in ("--set", s)]
    sys.addaudithook(_audit)
    events: list = []
    _AUDIT["events"] = events
    socket.getaddrinfo("127.0.0.1", 1)  # the hook sees a lookup: this test can fail
    assert [e for e, _ in events] == ["socket.getaddrinfo"]
    events.clear()
    try:
        with restored_main() as main:
            assert main(argv) == 0
    finally:
        _AUDIT["events"] = None
    assert events == []
    assert not (tmp_path / "home" / ".fedml").exists()
