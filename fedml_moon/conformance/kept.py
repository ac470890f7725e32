"""State an algorithm keeps outside its objects, found where it is kept: the globals of the modules
that define the algorithm's classes (and of the modules of its own package that those import) and the
attributes of the classes defined there, fingerprinted (`snapshot`) before and after every local
round and every server step of the check's reference run. What changed is named by its name.

Such state is what a resumed process, a second run in the same process, a party's replayed round
and every other mode's processes start without (or from another value), so it makes other checks
fail too: a resumed server that differs, stacked parties that differ, a run in this process that
ends elsewhere. Each names it as its cause (`kept_cause`), ahead of its own hint, and a check whose
runs in this process would each start from another value of it is not judged (`not_judged`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import sys
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fedml_moon.conformance.snapshot import describe, differences, snapshot

KEPT = "module globals and class attributes stay as they were (fingerprinted around every local round and server step)"  # noqa: E501
KEPT_HINT = (
    " -- state kept outside the algorithm's objects, which a resumed process, another run in the same "
    "process and every other mode's processes start without or from another value: keep a party's "
    "values in PartyRound.state (r.state), the server's on self and in state() / load_state(), and "
    "leave module globals and class attributes as imported"
)
_SKIPPED = (type, types.ModuleType, logging.Logger, property, classmethod, staticmethod, functools.partial)
_ALIASES = (types.GenericAlias, types.UnionType, typing.TypeVar)


def _is_data(name: str, value: Any) -> bool:
    """A value a run could keep state in: not a dunder, a function, a class, a module, a logger, a
    decorator's wrapper or a type annotation."""
    if name.startswith("__") or name == "_abc_impl" or inspect.isroutine(value):
        return False
    if isinstance(value, _SKIPPED + _ALIASES) or hasattr(value, "__wrapped__"):
        return False
    return type(value).__module__ != "typing"  # Callable[...], Optional[...], ClassVar[...]


def algorithm_modules(algorithms: list[Any]) -> list[types.ModuleType]:
    """The modules that define the algorithm objects' classes (every ClientAlgorithm / ServerAlgorithm
    class of their MROs, and their options' classes), and the modules of a plugin's own package that
    those import as modules (`from . import state`)."""
    from fedml_moon.algorithms.base import ClientAlgorithm, ServerAlgorithm

    found = set()
    for obj in algorithms:
        bases = [c for c in type(obj).__mro__ if issubclass(c, ClientAlgorithm | ServerAlgorithm)]
        found.update(c.__module__ for c in bases)
        if dataclasses.is_dataclass(getattr(obj, "options", None)):
            found.add(type(obj.options).__module__)
    modules = [sys.modules[n] for n in sorted(found) if isinstance(sys.modules.get(n), types.ModuleType)]
    for module in list(modules):
        top = module.__name__.split(".")[0]
        if "." in module.__name__ and top != "fedml_moon":
            own = [v for v in vars(module).values() if isinstance(v, types.ModuleType)]
            modules += [m for m in own if m.__name__.split(".")[0] == top and m not in modules]
    return modules


def _label(module: types.ModuleType) -> str:
    """A module as a contributor names it: a plugin loaded from a file by the file's name."""
    file = getattr(module, "__file__", None)
    return Path(file).name if module.__name__.startswith("fedml_moon_plugin_") and file else module.__name__


def _safe(value: Any) -> Any:
    try:
        return snapshot(value)
    except Exception as err:  # an object that cannot be read: its type (a change of type still shows)
        return f"<{type(value).__name__}: unreadable: {type(err).__name__}>"


def fingerprint(modules: list[types.ModuleType]) -> dict[str, Any]:
    """`module:NAME` and `module:Class.NAME` -> a snapshot of the value, for every module global and
    every attribute of a class defined in the module that could hold state (`_is_data`)."""
    out: dict[str, Any] = {}
    for module in modules:
        label = _label(module)
        for name, value in list(vars(module).items()):
            if isinstance(value, type) and value.__module__ == module.__name__:
                attrs = [(a, v) for a, v in vars(value).items() if _is_data(a, v)]
                out.update({f"{label}:{value.__qualname__}.{a}": _safe(v) for a, v in attrs})
            elif _is_data(name, value):
                out[f"{label}:{name}"] = _safe(value)
    return out


