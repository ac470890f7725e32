"""The config reference: every key of every section and of each algorithm's options, with its type,
its default as YAML writes it, its allowed values and a one-line description.

All of it is read from the code: the fields of the section dataclasses (`config/schema.py`'s `SECTIONS`) and
of each registered algorithm's options, and each field's description from the attribute docstring
under it (PEP 257; read here with `ast`, by mkdocstrings with griffe). Allowed values are those each
field declares (`config.fields.choice`, the constants its section's `check()` uses), and for
`train_args.algorithm` the registered names. `fedml-moon config` prints `text()`; the documentation's
config page is `markdown()`.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import logging
import re
import textwrap
from collections.abc import Sequence
from typing import Any

import yaml

from fedml_moon import registry
from fedml_moon.config import schema
from fedml_moon.config.fields import allowed_values
from fedml_moon.errors import ConfigError

log = logging.getLogger(__name__)

ALGORITHM_ARGS = "algorithm_args"
REQUIRED = "(required)"

INTROS = {
    "common_args": "The kind of run and its seed.",
    "data_args": "The data set, how its training samples are split among the parties, and its transforms.",
    "model_args": "The network: encoder, projection head and the classifier's output.",
    "train_args": "The algorithm, the parties and rounds, local SGD, per-party state and how parties train.",
    "validation_args": "When the global model is evaluated, and whether each party's own model is too.",
    "device_args": "Where training runs (the CPU or a CUDA device) and PyTorch's threads.",
    "comm_args": "The distributed modes' transport: timeouts, quorum, gRPC, MQTT + S3, TLS, authentication.",
    "tracking_args": "What a run writes beside its records: W&B, TensorBoard, pictures, status ports.",
    "server_args": "The server's step: server momentum (FedAvgM), Byzantine-robust and buffered aggregation.",
    "privacy_args": "Secure aggregation and client-level differential privacy, both off by default.",
    ALGORITHM_ARGS: "The options of the algorithm train_args.algorithm names; each has its own keys.",
}


@dataclasses.dataclass(frozen=True)
class KeyDoc:
    """One config key. `algorithm`: the algorithm whose options hold it (section algorithm_args)."""

    section: str
    name: str
    type: str
    default: str
    allowed: tuple[Any, ...] | None
    description: str
    algorithm: str | None = None
    default_value: Any = None

    @property
    def path(self) -> str:
        return f"{self.section}.{self.name}"


def yaml_text(value: Any) -> str:
    """`value` as YAML writes it in a config file: 1.0e-05, null, true, [0.5, 0.5], 'on'."""
    text = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
    return text.removesuffix("...").strip()


def algorithms(plugins: bool = True) -> list[registry.AlgorithmSpec]:
    """The registered algorithms, in registration order; `plugins`: also those registered from outside
    this package (entry points, `registry.register`), else only its own."""
    if plugins:
        registry.load_plugins()
    specs = registry.ALGORITHMS.values()
    return [s for s in specs if plugins or s.client.__module__.startswith("fedml_moon.")]


@functools.cache
def _docstrings(cls: type) -> dict[str, str]:
    """The attribute docstrings of the fields `cls` itself defines, whitespace folded to one line."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError) as err:
        log.debug("no source for %s: %s", cls.__qualname__, err)
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    out = {}
    for stmt, after in zip(body, body[1:], strict=False):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            out[stmt.target.id] = " ".join(after.value.value.split())
    return out


def _owner(cls: type, name: str) -> type:
    """The class in `cls`'s MRO that defines field `name` (the most derived one)."""
    return next(c for c in cls.__mro__ if name in inspect.get_annotations(c))


def _type_text(annotation: Any) -> str:
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    return re.sub(r"\bNone(Type)?\b", "null", text.replace("typing.", ""))


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _class_keys(cls: type, section: str, algorithm: str | None, names: tuple[str, ...]) -> list[KeyDoc]:
    out = []
    for f in dataclasses.fields(cls):
        owner = _owner(cls, f.name)
        allowed = names if (owner, f.name) == (schema.TrainArgs, "algorithm") else allowed_values(f)
        value = _default(f)
        default = REQUIRED if value is dataclasses.MISSING else yaml_text(value)
        doc = _docstrings(owner).get(f.name, "")
        kind = _type_text(f.type)
        choices = None if allowed is None else tuple(allowed)
        out.append(KeyDoc(section, f.name, kind, default, choices, doc, algorithm, value))
    return out


def keys(plugins: bool = True) -> list[KeyDoc]:
    """Every key: the sections in `schema.SECTIONS` order, then each algorithm's options (algorithm_args)."""
    specs = algorithms(plugins)
    names = tuple(sorted(s.name for s in specs))
    out = [k for section, cls in schema.SECTIONS.items() for k in _class_keys(cls, section, None, names)]
    for spec in specs:
        out += _class_keys(spec.options, ALGORITHM_ARGS, spec.name, names)
    return out


def _cell(text: str) -> str:
    """Markdown text: a pipe would end a table cell, `<` open an HTML tag, `_` and `*` emphasise."""
    for char in "\\|_*":
        text = text.replace(char, "\\" + char)
    return text.replace("<", "&lt;")


def _code(text: str) -> str:
    return "`" + text.replace("|", "\\|") + "`"


