"""Every workaround the plugin needs for FedML 0.9.6; nothing else in the project patches FedML.

The defects, all on the path `fedml.init(...)` -> `fedml.FedMLRunner(...).run()`:

* `fedml.core.mlops.fetch_config` POSTs to FedML's cloud config endpoint up to five times, with no
  timeout and whatever `using_mlops` says (2.5 s where DNS fails fast, minutes where packets are
  dropped). It is replaced by `_offline_fetch_config`, which sets the same attributes offline.
* FedML writes under `~/.fedml` (run dirs, device id files, a `.env`, `fedml_trace/<pid>`). The
  module-level `expanduser` names of the modules in `HOME_REDIRECTED_MODULES` are pointed at the
  parent of the caller's `fedml_home`, so FedML's `~/.fedml` tree becomes `fedml_home`.
* `fedml.init` loads that `.env` into `os.environ` with override=True and adds FEDML_ENV_VERSION;
  `init_fedml` puts `os.environ` back as it found it (except `KEPT_ENV_KEYS`).
* `should_init_logs=True` replaces the root logger, `sys.stdout.write` and `sys.excepthook`, and
  FedML's root-level `logging.info` calls run `logging.basicConfig` when the root logger has no
  handlers; `init_fedml` passes `should_init_logs=False` and restores anything still changed.
* `check_env=True` runs `collect_env()` (prints, probes the network) for non-simulation runs;
  `init_fedml` passes `check_env=False`. FedML's `print` calls during init go to a debug log, and so
  does its root-level `args.rank = 0, args.worker_num = ...` line (every process initialises FedML as
  a one-process simulation, so a silo would announce rank 0).
* Importing FedML warns that `pkg_resources` is deprecated, and importing `requests` (which FedML
  does) warns that its urllib3 / chardet versions are not the ones it was tested with, in every
  process. `quiet_import_warnings` (run when `fedml_moon` is imported) ignores exactly these two.

`import fedml` takes seconds, so FedML is imported inside functions only.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import logging
import os
import platform
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)

FEDML_VERSION = "0.9.6"
"""The FedML version the workarounds below were written against and measured on."""

LOCAL_DEVICE_ID = "fedml-moon-local"
"""The device id `_offline_fetch_config` reports (FedML would derive one from the hardware)."""

HOME_REDIRECTED_MODULES: tuple[str, ...] = (
    "fedml.runner",
    "fedml.computing.scheduler.slave.client_constants",
    "fedml.computing.scheduler.master.server_constants",
    "fedml.computing.scheduler.comm_utils.sys_utils",
    "fedml.core.distributed.communication.s3.remote_storage",
)
"""FedML modules on the init/run path (simulation and cross-silo) whose `expanduser` is redirected."""

PATCHED_NAMES: tuple[str, ...] = ("fedml.core.mlops.fetch_config",) + tuple(
    f"{module}.expanduser" for module in HOME_REDIRECTED_MODULES
)
"""Every FedML attribute `apply_workarounds` replaces, as `module.name`."""

KEPT_ENV_KEYS: tuple[str, ...] = ("KMP_DUPLICATE_LIB_OK",)
"""Variables `fedml.init` sets on purpose and `init_fedml` leaves set (FedML's guard against the
duplicate-OpenMP-runtime abort; a process setting, not FedML configuration)."""

_FEDML_HOME_NAME = ".fedml"
_MISSING = object()

IGNORED_IMPORT_WARNINGS: tuple[tuple[str, type[Warning], str], ...] = (
    # requests' RequestsDependencyWarning (its class cannot be named without importing requests)
    (r"urllib3 \(.*\) or chardet \(.*\)/charset_normalizer \(.*\) doesn't match", Warning, r"requests\Z"),
    # FedML's `from pkg_resources import parse_version` (setuptools' deprecation notice)
    (r"pkg_resources is deprecated as an API", UserWarning, r"fedml(\.|\Z)"),
)
"""(message, category, module) regular expressions of the warnings `quiet_import_warnings` ignores."""


CHILD_WARNINGS: tuple[str, ...] = (
    "ignore:urllib3 (:Warning",
    "ignore:pkg_resources is deprecated as an API:UserWarning",
)
"""The same two warnings as `PYTHONWARNINGS` entries (message prefixes), for the Python processes this
one starts (W&B's service process imports requests and pkg_resources too)."""


def quiet_import_warnings() -> None:
    """Ignore the two warnings every process printed on importing FedML (IGNORED_IMPORT_WARNINGS), in
    this process and, through PYTHONWARNINGS, in the Python processes it starts; must run before
    `requests` and `fedml` are imported (`fedml_moon/__init__.py` does it)."""
    for message, category, module in IGNORED_IMPORT_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    entries = [e for e in os.environ.get("PYTHONWARNINGS", "").split(",") if e]
    os.environ["PYTHONWARNINGS"] = ",".join(entries + [e for e in CHILD_WARNINGS if e not in entries])


class _RankLineToDebug(logging.Filter):
    """On the root logger during `fedml.init`: its `args.rank = ...` info line goes to a debug log."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("args.rank = ") and f"{os.sep}fedml{os.sep}" in record.pathname:
            log.debug("fedml.init logged: %s", message)
            return False
        return True


class _HomeRedirect:
    """Stands in for `os.path.expanduser` inside FedML modules: `~` means `home`, not the user's home."""

    def __init__(self) -> None:
        self.home: Path | None = None

    def __call__(self, path: Any) -> Any:
        text = os.fspath(path)
        if (
            self.home is not None
            and isinstance(text, str)
            and (text == "~" or text[:2] in ("~/", "~" + os.sep))
        ):
            return str(self.home) + text[1:]
        return os.path.expanduser(text)


_HOME_REDIRECT = _HomeRedirect()


def check_fedml_version() -> bool:
    """Return True when the installed FedML is `FEDML_VERSION`; otherwise log a warning and return False."""
    import fedml

    installed = str(getattr(fedml, "__version__", "unknown"))
    if installed == FEDML_VERSION:
        return True
    log.warning(
        "fedml %s is installed, but the workarounds in %s were measured on fedml %s; "
        "check them against this version (tests/test_compat.py)",
        installed,
        __name__,
        FEDML_VERSION,
    )
    return False


def _offline_fetch_config(args: Any, version: str = "release") -> bool:
    """Offline `fedml.core.mlops.fetch_config`: the attributes FedML sets before its network loop, no network.

    Returns False, as FedML's own function does when the config server cannot be reached (in which
    case it sets no mqtt/s3 config paths and no `log_server_url` either).
    """
    from fedml.computing.scheduler.master.server_constants import ServerConstants
    from fedml.computing.scheduler.slave.client_constants import ClientConstants

    system = platform.system()
    args.current_running_dir = ClientConstants.get_fedml_home_dir()
    args.os_name = "MacOS" if system == "Darwin" else system
    args.version = version
    constants = ServerConstants if args.rank == 0 else ClientConstants
    args.log_file_dir = constants.get_log_file_dir()
    args.device_id = LOCAL_DEVICE_ID
    args.config_version = version
    args.cloud_region = ""
    log.debug("FedML config fetch skipped (offline); log_file_dir=%s", args.log_file_dir)
    return False


def _replace(module: ModuleType, name: str, replacement: object) -> None:
    """Set `module.name` to `replacement` unless it already is; fail loudly if FedML lacks the name."""
    current = getattr(module, name, _MISSING)
    if current is replacement:
        return
    if current is _MISSING:
        raise RuntimeError(f"{module.__name__}.{name} does not exist; FedML changed, revisit {__name__}")
    setattr(module, name, replacement)
    log.debug("patched %s.%s", module.__name__, name)


def apply_workarounds(fedml_home: Path) -> None:
    """Patch FedML (idempotent): no config fetch over the network, and `fedml_home` in place of `~/.fedml`.

    FedML builds every path as `join(expanduser("~"), ".fedml", ...)`, so `fedml_home` must be named
    `.fedml`; `~` is redirected to its parent. A later call with another `fedml_home` moves the redirect.
    """
    fedml_home = Path(os.path.abspath(fedml_home))
    if fedml_home.name != _FEDML_HOME_NAME:
        raise ValueError(f"fedml_home must be a directory named {_FEDML_HOME_NAME!r}, got {fedml_home}")
    check_fedml_version()
    _HOME_REDIRECT.home = fedml_home.parent
    _replace(importlib.import_module("fedml.core.mlops"), "fetch_config", _offline_fetch_config)
    for module_name in HOME_REDIRECTED_MODULES:
        _replace(importlib.import_module(module_name), "expanduser", _HOME_REDIRECT)


def _write_override(stream: object) -> object:
    """The instance-level `write` set on a stream (as FedML's log setup does), or `_MISSING`."""
    return getattr(stream, "__dict__", {}).get("write", _MISSING)


def _restore_write(stream: Any, saved: object) -> None:
    if saved is _MISSING:
        with contextlib.suppress(AttributeError):
            delattr(stream, "write")
    else:
        stream.write = saved


@dataclass(frozen=True)
class _ProcessState:
    """The process-wide state FedML's init may change: root logger, standard streams, excepthook."""

    root: logging.Logger
    handlers: tuple[logging.Handler, ...]
    level: int
    streams: dict[str, tuple[Any, object]]
    excepthook: Callable[..., Any]

    @classmethod
    def capture(cls) -> _ProcessState:
        root = logging.getLogger()
        streams = {
            name: (getattr(sys, name), _write_override(getattr(sys, name))) for name in ("stdout", "stderr")
        }
        return cls(root, tuple(root.handlers), root.level, streams, sys.excepthook)

    def restore(self) -> list[str]:
        """Undo any change since `capture`; return what had changed."""
        changed: list[str] = []
        if logging.root is not self.root:
            logging.root = self.root  # type: ignore[misc]
            changed.append("logging.root")
        if tuple(self.root.handlers) != self.handlers:
            self.root.handlers[:] = self.handlers
            changed.append("root logger handlers")
        if self.root.level != self.level:
            self.root.setLevel(self.level)
            changed.append("root logger level")
        for name, (stream, write) in self.streams.items():
            if getattr(sys, name) is not stream:
                setattr(sys, name, stream)
                changed.append(f"sys.{name}")
            if _write_override(stream) is not write:
                _restore_write(stream, write)
                changed.append(f"sys.{name}.write")
        if sys.excepthook is not self.excepthook:
            sys.excepthook = self.excepthook
            changed.append("sys.excepthook")
        return changed


def _restore_environ(before: dict[str, str]) -> list[str]:
    """Put `os.environ` back to `before` (keys in `KEPT_ENV_KEYS` aside); return the keys restored."""
    restored: list[str] = []
    for key in sorted(set(os.environ) | set(before)):
        old, new = before.get(key), os.environ.get(key)
        if key in KEPT_ENV_KEYS or old == new:
            continue
        if old is None:
            del os.environ[key]
        else:
            os.environ[key] = old
        restored.append(key)
    return restored


def init_fedml(args: argparse.Namespace, fedml_home: Path) -> argparse.Namespace:
    """`fedml.init` without its network calls, its writes under `~`, or lasting process-wide changes.

    Runs `apply_workarounds(fedml_home)`, then `fedml.init(args, check_env=False,
    should_init_logs=False)`. Afterwards the root logger (object, handlers, level), `sys.stdout`,
    `sys.stderr` (and their `write`), `sys.excepthook` and `os.environ` are as they were before the
    call; FedML's prints during init are logged at debug level. Returns FedML's args.

    FedML's later calls to `fedml.get_env_version()` reload `fedml_home/global_services/.env` into
    `os.environ`; that file holds only what FedML itself wrote there (FEDML_ENV_VERSION=release).
    """
    apply_workarounds(fedml_home)
    import fedml

    state = _ProcessState.capture()
    environ = dict(os.environ)
    printed = io.StringIO()
    rank_line = _RankLineToDebug()
    state.root.addFilter(rank_line)
    try:
        with contextlib.redirect_stdout(printed):
            fedml_args = fedml.init(args, check_env=False, should_init_logs=False)
    finally:
        state.root.removeFilter(rank_line)
        changed = state.restore()
        restored_env = _restore_environ(environ)
    if changed:
        log.debug("restored process state fedml.init changed: %s", ", ".join(changed))
    if restored_env:
        log.debug("restored os.environ keys fedml.init changed: %s", ", ".join(restored_env))
    for line in printed.getvalue().splitlines():
        if line.strip():
            log.debug("fedml.init printed: %s", line)
    return fedml_args


def minimal_fedml_args(**overrides: Any) -> argparse.Namespace:
    """A Namespace that `fedml.init` and `fedml.FedMLRunner` accept; `overrides` win over the defaults.

    The defaults describe a single-process simulation. For cross-silo pass
    `training_type="cross_silo"`, a `backend` and `rank`; `role` follows `rank` (0: "server", else
    "client") and `worker_num` follows `client_num_per_round` unless given.
    """
    values: dict[str, Any] = {
        "training_type": "simulation",
        "backend": "sp",
        "scenario": "horizontal",
        "rank": 0,
        "run_id": "0",
        "random_seed": 0,
        "using_mlops": False,
        "enable_tracking": False,
        "enable_wandb": False,
        "sys_perf_profiling": False,
        "comm_round": 1,
        "client_num_in_total": 2,
        "client_num_per_round": 2,
        "dataset": "mnist",
        "model": "lr",
        "federated_optimizer": "FedAvg",
    }
    values.update(overrides)
    values.setdefault("role", "server" if int(values["rank"]) == 0 else "client")
    values.setdefault("worker_num", values["client_num_per_round"])
    return argparse.Namespace(**values)
