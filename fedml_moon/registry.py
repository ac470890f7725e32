"""Algorithm registry: name -> (client side, server side, options). Unknown names list the choices."""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class AlgorithmSpec:
    name: str
    client: type[ClientAlgorithm]
    server: type[ServerAlgorithm]
    options: type
    summary: str


ALGORITHMS: dict[str, AlgorithmSpec] = {}


def register(spec: AlgorithmSpec) -> AlgorithmSpec:
    """Add an algorithm; its name becomes a valid `train_args.algorithm`."""
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


def get_algorithm(name: str) -> AlgorithmSpec:
    """The spec for `name`; a ConfigError listing the choices when unknown."""
    key = str(name).lower()
    if key not in ALGORITHMS:
        choices = ", ".join(sorted(ALGORITHMS))
        raise ConfigError(f"train_args.algorithm: unknown algorithm {name!r}; choose one of {choices}")
    return ALGORITHMS[key]