def changed(before: dict[str, Any], after: dict[str, Any], where: str) -> dict[str, str]:
    """Name -> how it changed in `where`, for every fingerprinted name that differs."""
    out = {}
    for name in sorted(set(before) | set(after)):
        short = name.split(":", 1)[1]
        if name not in before or name not in after:
            out[name] = f"{name} {'appeared' if name not in before else 'disappeared'} in {where}"
            continue
        how = _how(short, before[name], after[name])
        if how:
            out[name] = f"{name} changed in {where} ({how})"
    return out


def _what(value: Any) -> str:
    """A snapshot's value in a few words: a dict or list by its length, an object by its type."""
    if isinstance(value, dict):
        kind = value.get("__type__")
        return f"a {kind}" if isinstance(kind, str) else f"a dict of {len(value)} entries"
    return f"a list of {len(value)}" if isinstance(value, list) else describe(value)


def _how(short: str, a: Any, b: Any) -> str:
    """How snapshot `a` became `b`: the keys a dict gained or lost, else the first difference."""
    if isinstance(a, dict) and isinstance(b, dict) and set(a) != set(b):
        added = [f"{short}[{k}] added, {_what(b[k])}" for k in sorted(set(b) - set(a), key=str)]
        removed = [f"{short}[{k}] removed" for k in sorted(set(a) - set(b), key=str)]
        return "; ".join((added + removed)[:2])
    found = differences(a, b, short, 0.0, ("before", "after"))
    return found[0] if found else ""


def watch(run: Any) -> list[str]:
    """Fingerprint the run's algorithm modules around every party's local round (`runner.train`) and
    every server step (downloads, aggregation); returns the list that each name's first change is
    appended to, as it happens."""
    runner, server = run.loop.runner, run.loop.server
    modules = algorithm_modules([runner.trainer.algorithm, server.aggregator.algorithm])
    seen: set[str] = set()
    found: list[str] = []

    def around(fn: Callable[..., Any], where: Callable[..., str]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            before = fingerprint(modules)
            try:
                return fn(*args, **kwargs)
            finally:
                try:
                    said_where = where(*args, **kwargs)
                except TypeError:  # called otherwise than the engine calls it
                    said_where = getattr(fn, "__name__", "a step")
                for name, said in changed(before, fingerprint(modules), said_where).items():
                    if name not in seen:
                        seen.add(name)
                        found.append(said)

        return call

    def party(party: int, _download: Any, r: int) -> str:
        return f"round {r}, party {party}'s local round"

    runner.train = around(runner.train, party)
    server.downloads = around(server.downloads, lambda r: f"round {r}'s downloads")
    server.aggregate = around(server.aggregate, lambda r, _results: f"round {r}'s aggregation")
    return found


def names(kept: Sequence[str]) -> str:
    """The names `watch` found, for the other checks' messages: `a:X, b:Y`."""
    return ", ".join(said.split(" ", 1)[0] for said in kept[:4]) + (", ..." if len(kept) > 4 else "")


def _state(kept: Sequence[str]) -> str:
    check = KEPT.split(" (")[0]
    return f"the module-level state the run changed ({names(kept)}; the check '{check}' names it)"


def kept_cause(kept: Sequence[str]) -> str:
    """What another check's failure follows from, when `watch` found module state: "" otherwise."""
    if not kept:
        return ""
    return (
        f" -- may follow from {_state(kept)}: a resumed process, another run in this process and a "
        "replayed party start from other values of it; fix that first"
    )


def not_judged(kept: Sequence[str]) -> str:
    """Why a check that compares runs in this process is not run when `watch` found module state."""
    return f"not judged: each run it compares would start from other values of {_state(kept)}; fix that first"


def blamed(detail: str) -> bool:
    """Whether a check's `detail` names the module state already (`kept_cause`, `not_judged`)."""
    return "the module-level state the run changed (" in detail
