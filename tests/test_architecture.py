"""The package's rooms keep to what they may import: only the FedML adapters and the distributed layer
import `fedml`; the round engine runs without it; no module imports another that imports it back."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "fedml_moon"
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
