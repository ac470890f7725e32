"""Algorithm registry: name -> (client side, server side, options). Unknown names list the choices.

Algorithms come from this package, from `register()` calls, from installed packages that declare
an entry point in the group `fedml_moon.algorithms` whose object is an AlgorithmSpec (or a function
returning one; see examples/headprox), and from modules named as `module:attribute` in
`common_args.plugins` or `--plugin` (`load_plugin`: no installation needed).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

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
from fedml_moon.config.schema import ConfigError
from fedml_moon.core.validate import terms_problem
from fedml_moon.plugins import import_attribute


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
    problem = terms_problem(spec.client.terms)
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
