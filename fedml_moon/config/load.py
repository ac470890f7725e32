"""Build the one validated `Config` object from a FedML-layout YAML file plus `--set` overrides."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import yaml

from fedml_moon.config.buffered import buffered_checks
from fedml_moon.config.derived import evaluation, own_data
from fedml_moon.config.fields import _suggest, build_section
from fedml_moon.config.schema import (
    FEDML_PASSTHROUGH,
    SECTIONS,
    Config,
    ConfigError,
    require,
)
from fedml_moon.privacy.options import privacy_checks
from fedml_moon.registry import get_algorithm, load_plugin

__all__ = [
    "Config",
    "ConfigError",
    "config_to_dict",
    "evaluation",
    "load_config",
    "own_data",
    "parse_overrides",
]


def parse_overrides(items: list[str]) -> dict[str, dict[str, Any]]:
    """Turn `SECTION.KEY=VALUE` strings into nested dicts; values are parsed as YAML scalars."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        if "=" not in item or "." not in item.split("=", 1)[0]:
            raise ConfigError(f"--set {item!r}: write it as SECTION.KEY=VALUE, e.g. train_args.comm_round=5")
        path, text = item.split("=", 1)
        section, key = path.split(".", 1)
        try:
            value = yaml.safe_load(text) if text != "" else None
        except yaml.YAMLError as err:
            raise ConfigError(f"--set {item!r}: the value is not valid YAML ({err})") from None
        out.setdefault(section, {})[key] = value
    return out


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"--cf {path}: no such config file; the shipped ones are under config/")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    require(isinstance(data, dict), str(path), "the top level must be a mapping of sections")
    return data


def _merge(raw: dict[str, Any], overrides: dict[str, dict[str, Any]]) -> dict[str, Any]:
    merged = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    for section, values in overrides.items():
        target = merged.setdefault(section, {})
        require(isinstance(target, dict), section, "must be a mapping")
        target.update(values)
    return merged


def config_from_dict(raw: dict[str, Any]) -> Config:
    """Validate a FedML-layout dict (sections -> keys) into a Config."""
    known = set(SECTIONS) | {"algorithm_args"}
    for section in raw:
        if section not in known:
            raise ConfigError(
                f"{section}: unknown section{_suggest(section, known)} (valid: {', '.join(known)})"
            )
    built = {}
    passthrough: dict[str, dict[str, Any]] = {}
    for section, cls in SECTIONS.items():
        section_raw = raw.get(section) or {}
        allowed = FEDML_PASSTHROUGH.get(section, frozenset())
        built[section] = build_section(cls, section_raw, section, allowed)
        passthrough[section] = {k: v for k, v in section_raw.items() if k in allowed}
    spec = get_algorithm(built["train_args"].algorithm)
    algo_args = build_section(spec.options, raw.get("algorithm_args") or {}, "algorithm_args")
    cfg = Config(**built, algorithm_args=algo_args, passthrough=passthrough)
    _cross_checks(cfg)
    return cfg


MODES = {"simulation": ("sp", "MPI"), "cross_silo": ("MPI", "GRPC", "MQTT_S3")}


def _mode_checks(cfg: Config) -> None:
    kind, backend = cfg.common_args.training_type, cfg.comm_args.backend
    require(
        backend in MODES[kind],
        "comm_args.backend",
        f"{backend!r} does not go with common_args.training_type {kind!r}; {kind} runs over "
        f"{' or '.join(MODES[kind])} (simulation: sp = standalone, MPI = MPI simulation; cross_silo: MPI, "
        "GRPC or MQTT_S3)",
    )
    server = get_algorithm(cfg.train_args.algorithm).server
    for key in server.standalone_only(cfg.algorithm_args):
        require(
            backend == "sp",
            key,
            "needs every party's model beside every party's test split, which only the standalone "
            "simulation has; use comm_args.backend: sp, or turn it off",
        )
    require(
        backend != "sp" or not cfg.device_args.delay_per_round_s,
        "device_args.delay_per_round_s",
        "slows a silo of a distributed run; the standalone simulation keeps time on its simulated clock "
        "(train_args.party_speed): set it to 0",
    )
    reports = cfg.comm_args.min_reports
    require(
        isinstance(reports, str) or reports <= cfg.train_args.client_num_per_round,
        "comm_args.min_reports",
        f"{reports} is more than the {cfg.train_args.client_num_per_round} parties sampled per round",
    )
    if backend == "GRPC":
        path = cfg.comm_args.grpc_ipconfig_path
        require(
            path is not None and Path(path).expanduser().is_file(),
            "comm_args.grpc_ipconfig_path",
            f"{path!r} is not a file; give the CSV (eid,rank,grpc_server_ip,grpc_server_port,ingress_ip) "
            "that names the server (rank 0) and the silos",
        )