def _table(rows: list[KeyDoc]) -> list[str]:
    out = ["| key | type | default | allowed | description |", "|---|---|---|---|---|"]
    for k in rows:
        allowed = ", ".join(_code(yaml_text(v)) for v in k.allowed or ())
        out.append(
            f"| {_code(k.name)} | {_cell(k.type)} | {_code(k.default)} | {allowed} | {_cell(k.description)} |"
        )
    return [*out, ""]


def table_markdown(cls: type, section: str) -> str:
    """The keys of a section outside the run's config as a table, from its dataclass `cls` (the sweep
    file's `slurm:` section: `results.cluster.SlurmArgs`)."""
    return "\n".join(_table(_class_keys(cls, section, None, ())))


def markdown(plugins: bool = False) -> str:
    """The reference as Markdown: one table per section, algorithm_args one per algorithm. Without
    `plugins`, the algorithms of this package only (the same page whatever else is installed)."""
    docs = keys(plugins)
    out: list[str] = []
    for section in [*schema.SECTIONS, ALGORITHM_ARGS]:
        out += [f"## {section}", "", _cell(INTROS.get(section, "")), ""]
        if section != ALGORITHM_ARGS:
            out += _table([k for k in docs if k.section == section])
            note = _passthrough(section)
            out += [_cell(note), ""] if note else []
            continue
        for spec in algorithms(plugins):
            rows = [k for k in docs if k.algorithm == spec.name]
            intro = (
                f"`train_args.algorithm: {spec.name}`: {_cell(spec.summary)}{'' if rows else '; no options'}."
            )
            out += [f"### {spec.name}", "", intro, ""]
            out += _table(rows) if rows else []
    return "\n".join(out)


def _wrapped(text: str, indent: int) -> list[str]:
    pad = " " * indent
    return textwrap.wrap(text, 110, initial_indent=pad, subsequent_indent=pad, break_on_hyphens=False)


def _passthrough(section: str) -> str:
    """FedML's own keys of `section` that a config may carry (`config/schema.py`'s `FEDML_PASSTHROUGH`)."""
    names = ", ".join(sorted(schema.FEDML_PASSTHROUGH.get(section, ())))
    return f"Also accepted, and handed to FedML as they are (FedML's own keys): {names}." if names else ""


def _brief(k: KeyDoc, indent: int) -> list[str]:
    """A key in a section's listing: name, type and default; description; allowed values."""
    lines = [f"{' ' * indent}{k.name}: {k.type} = {k.default}", *_wrapped(k.description, indent + 4)]
    if k.allowed:
        lines += _wrapped("one of: " + ", ".join(yaml_text(v) for v in k.allowed), indent + 4)
    return lines


def _full(k: KeyDoc) -> list[str]:
    """A key in full, one field a line."""
    allowed = ", ".join(yaml_text(v) for v in k.allowed) if k.allowed else "-"
    head = f"{k.path}  (algorithm {k.algorithm})" if k.algorithm else k.path
    fields = [("type", k.type), ("default", k.default), ("allowed", allowed), ("description", k.description)]
    return [head, *(f"  {label + ':':<13}{value or '-'}" for label, value in fields), ""]


def _section_text(section: str, docs: list[KeyDoc], specs: list[registry.AlgorithmSpec]) -> list[str]:
    out = [f"{section}: {INTROS.get(section, '')}"]
    if section != ALGORITHM_ARGS:
        out += [line for k in docs if k.section == section for line in _brief(k, 2)]
        return [*out, *_wrapped(_passthrough(section), 2), ""]
    for spec in specs:
        rows = [k for k in docs if k.algorithm == spec.name]
        out.append(f"  {spec.name}: {spec.summary}{'' if rows else '; no options'}")
        out += [line for k in rows for line in _brief(k, 4)]
    return [*out, ""]


def _unknown(path: str, what: str, word: str, choices: Sequence[str]) -> ConfigError:
    close = difflib.get_close_matches(word, list(choices), n=3)
    hint = f"closest: {', '.join(close)}" if close else "none is close"
    sections = ", ".join([*schema.SECTIONS, ALGORITHM_ARGS])
    return ConfigError(f"{path}: no such {what} ({hint}); sections: {sections}")


def text(selector: str | None = None, plugins: bool = True) -> str:
    """The reference for a terminal: every section (`selector` None), one section ("train_args"), or
    one key in full ("train_args.algorithm"; "algorithm_args.mu": every algorithm's `mu`). A
    ConfigError naming what is unknown, the closest names and the sections otherwise."""
    docs, specs = keys(plugins), algorithms(plugins)
    sections = [*schema.SECTIONS, ALGORITHM_ARGS]
    section, _, name = (selector or "").partition(".")
    if selector is None:
        lines = [line for s in sections for line in _section_text(s, docs, specs)]
    elif section not in sections:
        raise _unknown(section, "section", section, sections)
    elif not name:
        lines = _section_text(section, docs, specs)
    else:
        found = [k for k in docs if k.section == section and k.name == name]
        if not found:
            names = sorted({k.name for k in docs if k.section == section})
            raise _unknown(selector, f"key in {section}", name, names)
        lines = [line for k in found for line in _full(k)]
    return "\n".join(lines).rstrip("\n") + "\n"
