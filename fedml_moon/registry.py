"""Algorithm registry: name -> (client side, server side, options). Unknown names list the choices.

Algorithms come from this package, from `register()` calls, and from installed packages that declare
an entry point in the group `fedml_moon.algorithms` whose object is an AlgorithmSpec (or a function
returning one); see examples/headprox.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib.metadata import entry_points

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
        try:
            spec = ep.load()
            spec = spec() if callable(spec) and not isinstance(spec, AlgorithmSpec) else spec
            if not isinstance(spec, AlgorithmSpec):
                raise TypeError(f"it gives a {type(spec).__name__}, not an AlgorithmSpec")
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


def get_algorithm(name: str) -> AlgorithmSpec:
    """The spec for `name`; a ConfigError listing the choices when unknown."""
    load_plugins()
    key = str(name).lower()
    if key not in ALGORITHMS:
        load_plugins(again=True)
    if key not in ALGORITHMS:
        choices = ", ".join(sorted(ALGORITHMS))
        raise ConfigError(f"train_args.algorithm: unknown algorithm {name!r}; choose one of {choices}")
    return ALGORITHMS[key]
