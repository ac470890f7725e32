"""Tests for fedml_moon.adapters.compat: each test guards one FedML 0.9.6 defect the module works around."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from fedml_moon.adapters import compat

_NETWORK_EVENTS = frozenset({"socket.getaddrinfo", "socket.connect", "socket.gethostbyname"})
_AUDIT: dict[str, Any] = {"installed": False, "recording": False, "events": []}

SIMULATION = {"training_type": "simulation", "backend": "sp"}
CROSS_SILO_SERVER = {"training_type": "cross_silo", "backend": "GRPC", "rank": 0}
CROSS_SILO_CLIENT = {"training_type": "cross_silo", "backend": "GRPC", "rank": 1}


def _audit_hook(event: str, args: tuple[Any, ...]) -> None:
    if _AUDIT["recording"] and event in _NETWORK_EVENTS:
        _AUDIT["events"].append((event, repr(args)[:200]))


@contextmanager
def _network_events() -> Iterator[list[tuple[str, str]]]:
    """Record the network audit events raised in the block (audit hooks cannot be removed: gate one)."""
    if not _AUDIT["installed"]:
        sys.addaudithook(_audit_hook)
        _AUDIT["installed"] = True
    events: list[tuple[str, str]] = []
    _AUDIT["events"] = events
    _AUDIT["recording"] = True
    try:
        yield events
    finally:
        _AUDIT["recording"] = False


class _NoopFlow:
    """The smallest `algorithm_flow` FedMLRunner accepts."""

    def run(self) -> None:
        return None


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A throwaway $HOME, so the real one is never touched even if a workaround fails."""
    path = tmp_path / "home"
    path.mkdir()
    monkeypatch.setenv("HOME", str(path))
    return path


@pytest.fixture
def fedml_home(tmp_path: Path, home: Path) -> Path:
    """The directory FedML should use instead of ~/.fedml; importing FedML here keeps it out of timings."""
    import fedml  # noqa: F401

    return tmp_path / "run" / ".fedml"


@pytest.mark.parametrize(
    "kind",
    [SIMULATION, CROSS_SILO_SERVER, CROSS_SILO_CLIENT],
    ids=["sp", "cross_silo_server", "cross_silo_client"],
)
def test_init_makes_no_network_call(fedml_home: Path, kind: dict[str, Any]) -> None:
    """Guards fetch_config's five untimed POSTs to FedML's config server, and check_env's network probes."""
    args = compat.minimal_fedml_args(**kind)
    with _network_events() as events:
        start = time.perf_counter()
        out = compat.init_fedml(args, fedml_home)
        elapsed = time.perf_counter() - start
    assert events == []
    assert elapsed < 2.0
    assert out.device_id == compat.LOCAL_DEVICE_ID


def test_init_leaves_logging_and_streams_alone(fedml_home: Path) -> None:
    """Guards fedml.init's log setup (root handlers, stdout.write, excepthook) and implicit basicConfig."""
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    root.handlers[:] = []  # with no handlers, FedML's logging.info(...) runs logging.basicConfig()
    root.setLevel(logging.ERROR)
    try:
        before = (
            logging.root,
            root.handlers[:],
            root.level,
            sys.stdout.write,
            sys.stderr.write,
            sys.excepthook,
        )
        compat.init_fedml(compat.minimal_fedml_args(), fedml_home)
        after = (
            logging.root,
            root.handlers[:],
            root.level,
            sys.stdout.write,
            sys.stderr.write,
            sys.excepthook,
        )
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
    assert after == before


