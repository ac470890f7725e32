"""Every workaround the plugin needs for FedML 0.9.6; nothing else in the project patches FedML or any
other third-party library.

FedML 0.9.6 is the host: the plugin's trainer and aggregator are its `ClientTrainer` and
`ServerAggregator`, its managers are `FedMLCommManager`s exchanging FedML `Message`s, and every run goes
through `FedMLRunner(..., algorithm_flow=...)`. Those pieces import on Python 3.11 to 3.13 beside
NumPy 2, a current wandb, protobuf and paho-mqtt 2; the rest of FedML does not, and is not imported:

* `import fedml` runs `fedml/__init__.py`, which imports FedML's scheduler, MLOps, device and
  environment modules (about 6 s and 1 GB), and through `fedml.core.mlops` wandb internals that current
  wandb releases no longer have (`wandb.sdk.internal.ipu`, `.tpu`, `.settings_static`,
  `wandb.vendor.pynvml`). Importing any `fedml.x.y` runs the `__init__` of every package above it
  first. `use_fedml_parts` registers `fedml`, `fedml.core` and `fedml.core.mlops` (FEDML_PARTS) as
  packages whose `__init__` runs at the first use of a name it defines, not when a submodule is
  imported: `fedml.core.distributed...` and `fedml.runner` import without `fedml/__init__.py`, and
  `from fedml.core import ClientTrainer` runs `fedml/core/__init__.py` (FedML's algorithm frame: a
  second) with `fedml.core.mlops` still unrun. `fedml_moon/__init__.py` calls it, before anything
  imports FedML.
* FedML's algorithm frame imports FedML's attacks, and its gradient-inversion (DLG) attack imports
  torchvision, whose import takes `torch._dynamo` with it: 1.3 s of every server's and silo's start,
  for an attack the plugin never enables; its defences, its DP accountant and its contribution
  assessor import SciPy (0.3 s more), for features the plugin never enables either (its own DP and
  robust aggregation are its own). `use_fedml_parts` registers a stand-in for each of those modules
  (STAND_INS): calling what FedML takes from it (constructing `DLGAttack`, calling `compute_rdp`),
  or using any other name of it, imports the real module first. A run whose network is
  torchvision's imports torchvision where it builds the network.
* `fedml.init` is therefore not called. What it did for the plugin's processes (seeding the global
  generators, which every run seeds itself; FedML's MLOps and device set-up, which the plugin turns
  off) is not needed; what it did wrong (five untimed POSTs to FedML's cloud, writes under `~/.fedml`,
  its own root logger and excepthook) is gone with it.
* `FedMLRunner.run` writes `~/.fedml/fedml_trace/<pid>`: `run_flow` points the `expanduser` of
  `fedml.runner` at the run's own `.fedml` folder, so FedML's `~/.fedml` is that folder.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import logging
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from fedml_moon.run_folder import FEDML_HOME

log = logging.getLogger(__name__)

FEDML_VERSION = "0.9.6"
"""The FedML version the workarounds below were written against and measured on."""

FEDML_PARTS: tuple[str, ...] = ("fedml", "fedml.core", "fedml.core.mlops")
"""FedML packages whose `__init__` waits for the first use of a name it defines (`use_fedml_parts`)."""

STAND_INS: dict[str, tuple[str, ...]] = {
    "fedml.core.security.attack.dlg_attack": ("DLGAttack",),
    "fedml.core.security.defense.cross_round_defense": ("CrossRoundDefense",),
    "fedml.core.security.defense.three_sigma_defense": ("ThreeSigmaDefense",),
    "fedml.core.security.defense.three_sigma_defense_foolsgold": ("ThreeSigmaDefense_Foolsgold",),
    "fedml.core.security.defense.three_sigma_geomedian_defense": ("ThreeSigmaGeoMedianDefense",),
    "fedml.core.dp.budget_accountant.rdp_analysis": ("compute_rdp",),
    "fedml.core.contribution.mr_shapley_value": ("MRShapleyValue",),
}
"""FedML modules on the plugin's path that only FedML's own attacks, defences, DP accountant and
contribution assessor use, each with the classes (or functions) FedML takes from it at import: the
module is imported when one of them is called (`use_fedml_parts`)."""

HOME_REDIRECTED_MODULES: tuple[str, ...] = ("fedml.runner",)
"""FedML modules on the plugin's path that write under `~/.fedml`; their `expanduser` is redirected."""

PATCHED_NAMES: tuple[str, ...] = tuple(f"{module}.expanduser" for module in HOME_REDIRECTED_MODULES)
"""Every FedML attribute `redirect_home` replaces, as `module.name`."""


_MISSING = object()


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


