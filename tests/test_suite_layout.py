"""The suite's own layout: each test file stands alone. What several test files share lives in
tests/support/ (helpers, marks, the scripts and plugins a test starts or loads) or tests/conftest.py
(shared fixtures); no module of the suite or of the benchmarks imports a test file, and nothing but
test files, conftest.py and __init__.py sits at the top of tests/."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
AT_THE_TOP = {"conftest.py", "__init__.py"}
"""The modules other than test files that may sit at the top of tests/."""


def imported_test_files(source: str, package: tuple[str, ...], suite: str = "tests") -> set[str]:
    """The test files (`suite`/test_*.py, by module name) that a module of `package` whose text is
    `source` imports, anywhere in it: the suite's test modules imported whole, imported from, or
    taken from the suite's package, absolutely or relative to the module's own package."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the module's own package
                parent = package[: len(package) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            found |= {base} | {f"{base}.{a.name}" for a in node.names}
    return {".".join(name.split(".")[:2]) for name in found if name.startswith(f"{suite}.test_")}


def _package(path: Path) -> tuple[str, ...]:
    return path.parent.relative_to(ROOT).parts


def test_no_module_imports_a_test_file():
    """Every module of tests/ (test files, support, conftest) and of benchmarks/: a test file imported
    elsewhere is named with its importer."""
    modules = [*sorted(TESTS.rglob("*.py")), *sorted((ROOT / "benchmarks").rglob("*.py"))]
    found = {
        str(path.relative_to(ROOT)): sorted(imported)
        for path in modules
        if (imported := imported_test_files(path.read_text(), _package(path)))
    }
    assert found == {}, f"these import test files (move what they share to tests/support/): {found}"


def test_only_test_files_conftest_and_init_sit_at_the_top_of_tests():
    helpers = sorted(
        p.name for p in TESTS.glob("*.py") if not p.name.startswith("test_") and p.name not in AT_THE_TOP
    )
    assert helpers == [], f"modules at the top of tests/ that belong in tests/support/: {helpers}"


def test_the_check_names_each_form_of_importing_a_test_file():
    """The check itself, on the modules of a suite named `suite`: every form of importing one of its
    test files is named, relative ones resolved against the importer's package; its support modules
    and a test file's name in a string are not."""
    absolute = (
        "import suite.test_a\n"
        "from suite.test_b import helper\n"
        "from suite import test_c, support\n"
        "def later():\n"
        "    from suite import test_d\n"
    )
    named = {"suite.test_a", "suite.test_b", "suite.test_c", "suite.test_d"}
    assert imported_test_files(absolute, ("suite",), "suite") == named
    relative = "from .test_e import x\nfrom . import test_f\n"
    assert imported_test_files(relative, ("suite",), "suite") == {"suite.test_e", "suite.test_f"}
    assert imported_test_files("from ..test_g import y\n", ("suite", "support"), "suite") == {"suite.test_g"}
    clean = 'from suite.support import server\nfrom . import conftest\nDOC = "from suite.test_h import x"\n'
    assert imported_test_files(clean, ("suite",), "suite") == set()
