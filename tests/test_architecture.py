"""The package's rooms keep to what they may import: the import-linter contracts of pyproject.toml
(each room imports only the rooms below it; only the FedML adapters, the distributed layer and the
conformance suite import `fedml`; the round engine and the rooms below it reach no `fedml` through any
chain of imports); the round engine imports without FedML installed; no module imports another that
imports it back (inside functions too, which the contracts count as well)."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from importlinter import configuration
from importlinter.application.use_cases import lint_imports

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "fedml_moon"
MAY_IMPORT_FEDML = ("adapters", "distributed", "conformance")  # conformance drives whole runs


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(path: Path) -> set[str]:
    """Names of the modules `path` imports, anywhere in it."""
    nodes = list(ast.walk(ast.parse(path.read_text())))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return found


def test_the_import_contracts_are_kept(capsys):
    """import-linter (what `lint-imports` runs) on the contracts of pyproject.toml; a broken one fails
    with its report (which import, on which line, breaks which rule)."""
    configuration.configure()  # its readers and graph builder (the command's logging set-up left out:
    # it would reconfigure this process's loggers)
    kept = lint_imports(config_filename=str(ROOT / "pyproject.toml"), cache_dir=None, no_logo=True)
    said = capsys.readouterr().out
    assert kept, said[said.find("Contracts") :]
    assert "0 broken" in said


def test_every_room_has_its_place_in_the_layers():
    """A room added to the package is placed in the layers contract, so its imports are checked: every
    package and root module but `__main__` (the command line's entry) and `losses` (core's losses,
    re-exported for users), and each module of `config`, whose parts sit at several floors (its schema
    low, where the data's readers read it, and its loading high, where it is checked against the
    registered algorithms)."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (rooms,) = [c for c in contracts if c["type"] == "layers"]
    named = {m.strip() for layer in rooms["layers"] for m in layer.replace(":", "|").split("|")}
    split = ("config",)
    parts = {
        f"fedml_moon.{room}.{p.stem}"
        for room in split
        for p in (PACKAGE / room).glob("*.py")
        if p.stem != "__init__"
    }
    expected = {
        f"fedml_moon.{p.stem if p.is_file() else p.name}"
        for p in PACKAGE.iterdir()
        if (p.is_dir() and (p / "__init__.py").is_file() and p.name not in split)
        or (p.suffix == ".py" and p.stem not in ("__init__", "__main__", "losses"))
    }
    assert named == expected | parts


def test_only_the_adapters_and_the_distributed_layer_import_fedml():
    offenders = [
        name
        for name, path in _modules().items()
        if any(i == "fedml" or i.startswith("fedml.") for i in _imports(path))
        and not name.startswith(tuple(f"fedml_moon.{room}" for room in MAY_IMPORT_FEDML))
    ]
    assert offenders == []


@pytest.mark.slow
def test_the_round_engine_imports_without_fedml():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'fedml' or name.startswith('fedml.'):\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import fedml_moon.engine.rounds, fedml_moon.engine.parties, fedml_moon.engine.simulation\n"
        "import fedml_moon.engine.resume, fedml_moon.engine.batched, fedml_moon.results.report\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_no_import_cycle():
    """Counting imports inside functions too (report.py once imported report_text.py lazily while
    report_text.py imported report.py)."""
    modules = _modules()
    graph = {
        name: {i for i in _imports(path) if i in modules and i != name} for name, path in modules.items()
    }
    for name in graph:  # a package's __init__ aside, a module reached from itself is a cycle
        seen, stack = set(), list(graph[name])
        while stack:
            current = stack.pop()
            assert current != name, f"{name} imports itself back through {sorted(seen)[:8]}"
            if current not in seen:
                seen.add(current)
                stack.extend(graph[current])
