"""The config reference (`fedml_moon.config.reference`, `fedml-moon config`, the docs' config page)
covers every field of the config's dataclasses and of each algorithm's options, with the code's
defaults and the allowed values the checks use."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from fedml_moon import registry
from fedml_moon.algorithms.fedssc import PROTOTYPE_MODES
from fedml_moon.algorithms.lg import NEW_TEST_METHODS, WARMUP_STARTS, LGOptions
from fedml_moon.algorithms.moon import LOSS_CHOICES, POOL_UPDATES, UNSEEN_CHOICES
from fedml_moon.algorithms.scaffold import C_UPDATE_CHOICES, CORRECTION_CHOICES
from fedml_moon.config import reference as ref
from fedml_moon.config.schema import (
    AUGMENTATIONS,
    AUTH_MODES,
    BACKENDS,
    BAD_UPLOAD_ACTIONS,
    CLIENT_OPTIMIZERS,
    EVALUATIONS,
    FEDERATED_OPTIMIZERS,
    HEADLINES,
    MOMENTUM_STYLES,
    PARTITIONS,
    PARTY_WEIGHTS,
    PRECISIONS,
    SCENARIOS,
    SITE_FORMATS,
    STATE_STORES,
    SWITCHES,
    TLS_MODES,
    TOGETHER,
    TRAINING_TYPES,
    WANDB_MODES,
    Config,
    ConfigError,
)
from fedml_moon.core.buffering import (
    AGGREGATIONS,
    BUFFER_WEIGHTS,
    BUFFERED_RULES,
    PARTY_SPEEDS,
    SPEED_DRAWS,
    STALENESS,
)
from fedml_moon.core.choices import SERVER_OPTIMIZERS
from fedml_moon.core.models import ENCODERS, OUTPUT_ACTIVATIONS
from fedml_moon.core.robust import RULES
from fedml_moon.core.split import PRESETS
from fedml_moon.data.datasets import DATASETS
from fedml_moon.privacy.options import ACCOUNTANTS, DP_BUFFERS

ROOT = Path(__file__).resolve().parent.parent
OWN = [s for s in registry.ALGORITHMS.values() if s.client.__module__.startswith("fedml_moon.")]

ALLOWED = {  # key (algorithm options: algorithm name, key) -> the constant its check() uses
    "common_args.training_type": TRAINING_TYPES,
    "common_args.scenario": SCENARIOS,
    "data_args.dataset": (*DATASETS, *SITE_FORMATS),
    "data_args.partition_method": PARTITIONS,
    "data_args.augmentation": AUGMENTATIONS,
    "model_args.model": ENCODERS,
    "model_args.output_activation": OUTPUT_ACTIVATIONS,
    "train_args.algorithm": tuple(sorted(s.name for s in OWN)),
    "train_args.federated_optimizer": FEDERATED_OPTIMIZERS,
    "train_args.client_optimizer": CLIENT_OPTIMIZERS,
    "train_args.state_store": STATE_STORES,
    "train_args.on_bad_upload": BAD_UPLOAD_ACTIONS,
    "train_args.cuda_graphs": SWITCHES,
    "train_args.together": TOGETHER,
    "train_args.precision": PRECISIONS,
    "validation_args.headline": HEADLINES,
    "validation_args.evaluation": EVALUATIONS,
    "device_args.using_gpu": SWITCHES,
    "comm_args.backend": BACKENDS,
    "comm_args.tls": TLS_MODES,
    "comm_args.auth": AUTH_MODES,
    "tracking_args.wandb_mode": WANDB_MODES,
    "server_args.server_momentum_style": MOMENTUM_STYLES,
    "server_args.party_weights": PARTY_WEIGHTS,
    "server_args.robust_aggregation": RULES,
    "server_args.aggregation": AGGREGATIONS,
    "server_args.staleness": STALENESS,
    "server_args.buffer_weights": BUFFER_WEIGHTS,
    "server_args.buffered_rule": BUFFERED_RULES,
    "server_args.server_optimizer": SERVER_OPTIMIZERS,
    "train_args.party_speed": PARTY_SPEEDS,
    "train_args.party_speed_draw": SPEED_DRAWS,
    "privacy_args.dp_accountant": ACCOUNTANTS,
    "privacy_args.dp_buffers": DP_BUFFERS,
    **{(a, "unseen_party_prev"): UNSEEN_CHOICES for a in ("moon", "fedssc")},
    **{(a, "representation_loss"): LOSS_CHOICES for a in ("moon", "fedssc")},
    **{(a, "pool_update"): POOL_UPDATES for a in ("moon", "fedssc")},
    ("fedssc", "prototype_mode"): PROTOTYPE_MODES,
    ("scaffold", "correction"): CORRECTION_CHOICES,
    ("scaffold", "c_update"): C_UPDATE_CHOICES,
    ("lg", "split_preset"): tuple(PRESETS),
    ("lg", "new_test_method"): NEW_TEST_METHODS,
    ("lg", "warmup_start"): WARMUP_STARTS,
}
NOT_IN_CHECK = {"data_args.dataset", "train_args.algorithm", ("lg", "split_preset")}  # checked later


def _fields() -> dict[tuple[str, str | None, str], tuple[type, dataclasses.Field]]:
    """(section, algorithm, key) -> (dataclass, field) for every field of Config's sections and of
    this package's algorithms' options, enumerated from the dataclasses themselves."""
    out = {}
    for section in dataclasses.fields(Config):
        if dataclasses.is_dataclass(section.default_factory):
            for f in dataclasses.fields(section.default_factory):
                out[section.name, None, f.name] = (section.default_factory, f)
    for spec in OWN:
        for f in dataclasses.fields(spec.options):
            out["algorithm_args", spec.name, f.name] = (spec.options, f)
    return out


def _default(f: dataclasses.Field):
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def _by_id() -> dict[tuple[str, str | None, str], ref.KeyDoc]:
    return {(k.section, k.algorithm, k.name): k for k in ref.keys(plugins=False)}


def _id(k: ref.KeyDoc) -> str | tuple[str, str]:
    return (k.algorithm, k.name) if k.algorithm else k.path


def test_every_field_has_a_key_with_a_one_line_description():
    expected, docs = _fields(), _by_id()
    assert len(expected) > 100
    assert set(docs) == set(expected)
    for key, k in docs.items():
        assert k.description, f"{key}: no docstring under the field"
        assert "\n" not in k.description and len(k.description) <= 120, key
        assert k.type and "None" not in k.type, key
    assert docs["data_args", None, "normalize_mean"].type == "list[float] | null"
    assert docs["comm_args", None, "min_reports"].type == "int | str | null"


def test_defaults_are_the_dataclass_defaults_as_yaml_writes_them():
    docs = _by_id()
    for key, (_, f) in _fields().items():
        default = _default(f)
        assert docs[key].default_value == default, key
        assert yaml.safe_load(docs[key].default) == default, (key, docs[key].default)
    assert docs["train_args", None, "weight_decay"].default == "1.0e-05"  # YAML reads 1e-5 as a string


def test_allowed_values_are_the_constants_of_the_checks():
    docs = ref.keys(plugins=False)
    found = {_id(k): k.allowed for k in docs if k.allowed is not None}
    assert found == {key: tuple(values) for key, values in ALLOWED.items()}
    for k in docs:
        if not k.allowed or _id(k) in NOT_IN_CHECK:
            continue
        cls = _owner(k)
        base = LGOptions(split_preset="head") if cls is LGOptions else cls()
        for value in k.allowed:  # each passes the section's check, something else does not
            dataclasses.replace(base, **{k.name: value}).check()
        with pytest.raises(ConfigError, match=k.name):
            dataclasses.replace(base, **{k.name: "no-such-value"}).check()


def _owner(k: ref.KeyDoc) -> type:
    if k.algorithm:
        return registry.ALGORITHMS[k.algorithm].options
    return next(f.default_factory for f in dataclasses.fields(Config) if f.name == k.section)


def test_cli_prints_a_key_in_full_with_the_registered_algorithms(cli, capsys):
    assert cli(["config", "train_args.algorithm"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("train_args.algorithm\n")
    allowed = next(line for line in out.splitlines() if line.strip().startswith("allowed:"))
    assert set(allowed.split(":", 1)[1].replace(",", " ").split()) == set(registry.ALGORITHMS)
    assert "default:     moon" in out


def test_cli_prints_a_section_every_section_and_a_key_of_every_algorithm(cli, capsys):
    assert cli(["config", "algorithm_args.mu"]) == 0
    out = capsys.readouterr().out
    for name in ("moon", "fedprox", "fedssc"):
        assert f"algorithm_args.mu  (algorithm {name})" in out
    assert "(algorithm scaffold)" not in out
    assert cli(["config", "server_args"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("server_args: ") and "  krum_select: int = 1\n" in out and "train_args" not in out
    assert cli(["config"]) == 0
    out = capsys.readouterr().out
    for section in [*ref.INTROS]:
        assert re.search(rf"^{section}: ", out, re.M), section


@pytest.fixture
def reduced(monkeypatch):
    """A plugin algorithm whose option declares its allowed values (`tests/support/kit_plugins.py`),
    registered in a copy of the registry."""
    monkeypatch.setattr(registry, "ALGORITHMS", dict(registry.ALGORITHMS))
    monkeypatch.setattr(registry, "_searched", {"entry points": [], "plugins": []})
    return registry.load_plugin(f"{ROOT / 'tests' / 'support' / 'kit_plugins.py'}:reduced")


def test_a_plugins_declared_choices_are_its_keys_allowed_values(reduced, cli, capsys):
    (k,) = [k for k in ref.keys() if k.algorithm == reduced.name]
    assert (k.path, k.allowed, k.default) == ("algorithm_args.reduction", ("mean", "sum"), "mean")
    assert cli(["config", "algorithm_args.reduction"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("algorithm_args.reduction  (algorithm ce_reduced)\n")
    assert "  allowed:     mean, sum\n" in out
    assert cli(["config", "algorithm_args"]) == 0
    assert "      one of: mean, sum\n" in capsys.readouterr().out
    for value in ("mean", "sum"):
        reduced.options(reduction=value).check()
    with pytest.raises(ConfigError, match="algorithm_args.reduction"):
        reduced.options(reduction="max").check()


def test_an_unknown_key_or_section_exits_2_naming_it_and_the_closest(cli, capsys):
    assert cli(["config", "train_args.learnig_rate"]) == 2
    err = capsys.readouterr().err
    assert "train_args.learnig_rate: no such key in train_args (closest: learning_rate" in err
    assert "sections: common_args, data_args" in err and "algorithm_args" in err
    assert cli(["config", "trian_args"]) == 2
    assert "trian_args: no such section (closest: train_args" in capsys.readouterr().err


def _chunk(md: str, heading: str) -> str:
    start = md.index(f"{heading}\n")
    end = md.find("\n## ", start + 1)
    end = len(md) if end < 0 else end
    nxt = md.find("\n### ", start + 1) if heading.startswith("### ") else -1
    return md[start : nxt if 0 <= nxt < end else end]


def test_markdown_has_a_row_of_five_cells_for_every_key():
    md = ref.markdown()
    docs = ref.keys(plugins=False)
    for k in docs:
        chunk = _chunk(md, f"### {k.algorithm}" if k.algorithm else f"## {k.section}")
        (row,) = [line for line in chunk.splitlines() if line.startswith(f"| `{k.name}` |")]
        cells = re.split(r"(?<!\\)\|", row)[1:-1]  # an unescaped pipe ends a cell
        assert len(cells) == 5, row
    rows = [line for line in md.splitlines() if line.startswith("| `")]
    assert len(rows) == len(docs)
    assert "\\|\\|z - z\\_glob\\|\\|" in md  # pipes in a description are escaped
    assert "no options" in _chunk(md, "### fedavg")


def test_the_docs_hook_replaces_the_marker_on_the_config_page_only():
    spec = importlib.util.spec_from_file_location("config_hook", ROOT / "docs/hooks/config_reference.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page_text = (ROOT / "docs/reference/config.md").read_text()
    assert hook.MARKER in page_text and "fedml-moon config" in page_text

    def page(path: str) -> SimpleNamespace:
        return SimpleNamespace(file=SimpleNamespace(src_uri=path))

    out = hook.on_page_markdown(page_text, page=page("reference/config.md"), config=None, files=None)
    assert hook.MARKER not in out and ref.markdown() in out and out.startswith("# Config keys")
    other = hook.on_page_markdown(page_text, page=page("reference/cli.md"), config=None, files=None)
    assert other == page_text
