"""Code a config names by `module:attribute` (or `path/to/file.py:attribute`): algorithm plugins
(`common_args.plugins`) and dataset plugins (`data_args.plugin`) are found and imported alike."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from fedml_moon.errors import ConfigError


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
