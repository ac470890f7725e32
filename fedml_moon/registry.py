"""Algorithm registry: name -> (client side, server side, options). Unknown names list the choices.

Algorithms come from this package, from `register()` calls, from installed packages that declare
an entry point in the group `fedml_moon.algorithms` whose object is an AlgorithmSpec (or a function
returning one; see examples/headprox), and from modules named as `module:attribute` in
`common_args.plugins` or `--plugin` (`load_plugin`: no installation needed).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Any

from fedml_moon.algorithms.base import ClientAlgorithm, NoOptions, ServerAlgorithm
from fedml_moon.algorithms.baselines import (
    FedAvgClient,
    FedProxClient,
    FedProxOptions,
    SoloClient,
    SoloServer,
)
from fedml_moon.algorithms.fedssc import FedSSCClient, FedSSCOptions, FedSSCServer
from fedml_moon.algorithms.lg import LGClient, LGOptions, LGServer
from fedml_moon.algorithms.moon import MoonClient, MoonOptions
from fedml_moon.algorithms.scaffold import ScaffoldClient, ScaffoldOptions, ScaffoldServer
from fedml_moon.config_schema import ConfigError
from fedml_moon.core.validate import terms_problem


@dataclass(frozen=True)
class AlgorithmSpec:
    name: str
    client: type[ClientAlgorithm]
    server: type[ServerAlgorithm]
    options: type
    summary: str


ALGORITHMS: dict[str, AlgorithmSpec] = {}


def register(spec: AlgorithmSpec) -> AlgorithmSpec:
    """Add an algorithm; its name becomes a valid `train_args.algorithm`. Its party side's `terms`
    must be names the server can record (`core.validate.terms_problem`)."""
    problem = terms_problem(getattr(spec.client, "terms", None))
    if problem is not None:
        raise ValueError(f"algorithm {spec.name!r}: {spec.client.__name__}.{problem}")
    ALGORITHMS[spec.name] = spec
    return spec


register(AlgorithmSpec("moon", MoonClient, ServerAlgorithm, MoonOptions, "model-contrastive FL (CVPR 2021)"))
register(AlgorithmSpec("fedavg", FedAvgClient, ServerAlgorithm, NoOptions, "federated averaging"))
register(AlgorithmSpec("fedprox", FedProxClient, ServerAlgorithm, FedProxOptions, "FedAvg + proximal term"))
register(AlgorithmSpec("solo", SoloClient, SoloServer, NoOptions, "each party trains alone"))
register(
    AlgorithmSpec("fedssc", FedSSCClient, FedSSCServer, FedSSCOptions, "MOON + class-prototype contrast")
)
register(
    AlgorithmSpec("scaffold", ScaffoldClient, ScaffoldServer, ScaffoldOptions, "control variates (option II)")
)
register(AlgorithmSpec("lg", LGClient, LGServer, LGOptions, "LG-FedAvg: local layers stay with the party"))


ENTRY_POINT_GROUP = "fedml_moon.algorithms"
log = logging.getLogger(__name__)
_plugins_loaded = False
_searched: dict[str, list[str]] = {"entry points": [], "plugins": []}  # what get_algorithm looked in


def _as_spec(obj: object) -> AlgorithmSpec:
    spec = obj() if callable(obj) and not isinstance(obj, AlgorithmSpec) else obj
    if not isinstance(spec, AlgorithmSpec):
        raise TypeError(f"it gives a {type(spec).__name__}, not an AlgorithmSpec")
    return spec


def load_plugins(again: bool = False) -> list[str]:
    """Register the algorithms of installed packages (entry point group `fedml_moon.algorithms`),
    once per process (`again`: look once more, for a name not found); a plugin that fails to load is
    named in a warning and skipped."""
    global _plugins_loaded
    if _plugins_loaded and not again:
        return []
    _plugins_loaded = True
    added = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if f"{ep.name} = {ep.value}" not in _searched["entry points"]:
            _searched["entry points"].append(f"{ep.name} = {ep.value}")
        try:
            spec = _as_spec(ep.load())
        except Exception as err:
            log.warning("algorithm plugin %s (%s) not loaded: %s", ep.name, ep.value, err)
            continue
        if spec.name in ALGORITHMS and ALGORITHMS[spec.name] == spec:
            continue
        if spec.name in ALGORITHMS:
            log.warning("algorithm plugin %s: the name %r is taken; not loaded", ep.value, spec.name)
            continue
        register(spec)
        added.append(spec.name)
    return added


def _import_file(ref: str, name: str, search: Sequence[Path], key: str) -> ModuleType:
    """The module in the file `name` (absolute, or under one of `search`), imported once per file."""
    path = Path(name)
    found = [path] if path.is_absolute() else [Path(f) / path for f in search]
    found = [p.resolve() for p in found if p.is_file()]
    if not found:
        where = ", ".join(str(f) for f in search) or "nowhere"
        raise ConfigError(f"{key}: {ref!r}: no file {name} (looked in {where})")
    module_key = "fedml_moon_plugin_" + hashlib.sha256(str(found[0]).encode()).hexdigest()[:12]
    if module_key in sys.modules:
        return sys.modules[module_key]
    spec = importlib.util.spec_from_file_location(module_key, found[0])
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_key] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_key]
        raise
    return module


def _import(ref: str, module_name: str, search: Sequence[Path], key: str) -> ModuleType:
    if module_name.endswith(".py"):
        return _import_file(ref, module_name, search, key)
    sys.path.extend(p for p in dict.fromkeys(str(Path(f).resolve()) for f in search) if p not in sys.path)
    return importlib.import_module(module_name)


def import_attribute(ref: str, key: str, search: Sequence[Path] = (), example: str = "") -> Any:
    """What `ref` names: "module:attribute", the module imported from the Python path or, after it,
    the folders `search`; or "path/to/file.py:attribute", the file found as given or under `search`.
    A ConfigError naming the config `key` says what is wrong."""
    module_name, sep, attr = str(ref).rpartition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{key}: {ref!r} is not module:attribute{f', e.g. {example}' if example else ''}")
    try:
        module = _import(ref, module_name, search, key)
    except ConfigError:
        raise
    except ModuleNotFoundError as err:
        if err.name is None or not module_name.startswith(err.name):
            raise ConfigError(f"{key}: {ref!r}: importing {module_name} failed: {err}") from None
        where = ", ".join(str(f) for f in search) or "nowhere else"
        raise ConfigError(
            f"{key}: {ref!r}: no module {module_name!r} on the Python path or in {where}; "
            "give a module importable from the config's folder or this directory, or install its package"
        ) from None
    except Exception as err:
        raise ConfigError(f"{key}: {ref!r}: importing {module_name} failed: {err!r}") from None
    if not hasattr(module, attr):
        raise ConfigError(f"{key}: {ref!r}: module {module_name} has no {attr!r}")
    return getattr(module, attr)


def load_plugin(ref: str, search: Sequence[Path] = ()) -> AlgorithmSpec:
    """Register the algorithm `ref` names, "module:attribute" (an AlgorithmSpec, or a function
    returning one), importing the module from the Python path or, after it, the folders `search`
    (the config file's, the current directory); or "path/to/file.py:attribute", the file found as
    given or under `search`. A ConfigError names what is wrong."""
    if ref not in _searched["plugins"] and ":" in str(ref):
        _searched["plugins"].append(ref)
    found = import_attribute(ref, "common_args.plugins", search, "fedml_moon_fedproto:spec")
    try:
        spec = _as_spec(found)
    except Exception as err:
        raise ConfigError(f"common_args.plugins: {ref!r}: {err}") from None
    taken = ALGORITHMS.get(spec.name)
    if taken is not None and taken != spec:
        raise ConfigError(
            f"common_args.plugins: {ref!r} names its algorithm {spec.name!r}, which "
            f"{taken.client.__module__} has taken; rename one"
        )
    return register(spec)


def searched() -> str:
    """Where algorithms were looked for, in words (for an unknown name)."""
    points = ", ".join(_searched["entry points"]) or "none installed"
    plugins = ", ".join(_searched["plugins"]) or "none"
    return (
        f"searched the built-in algorithms, the entry points of group {ENTRY_POINT_GROUP} ({points}) and "
        f"common_args.plugins / --plugin ({plugins})"
    )


def get_algorithm(name: str) -> AlgorithmSpec:
    """The spec for `name`; a ConfigError listing the choices and where it looked when unknown."""
    load_plugins()
    key = str(name).lower()
    if key not in ALGORITHMS:
        load_plugins(again=True)
    if key not in ALGORITHMS:
        choices = ", ".join(sorted(ALGORITHMS))
        raise ConfigError(
            f"train_args.algorithm: unknown algorithm {name!r}; choose one of {choices} ({searched()}; "
            "an algorithm outside this package is named with --plugin module:spec)"
        )
    return ALGORITHMS[key]