def test_init_writes_nothing_in_cwd(
    fedml_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guards should_init_logs=True, whose log setup runs before log_file_dir is set and creates ./logs."""
    from fedml.core.mlops.mlops_runtime_log import MLOpsRuntimeLog

    monkeypatch.setattr(MLOpsRuntimeLog, "_log_sdk_instance", None)  # FedML keeps the first one it made
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    compat.init_fedml(compat.minimal_fedml_args(), fedml_home)
    assert list(cwd.iterdir()) == []


def test_init_prints_nothing(fedml_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Guards fedml.init's print of client_id_list for cross-silo runs (logged at debug level instead)."""
    compat.init_fedml(compat.minimal_fedml_args(**CROSS_SILO_SERVER), fedml_home)
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("caller_value", [None, "dev"])
def test_init_does_not_leak_fedml_env(
    fedml_home: Path, monkeypatch: pytest.MonkeyPatch, caller_value: str | None
) -> None:
    """Guards fedml.init's `.env` loading (override=True) and its FEDML_ENV_VERSION write into os.environ."""
    services = fedml_home / "global_services"
    services.mkdir(parents=True)
    (services / ".env").write_text("FEDML_ENV_VERSION='release'\nFEDML_MOON_TEST_KEY='from-env-file'\n")
    monkeypatch.delenv("FEDML_MOON_TEST_KEY", raising=False)
    if caller_value is None:
        monkeypatch.delenv("FEDML_ENV_VERSION", raising=False)
    else:
        monkeypatch.setenv("FEDML_ENV_VERSION", caller_value)
    compat.init_fedml(compat.minimal_fedml_args(), fedml_home)
    assert os.environ.get("FEDML_ENV_VERSION") == caller_value
    assert "FEDML_MOON_TEST_KEY" not in os.environ


def test_fedml_files_stay_in_fedml_home(fedml_home: Path, home: Path) -> None:
    """Guards FedML's writes under ~/.fedml (run dirs, device ids, .env, FedMLRunner's fedml_trace/<pid>)."""
    args = compat.init_fedml(compat.minimal_fedml_args(), fedml_home)
    import fedml

    fedml.FedMLRunner(args, None, None, None, algorithm_flow=_NoopFlow()).run()
    assert list(home.iterdir()) == []
    assert (fedml_home / "fedml_trace" / str(os.getpid())).is_file()
    assert (fedml_home / "global_services" / ".env").is_file()
    assert Path(args.current_running_dir).is_relative_to(fedml_home)
    assert Path(args.log_file_dir).is_relative_to(fedml_home / "fedml-server")


def test_offline_fetch_config_keeps_fedml_attributes(fedml_home: Path) -> None:
    """Guards that replacing fetch_config (network defect) still sets the attributes FedML reads later."""
    args = compat.init_fedml(compat.minimal_fedml_args(**CROSS_SILO_CLIENT), fedml_home)
    assert Path(args.log_file_dir).is_relative_to(fedml_home / "fedml-client")
    assert (args.version, args.config_version, args.cloud_region) == ("release", "release", "")
    assert args.os_name and args.device_id == compat.LOCAL_DEVICE_ID


def test_apply_workarounds_is_idempotent_and_recorded(fedml_home: Path, tmp_path: Path) -> None:
    """Guards against double patching; a second call with another home moves the ~ redirect."""
    compat.apply_workarounds(fedml_home)
    other = tmp_path / "other" / ".fedml"
    compat.apply_workarounds(other)
    import fedml.runner

    assert fedml.runner.expanduser("~/.fedml") == str(other)
    assert len(compat.PATCHED_NAMES) == 1 + len(compat.HOME_REDIRECTED_MODULES)
    with pytest.raises(ValueError):
        compat.apply_workarounds(tmp_path / "not-dot-fedml")


def test_version_mismatch_warns(
    fedml_home: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Guards against silently running the 0.9.6 workarounds on another FedML version."""
    import fedml

    monkeypatch.setattr(fedml, "__version__", "0.9.7")
    with caplog.at_level(logging.WARNING, logger=compat.__name__):
        compat.apply_workarounds(fedml_home)
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("0.9.7" in m and compat.FEDML_VERSION in m for m in messages)
    monkeypatch.setattr(fedml, "__version__", compat.FEDML_VERSION)
    assert compat.check_fedml_version()


def test_minimal_fedml_args_defaults_and_overrides() -> None:
    """Guards the fields fedml.init/FedMLRunner read without a default (rank, role, worker_num, run_id)."""
    args = compat.minimal_fedml_args(rank=2, client_num_per_round=5, model="resnet")
    assert (args.rank, args.role, args.worker_num, args.model, args.run_id) == (2, "client", 5, "resnet", "0")
    assert compat.minimal_fedml_args().role == "server"
    assert compat.minimal_fedml_args(role="client", worker_num=1).worker_num == 1


_UNPATCHED_PROBE = textwrap.dedent(
    """
    import json, os, sys

    class NetworkAttempt(BaseException):
        pass

    def hook(event, args):
        if event == "socket.getaddrinfo":
            raise NetworkAttempt(args[0])

    import fedml
    from fedml_moon.adapters.compat import minimal_fedml_args

    hooks = (sys.excepthook, sys.stdout.write)
    sys.addaudithook(hook)
    network = None
    try:
        fedml.init(minimal_fedml_args())
    except NetworkAttempt as exc:
        network = str(exc)
    result = {
        "network": network,
        "excepthook_changed": sys.excepthook is not hooks[0],
        "stdout_write_changed": sys.stdout.write != hooks[1],
        "home_written": os.path.isdir(os.path.join(os.environ["HOME"], ".fedml")),
    }
    with open(sys.argv[1], "w") as f:
        json.dump(result, f)
    """
)


def test_unpatched_fedml_still_has_the_defects(tmp_path: Path) -> None:
    """Canary: plain fedml.init still goes online, takes over logging and writes ~/.fedml.

    When a FedML upgrade fixes these, this test fails and the matching workaround can be dropped.
    """
    home = tmp_path / "home"
    home.mkdir()
    repo_root = Path(compat.__file__).resolve().parents[2]
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(repo_root)}
    env.pop("FEDML_ENV_VERSION", None)
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, "-c", _UNPATCHED_PROBE, str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result == {
        "network": "open.fedml.ai",
        "excepthook_changed": True,
        "stdout_write_changed": True,
        "home_written": True,
    }
