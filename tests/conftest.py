"""Suite-wide scheduling: the slow, multi-process tests start first; every test leaves the
algorithm registry (and the Python path plugins extend) and the root logger's handlers as it found
them; and the fixtures several test files take (the command line in-process, a module's HOME, its
sites' folders).

`bash run/test.sh` runs the suite on every core with pytest-xdist (`-n auto --dist load
--maxschedchunk 2`): each worker is handed two tests at a time, in collection order, as it finishes
its last. Starting the slow tests first keeps one long end-to-end test from starting last while the
other workers sit idle; the order of the tests within each group is unchanged, and no test depends
on another's order.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from fedml_moon import registry
from tests.support import ROOT
from tests.support.cli import restored_main


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


# --- the quick tier starts no process -------------------------------------------------------------

_STARTS = frozenset(
    {
        "fedml_moon.fork",  # fedml_moon.conformance.preloaded.start
        "subprocess.Popen",
        "os.posix_spawn",
        "os.fork",
        "os.forkpty",
        "os.exec",
        "os.spawn",
        "os.system",
    }
)
_started: list[str] | None = None
"""What the running quick-tier test started (audit events); None while no quick-tier test runs."""


_PROBES = frozenset({"lscpu", "fc-list", "fc-match", "ldconfig", "gcc", "cc", "ld", "objdump", "uname"})
"""Programs a library runs once to look at the machine, not processes of the test's: loky's count of
physical cores (scikit-learn's t-SNE), matplotlib's first font cache on a fresh machine, ctypes'
`find_library`, `platform`."""


def _watch_starts(event: str, args: tuple) -> None:
    if event == "subprocess.Popen" and os.path.basename(str(args[0])) in _PROBES:
        return
    if _started is not None and event in _STARTS:
        words = args[1] if event == "subprocess.Popen" else args[0] if event == "fedml_moon.fork" else args
        _started.append(f"{event} {' '.join(map(str, words))[:2000]}")


def pytest_configure(config: pytest.Config) -> None:
    sys.addaudithook(_watch_starts)  # an audit hook stays for the process: it watches only while armed


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    return (yield from _watched(item, "its set-up"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    return (yield from _watched(item, "it"))


def _watched(item: pytest.Item, what: str):
    """Watch what `item` starts. A test not marked slow (the quick tier, `run/test.sh --quick`) fails
    if it starts a process: a test that needs one is marked `slow` and says in its docstring why it
    must. With FEDML_MOON_TEST_PROCESSES set (a folder: `run/test.sh` sets it), each test's commands
    are appended there for `benchmarks/suite_budget.py`."""
    global _started
    _started = []
    try:
        result = yield
    finally:
        started, _started = _started, None
        _record(item, started)
    if started and item.get_closest_marker("slow") is None:
        pytest.fail(
            f"{what} started a process but the test is not marked slow (the quick tier starts none): "
            f"{started[0][:300]}; mark it @pytest.mark.slow and say in its docstring why it needs a process",
            pytrace=False,
        )
    return result


def _record(item: pytest.Item, started: list[str]) -> None:
    folder = os.environ.get("FEDML_MOON_TEST_PROCESSES")
    if folder and started:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(os.path.join(folder, f"{worker}.jsonl"), "a") as out:
            out.write(json.dumps({"test": item.nodeid, "started": started}) + "\n")


@pytest.fixture(autouse=True)
def _registry_as_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """Algorithms a test registers (plugins a config names, `register` calls) go with the test."""
    monkeypatch.setattr(registry, "ALGORITHMS", dict(registry.ALGORITHMS))
    monkeypatch.setattr(registry, "_searched", {k: list(v) for k, v in registry._searched.items()})
    monkeypatch.setattr(sys, "path", list(sys.path))


@pytest.fixture(autouse=True)
def _root_logger_as_found() -> Iterator[None]:
    """A handler a test's `main` installs writes to that test's captured output, closed after it: a
    later test's log line would fail on it ("I/O operation on closed file")."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def no_tf32():
    """TF32 convolutions (PyTorch's default on Ampere and later) round the sequential convolutions
    and the batched (grouped) ones differently; the equality is checked in float32."""
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


# --- fixtures several test files take -------------------------------------------------------------


@pytest.fixture
def cli() -> Iterator[Callable[[list[str]], int]]:
    """main(), with what it sets process-wide (root logger, SIGTERM handler) put back afterwards."""
    with restored_main() as main:
        yield main


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One HOME for every process a test module starts (matplotlib builds its font cache once)."""
    return tmp_path_factory.mktemp("home")


@pytest.fixture
def root_cli(monkeypatch: pytest.MonkeyPatch, home: Path) -> Iterator[Callable[[list[str]], int]]:
    """`fedml_moon.cli.main` from the repository root, HOME the module's; what main() sets
    process-wide is put back."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("HOME", str(home))
    with restored_main() as main:
        yield main


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Per-party folders of a site's own images, 40 training and 20 test images a party, for a test
    module's runs (tests/support/site_data.py)."""
    from tests.support.site_data import site_folders  # it loads examples/site_data/write.py

    return site_folders(tmp_path_factory)
