"""The house's rules, read from the code: the package root is a front hall, no class stacks more than
three of the plugin's own classes (mixins are members), and the distributed server's and silo's
phases talk to each other through methods only, never by reading another phase's fields."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import fedml_moon

PACKAGE = Path(fedml_moon.__file__).resolve().parent
ROOT_FILES = 10
MRO_OWN = 3


def test_the_package_root_holds_at_most_ten_python_files():
    files = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(files) <= ROOT_FILES, files


def _classes() -> list[type]:
    out = []
    for info in pkgutil.walk_packages([str(PACKAGE)], "fedml_moon."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        out += [c for _, c in inspect.getmembers(module, inspect.isclass) if c.__module__ == module.__name__]
    return out


def test_no_class_has_more_than_three_of_the_plugins_own_classes_in_its_mro():
    classes = _classes()
    assert len(classes) > 150  # every module was read
    stacked = {
        f"{c.__module__}.{c.__qualname__}": [
            k.__name__ for k in c.__mro__ if k.__module__.startswith("fedml_moon.")
        ]
        for c in classes
    }
    assert {name: own for name, own in stacked.items() if len(own) > MRO_OWN} == {}


def _methods(folder: Path) -> dict[str, set[str]]:
    """class name -> the names of the functions (and properties) it defines, over `folder`'s modules."""
    out: dict[str, set[str]] = {}
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                out[node.name] = {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
    return out


def _reads(path: Path, owner: str) -> list[tuple[int, str, str]]:
    """(line, member, name) for each `self.<owner>.<member>.<name>` in `path`, and (line, "", name) for
    each `self.<owner>.<name>`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        chain, value = [node.attr], node.value
        while isinstance(value, ast.Attribute):
            chain.insert(0, value.attr)
            value = value.value
        if isinstance(value, ast.Name) and value.id == "self" and chain[0] == owner and len(chain) >= 2:
            found.append((node.lineno, *(chain[1:3] if len(chain) >= 3 else ["", chain[1]])))
    return found


def _phase_reads(folder: Path, owner: str, members: dict[str, set[str]], shared: set[str]) -> list[str]:
    """Where a phase of `folder` reads another phase's field: `self.<owner>.<member>.<name>` whose
    name is no method of the member's class (`members`: member -> its class's methods)."""
    bad = []
    for path in folder.glob("*.py"):
        for line, member, name in _reads(path, owner):
            if member in members and name not in members[member]:
                bad.append(f"{path.name}:{line}: self.{owner}.{member}.{name}")
            elif member == "" and name not in shared and name not in members and not name.startswith("_"):
                bad.append(f"{path.name}:{line}: self.{owner}.{name}")
    return bad


def test_the_servers_phases_read_only_the_state_and_call_each_other():
    """A phase reads the server's state, its run settings, its rounds and the manager's services; of
    another phase it only calls methods."""
    folder = PACKAGE / "distributed" / "server"
    classes = _methods(folder)
    flow = classes["RoundPhases"] | classes["BufferedFlow"]
    members = {
        "ready": classes["ReadyPhase"],
        "round_phases": classes["RoundPhases"],
        "checkpoints": classes["CheckpointPhase"],
        "secure": classes["SecureSum"],
        "status_board": classes["StatusBoard"],
        "waiting": classes["Waiting"],
        "flow": flow,
    }
    manager = classes["ServerManager"]
    base = {"send", "is_dead", "heard_at", "silent_for", "refusals", "transport", "wait_log_every_s", "rank"}
    shared = {"state", "settings", "rounds", "session", "digest", "status"} | manager | base
    assert _phase_reads(folder, "server", members, shared) == []
    # the buffered flow's members (records, checkpoints, secure sums) call the flow's methods only
    called = [
        (p.name, line, member or name)
        for p in folder.glob("buffered_*.py")
        for line, member, name in _reads(p, "flow")
    ]
    assert [c for c in called if c[2] not in flow] == []
    assert len(called) >= 3


def test_the_silos_members_read_only_its_state_and_call_its_methods():
    folder = PACKAGE / "distributed" / "silo"
    classes = _methods(folder)
    members = {
        "secure": classes["SecureWorker"],
        "status_board": classes["SiloStatus"],
        "welcome": classes["Welcome"],
    }
    base = {"send", "is_dead", "heard_at", "silent_for", "refusals", "transport", "rank"}
    shared = {"state", "local", "build", "folder", "process", "timeout_s", "server_address"}
    assert _phase_reads(folder, "silo", members, shared | classes["SiloManager"] | base) == []