def _optimizer_checks(cfg: Config) -> None:
    """server_args.server_optimizer against the algorithm: an adaptive step needs an average to move."""
    server, algorithm = cfg.server_args, cfg.train_args.algorithm
    require(
        server.server_optimizer == "sgd" or get_algorithm(algorithm).server.averages,
        "server_args.server_optimizer",
        f"{algorithm} averages nothing (each party keeps its own model), so there is no mean update for "
        f"{server.server_optimizer} to step on; set sgd",
    )


def _robust_checks(cfg: Config) -> None:
    """server_args.robust_aggregation against the algorithm and the parties sampled per round."""
    server, algorithm = cfg.server_args, cfg.train_args.algorithm
    if server.robust_aggregation == "none":
        return
    require(
        get_algorithm(algorithm).server.averages,
        "server_args.robust_aggregation",
        f"{algorithm} averages nothing (each party keeps its own model), so a robust rule does not apply; "
        "set none",
    )
    options = cfg.algorithm_args
    if getattr(options, "prototype_mode", None) == "random-k":
        require(
            options.prototype_k >= 3,
            "algorithm_args.prototype_k",
            f"a robust rule needs at least 3 prototypes of a class to act on, and random-k averages "
            f"{options.prototype_k}; set prototype_mode: mean, or prototype_k >= 3",
        )
    if server.robust_aggregation != "krum":
        return
    n, f = cfg.train_args.client_num_per_round, server.krum_byzantine
    require(
        n > 2 * f + 2,
        "server_args.krum_byzantine",
        f"Krum needs more than 2 * krum_byzantine + 2 = {2 * f + 2} uploads per round and "
        f"train_args.client_num_per_round is {n}; lower krum_byzantine or sample more parties",
    )
    require(
        server.krum_select <= n - f,
        "server_args.krum_select",
        f"Multi-Krum averages at most client_num_per_round - krum_byzantine = {n - f} uploads; got "
        f"{server.krum_select}",
    )


def _claims_checks(cfg: Config) -> None:
    """Where the server holds no data a party's weight is its claim: a robust rule that weighs uploads
    by it (norm_clip's average, Multi-Krum's) would let one site's claim lead the rule."""
    server = cfg.server_args
    weighted = server.robust_aggregation == "norm_clip" or (
        server.robust_aggregation == "krum" and server.krum_select > 1
    )
    require(
        not (own_data(cfg) and weighted and server.party_weights == "samples"),
        "server_args.party_weights",
        f"{server.robust_aggregation} averages the uploads it keeps by their weights, and where the server "
        "holds no data a weight is the site's own claim; set party_weights: uniform (or a rule that weighs "
        "nothing: median, trimmed_mean, krum with krum_select 1)",
    )


def _headline_checks(cfg: Config) -> None:
    """`validation_args.headline: site_mean` needs the sites' own figures (federated, in the clear)."""
    if cfg.validation_args.headline != "site_mean":
        return
    why = None
    if evaluation(cfg) != "federated":
        why = "the server tests the global model on the test set it holds: no site has a figure of its own"
    elif cfg.privacy_args.secure_aggregation:
        why = "under privacy_args.secure_aggregation the server sees only the sites' test counts summed"
    fix = "set headline: pooled (or validation_args.evaluation: federated, without secure aggregation)"
    require(
        why is None, "validation_args.headline", f"site_mean needs each site's own test figures: {why}; {fix}"
    )


