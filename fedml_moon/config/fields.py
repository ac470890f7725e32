"""How a section of the config (a dataclass of `config/schema.py`, or an algorithm's options) is declared
and built: `choice` declares a field's allowed values, which the config reference reads
(`fedml-moon config`); `build_section` builds a section from its YAML mapping, unknown keys refused
with the closest valid one, each value checked against its field's type. Apart from
`fedml_moon.config.load` (which needs the algorithms, and PyTorch with them), so that a section read
alone (a sweep file's `slurm:`) imports neither, and importing nothing of the config but errors, so
that every room may declare its sections with it."""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from typing import Any

from fedml_moon.errors import ConfigError, require

CHOICES = "choices"  # the field metadata key `choice` sets
SECRET_KEYS = frozenset({"wandb_key", "api_key", "mlops_api_key"})


def choice(default: Any, allowed: typing.Iterable[Any]) -> Any:
    """A dataclass field of `default` whose value is one of `allowed`: the config reference lists them
    as the key's allowed values (`allowed_values`). The section's `check()` says what a value outside
    them is; `allowed` may name what a check resolves later (the data sets, the built-in encoders)."""
    return dataclasses.field(default=default, metadata={CHOICES: tuple(allowed)})


def allowed_values(f: dataclasses.Field) -> tuple[Any, ...] | None:
    """The allowed values `choice` declared on the dataclass field `f`, or None (any of its type)."""
    return f.metadata.get(CHOICES)


def _suggest(word: str, choices: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


_SCIENTIFIC = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Check `value` against a field annotation (str | int | float | bool, optionally None)."""
    if isinstance(annotation, str):
        names = {"int": int, "float": float, "str": str, "bool": bool, "None": None, "list": list}
        annotation = eval(annotation, names)
    allowed = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    if value is None:
        require(type(None) in allowed, key, "must not be empty (null)")
        return None
    if isinstance(value, str) and str in allowed:  # e.g. torch_threads: auto (int | str)
        return value
    if bool in allowed:
        require(isinstance(value, bool), key, f"must be true or false; got {value!r}")
        return value
    if int in allowed:
        require(
            isinstance(value, int) and not isinstance(value, bool), key, f"must be an integer; got {value!r}"
        )
        return value
    if float in allowed:
        if isinstance(value, str) and _SCIENTIFIC.fullmatch(value.strip()):
            value = float(value)  # YAML 1.1 reads 1e-5 (no dot) as a string
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        require(ok, key, f"must be a number; got {value!r}")
        return float(value)
    lists = [a for a in allowed if typing.get_origin(a) is list]
    if lists:
        if typing.get_args(lists[0]) == (float,):
            ok = isinstance(value, list) and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
            )
            require(ok, key, f"must be a list of numbers, e.g. [0.5, 0.5, 0.5]; got {value!r}")
            return [float(v) for v in value]
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        require(ok, key, f"must be a list of strings, e.g. [encoder.fc1, classifier]; got {value!r}")
        return list(value)
    if str in allowed:
        require(isinstance(value, str), key, f"must be a string; got {value!r}")
        return value
    return value


def build_section(
    cls: type, raw: dict[str, Any], section: str, passthrough: frozenset[str] = frozenset()
) -> Any:
    """Build dataclass `cls` from `raw`, rejecting unknown keys and wrong types, then run its check()."""
    require(isinstance(raw, dict), section, f"must be a mapping of keys to values; got {type(raw).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        name = f"{section}.{key}"
        if key in SECRET_KEYS:
            raise ConfigError(
                f"{name}: secrets do not belong in config files (they would be copied into run records); "
                "use the WANDB_API_KEY environment variable or `wandb login` instead"
            )
        if key in passthrough:
            continue
        if key not in fields:
            raise ConfigError(f"{name}: unknown key{_suggest(key, fields)} (valid keys: {', '.join(fields)})")
        values[key] = _coerce(value, fields[key].type, name)
    obj = cls(**values)
    check = getattr(obj, "check", None)
    if check is not None:
        check()
    return obj
