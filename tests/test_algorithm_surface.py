"""What an algorithm may declare of itself is declared once, in `fedml_moon/algorithms/base.py`: each
class attribute a plugin may set has its default and a docstring there (what the API reference
shows), and the package reads them plainly, never with `getattr(..., default)` or `hasattr`."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from fedml_moon.algorithms.base import ClientAlgorithm, ServerAlgorithm
from fedml_moon.algorithms.lg import LGOptions, LGServer

ROOT = Path(__file__).resolve().parent.parent
BASES = ("ClientAlgorithm", "ServerAlgorithm")
# an expression that holds an algorithm's side: a class, an instance or a spec's side
ALGORITHM_SIDE = re.compile(r"(^|\.)(server|server_cls|client|algorithm)$|^type\(.*algorithm\)$")


def _declared() -> dict[str, dict[str, str]]:
    """Each base's class attributes (annotated ClassVar) and class methods, what a subclass sets, by
    name, with the docstring the API reference shows for each: the string under an attribute (PEP 257,
    as mkdocstrings reads it), a method's own."""
    tree = ast.parse((ROOT / "fedml_moon/algorithms/base.py").read_text())
    out: dict[str, dict[str, str]] = {}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in BASES):
        members = out.setdefault(cls.name, {})
        for stmt, after in zip(cls.body, [*cls.body[1:], None], strict=True):
            if isinstance(stmt, ast.AnnAssign) and ast.unparse(stmt.annotation).startswith("ClassVar"):
                said = (
                    after.value.value
                    if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    else ""
                )
                members[stmt.target.id] = str(said)
            elif isinstance(stmt, ast.FunctionDef) and "classmethod" in map(ast.unparse, stmt.decorator_list):
                members[stmt.name] = ast.get_docstring(stmt) or ""
    return out


def _reads_with_a_default(source: str, names: set[str]) -> list[str]:
    """The getattr / hasattr calls of `source` that read a named attribute off an algorithm's side, or
    read one of `names` off anything, as their source text."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        if node.func.id not in ("getattr", "hasattr") or len(node.args) < 2:
            continue
        obj, attr = node.args[0], node.args[1]
        if not (isinstance(attr, ast.Constant) and isinstance(attr.value, str)):
            continue
        if attr.value in names or ALGORITHM_SIDE.search(ast.unparse(obj)):
            found.append(ast.unparse(node))
    return found


def test_every_attribute_a_plugin_may_set_is_declared_with_its_docstring():
    declared = _declared()
    assert set(declared["ClientAlgorithm"]) == {"name", "personalized", "terms"}
    assert set(declared["ServerAlgorithm"]) == {"averages", "summed", "not_buffered", "standalone_only"}
    for base, members in declared.items():
        for name, docstring in members.items():
            assert docstring.strip(), f"{base}.{name}: no docstring"
    assert ServerAlgorithm.not_buffered is None and ServerAlgorithm.standalone_only(object()) == []
    assert ClientAlgorithm.terms == ("ce",) and not ClientAlgorithm.personalized


def test_the_api_reference_renders_both_bases_with_their_members():
    page = (ROOT / "docs/reference/api.md").read_text()
    for base in BASES:
        assert f"::: fedml_moon.algorithms.base.{base}" in page, base


def test_the_package_reads_what_an_algorithm_declares_plainly():
    names = {name for members in _declared().values() for name in members}
    offenders = {
        str(path.relative_to(ROOT)): found
        for path in sorted((ROOT / "fedml_moon").rglob("*.py"))
        if (found := _reads_with_a_default(path.read_text(), names))
    }
    assert offenders == {}


def test_the_scan_finds_a_read_with_a_default():
    source = (
        "own = getattr(server, 'not_buffered', None)\n"
        "ok = hasattr(spec.client, 'anything')\n"
        "fine = getattr(cfg.algorithm_args, 'prototype_mode', 'mean')\n"
        "also = getattr(x, 'averages', True)\n"
    )
    found = _reads_with_a_default(source, {"averages"})
    assert found == [
        "getattr(server, 'not_buffered', None)",
        "hasattr(spec.client, 'anything')",
        "getattr(x, 'averages', True)",
    ]


def test_lg_names_report_best_as_standalone_only_when_it_is_on():
    assert LGServer.standalone_only(LGOptions(split_preset="head")) == []
    on = LGOptions(split_preset="head", report_best=True)
    assert LGServer.standalone_only(on) == ["algorithm_args.report_best"]