def _cross_checks(cfg: Config) -> None:
    cfg.data_args.check_agreement()
    _claims_checks(cfg)
    _headline_checks(cfg)
    side = cfg.data_args.image_size
    require(
        cfg.model_args.model not in ("simple-cnn", "lg-cnn") or side in (None, 28, 32),
        "data_args.image_size",
        f"{cfg.model_args.model} takes 28x28 or 32x32 images, not {side}x{side}; set image_size 28 or 32 "
        "(images are resized to it), or choose a model that takes any size (resnet50, mlp)",
    )
    _mode_checks(cfg)
    _robust_checks(cfg)
    _optimizer_checks(cfg)
    server = get_algorithm(cfg.train_args.algorithm).server
    privacy_checks(cfg, server, server.summed)
    _stream_checks(cfg, server.summed)
    buffered_checks(cfg, server)
    data = cfg.data_args
    if data.data_cache_dir is not None and not data.download:
        require(
            Path(data.data_cache_dir).expanduser().is_dir(),
            "data_args.data_cache_dir",
            f"{data.data_cache_dir!r} does not exist; point it at the folder holding the data, "
            "or set data_args.download: true to fetch it there",
        )
    if data.max_train_samples is not None:
        need = cfg.train_args.client_num_in_total * data.min_samples_per_client
        require(
            data.max_train_samples >= need,
            "data_args.max_train_samples",
            f"{data.max_train_samples} samples cannot give {cfg.train_args.client_num_in_total} parties "
            f"{data.min_samples_per_client} each; raise it to >= {need} "
            "or lower train_args.client_num_in_total",
        )


def _stream_checks(cfg: Config, summed: dict[str, str]) -> None:
    """`train_args.stream_uploads` sums each chunk of uploads as it is trained: whatever needs every
    upload of a round at once cannot stream."""
    if not cfg.train_args.stream_uploads:
        return
    needs_all = {
        "comm_args.backend": (
            cfg.comm_args.backend != "sp",
            "uploads stream in the standalone simulation only",
        ),
        "server_args.robust_aggregation": (
            cfg.server_args.robust_aggregation != "none",
            "a robust rule compares every upload of the round",
        ),
        "train_args.save_party_models": (cfg.train_args.save_party_models, "it keeps every upload"),
        "privacy_args": (cfg.privacy_args.on, "privacy sums the round's vectors itself"),
        "train_args.algorithm": (not summed, f"{cfg.train_args.algorithm} has no sum form (no `summed`)"),
    }
    for key, (clash, why) in needs_all.items():
        require(
            not clash, "train_args.stream_uploads", f"cannot stream with this {key}: {why}; set it to false"
        )


def load_config(path: str | Path, overrides: list[str] | None = None) -> Config:
    """Read `path` (FedML's fedml_config.yaml layout), apply `--set` overrides, validate."""
    raw = _merge(_read_yaml(Path(path)), parse_overrides(overrides or []))
    load_config_plugins(raw, Path(path).resolve().parent)
    return config_from_dict(raw)


def with_plugins(path: str | Path, overrides: list[str], plugins: list[str]) -> list[str]:
    """`overrides` plus one that adds `plugins` (--plugin) to the config's `common_args.plugins`."""
    if not plugins:
        return list(overrides)
    raw = _merge(_read_yaml(Path(path)), parse_overrides(overrides))
    listed = (raw.get("common_args") or {}).get("plugins")
    listed = listed if isinstance(listed, list) else []
    listed = [*listed, *(p for p in plugins if p not in listed)]
    return [*overrides, f"common_args.plugins={json.dumps(listed)}"]


def load_config_plugins(raw: dict[str, Any], folder: Path) -> list[str]:
    """Register the algorithms `common_args.plugins` names (`registry.load_plugin`), looked for on the
    Python path, then in `folder` (the config file's) and the current directory; returns their names."""
    plugins = (raw.get("common_args") or {}).get("plugins") or []
    require(
        isinstance(plugins, list) and all(isinstance(p, str) for p in plugins),
        "common_args.plugins",
        f"must be a list of module:attribute strings, e.g. [fedml_moon_fedproto:spec]; got {plugins!r}",
    )
    model = (raw.get("model_args") or {}).get("model")
    from fedml_moon.core import networks  # torch: only where a model is named

    if isinstance(model, str) and ":" in model and networks.kind_or_none(model) == "plugin":
        networks.load_plugin(model, (folder, Path.cwd()))  # a model plugin, found as an algorithm's is
    return [load_plugin(ref, (folder, Path.cwd())).name for ref in plugins]


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """The resolved config as plain data (for summary.json and the W&B run config). Holds no secrets."""
    out = {name: dataclasses.asdict(getattr(cfg, name)) for name in SECTIONS}
    out["algorithm_args"] = dataclasses.asdict(cfg.algorithm_args)
    return out