def _deferred_package(name: str, path: list[str] | None) -> ModuleType | None:
    """Register package `name` (found on `path`) with its `__init__` not yet run; the first lookup of a
    name the module lacks runs it, in the same module object, and answers from it."""
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return None
    module = importlib.util.module_from_spec(spec)

    def complete(attr: str) -> Any:
        if attr.startswith("__"):  # probes (copy, pickle, inspect) never run a package's __init__
            raise AttributeError(f"module {name!r} has no attribute {attr!r}")
        del module.__dict__["__getattr__"]
        log.debug("running %s/__init__.py (for %s)", name, attr)
        try:
            spec.loader.exec_module(module)  # type: ignore[union-attr]
        except ImportError as err:
            raise ImportError(
                f"{name}.{attr} needs {name}/__init__.py, which failed to import ({err}); fedml_moon "
                "uses FedML's trainer, aggregator, managers and runner only, and FedML's full package "
                "needs the 2022 libraries it pins (docs/explanation/fedml-compat.md)"
            ) from err
        return getattr(module, attr)

    module.__getattr__ = complete  # type: ignore[method-assign]
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        sys.modules[parent].__dict__.setdefault(child, module)
    return module


def _stand_in(name: str, classes: tuple[str, ...]) -> None:
    """Register a stand-in for module `name`: constructing one of `classes`, or using any other name
    the module defines, imports the real module (in its place in sys.modules) and answers from it."""
    stand_in = ModuleType(name, f"stands in for {name} until it is used ({__name__})")

    def real() -> ModuleType:
        if sys.modules.get(name) is stand_in:
            del sys.modules[name]
            log.debug("importing %s (a stand-in until now)", name)
        return importlib.import_module(name)

    def other(attr: str) -> Any:
        if attr.startswith("__"):  # probes never import the module
            raise AttributeError(f"module {name!r} has no attribute {attr!r}")
        return getattr(real(), attr)

    for cls in classes:

        def construct(_cls: type, *args: Any, _name: str = cls, **kwargs: Any) -> Any:
            return getattr(real(), _name)(*args, **kwargs)

        setattr(stand_in, cls, type(cls, (), {"__new__": construct, "__module__": name}))
    stand_in.__getattr__ = other  # type: ignore[method-assign]
    sys.modules[name] = stand_in


def use_fedml_parts() -> bool:
    """Let FedML's parts import without FedML's package `__init__`s (see FEDML_PARTS); idempotent.

    Does nothing when FedML is already imported (a user's `import fedml` first keeps FedML whole) or
    not installed. Returns whether the parts are registered now."""
    if FEDML_PARTS[0] in sys.modules:
        return all(part in sys.modules for part in FEDML_PARTS)
    path: list[str] | None = None
    for name in FEDML_PARTS:
        module = _deferred_package(name, path)
        if module is None:
            return False
        path = list(module.__path__)
    for name, classes in STAND_INS.items():
        _stand_in(name, classes)
    return True


def check_fedml_version() -> bool:
    """Return True when the installed FedML is `FEDML_VERSION`; otherwise log a warning and return False."""
    try:
        installed = importlib.metadata.version("fedml")
    except importlib.metadata.PackageNotFoundError:
        installed = "not installed"
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


def _replace(module: ModuleType, name: str, replacement: object) -> None:
    """Set `module.name` to `replacement` unless it already is; fail loudly if FedML lacks the name."""
    current = module.__dict__.get(name, _MISSING)
    if current is replacement:
        return
    if current is _MISSING:
        raise RuntimeError(f"{module.__name__}.{name} does not exist; FedML changed, revisit {__name__}")
    setattr(module, name, replacement)
    log.debug("patched %s.%s", module.__name__, name)


def redirect_home(fedml_home: Path) -> None:
    """Point FedML's `~/.fedml` at `fedml_home` (idempotent; a later call moves it).

    FedML builds its paths as `join(expanduser("~"), ".fedml", ...)`, so `fedml_home` must be named
    `.fedml`; `~` is redirected to its parent in the modules of HOME_REDIRECTED_MODULES."""
    fedml_home = Path(os.path.abspath(fedml_home))
    if fedml_home.name != FEDML_HOME:
        raise ValueError(f"fedml_home must be a directory named {FEDML_HOME!r}, got {fedml_home}")
    check_fedml_version()
    _HOME_REDIRECT.home = fedml_home.parent
    for module_name in HOME_REDIRECTED_MODULES:
        _replace(importlib.import_module(module_name), "expanduser", _HOME_REDIRECT)


def run_flow(
    flow: Any, fedml_home: Path, args: Any, device: Any = None, dataset: Any = None, model: Any = None
) -> None:
    """Run `flow` (an object with `run()`) through FedML's `FedMLRunner(args, device, dataset, model,
    algorithm_flow=flow).run()`, FedML's `~/.fedml` being `fedml_home`."""
    redirect_home(fedml_home)
    from fedml.runner import FedMLRunner

    FedMLRunner(args, device, dataset, model, algorithm_flow=flow).run()


def minimal_fedml_args(**overrides: Any) -> argparse.Namespace:
    """The argument Namespace FedML's pieces read (FedMLRunner, the managers, trainer and aggregator);
    `overrides` win over the defaults.

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
