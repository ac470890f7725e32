"""One module owns a run's output folder (`fedml_moon.run_folder`): no other module of the package
spells one of its file or folder names; its atomic write leaves the old file or the new one, never a
part, and no temporary file; its records reader leaves out a line being written."""

from __future__ import annotations

import ast
import json
import sys
import threading
from pathlib import Path

import pytest

from fedml_moon import run_folder as layout
from fedml_moon.run_folder import RunFolder, read_json, read_records, replacing, write_json, write_text

PACKAGE = Path(__file__).resolve().parent.parent / "fedml_moon"
OTHER_MEANINGS = {  # the same word, not a name in a run's folder
    ("distributed/protocol.py", "checkpoint"),  # a message's type
    ("distributed/protocol.py", "report"),  # a message's type
    ("distributed/server/rounds.py", "checkpoint"),  # the server's phase, named after the message
    ("distributed/server/checkpoint.py", "checkpoint"),  # the phase it is
    ("status/record.py", "checkpoint"),  # the same phase, as `status` says it
    ("cli/__init__.py", "report"),  # the command's name
    ("cli/__init__.py", "replay"),  # the command's name
    ("adapters/run.py", "tensorboard"),  # the package's name (importlib.util.find_spec)
    ("conformance/preloaded.py", "wandb"),  # the package's name
    ("algorithms/baselines.py", "party_models"),  # SOLO's state key
}


def _names() -> tuple[set[str], set[str]]:
    """The layout's names: plain ones, and those of a pattern (`rank-{}`)."""
    spelt = {v for k, v in vars(layout).items() if k.isupper() and isinstance(v, str)}
    return {n for n in spelt if "{}" not in n}, {n for n in spelt if "{}" in n}


def _spelt(tree: ast.AST) -> list[tuple[int, str]]:
    """Every string literal of a module as (line, text), an f-string as one with `{}` for each value;
    the pieces of an f-string are not literals of their own."""
    pieces = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
            found.append((node.lineno, text))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in pieces:
            found.append((node.lineno, node.value))
    return found


def test_no_module_but_the_layout_spells_a_name_of_the_run_folder():
    plain, patterns = _names()
    named = plain | patterns | {p.format("*") for p in patterns}  # a glob of a pattern too
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        if module == "run_folder.py":
            continue
        for line, text in _spelt(ast.parse(path.read_text())):
            allowed = (module, text) in OTHER_MEANINGS
            if text in named and not allowed:
                offenders.append(f"fedml_moon/{module}:{line}: {text!r}")
    assert offenders == [], "spell these through fedml_moon.run_folder:\n" + "\n".join(offenders)


def test_the_allow_lists_name_literals_that_are_there():
    """An entry whose literal is gone (its module now takes the name from the layout) is removed."""
    for module, text in OTHER_MEANINGS:
        spelt = {t for _, t in _spelt(ast.parse((PACKAGE / module).read_text()))}
        assert text in spelt, f"{module} no longer spells {text!r}: remove it from the allow-list"


def test_the_layout_imports_only_the_standard_library():
    """So that `core` may take its names from it, and the commands that only read a folder import no
    PyTorch."""
    nodes = list(ast.walk(ast.parse((PACKAGE / "run_folder.py").read_text())))
    imported = {a.name for n in nodes if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in nodes if isinstance(n, ast.ImportFrom) and n.module}
    assert {name.split(".")[0] for name in imported} <= set(sys.stdlib_module_names) | {"__future__"}


def test_a_run_folder_names_its_files_and_its_silos_folders(tmp_path):
    run = RunFolder(tmp_path)
    assert run.metrics == tmp_path / "metrics.jsonl" and run.summary == tmp_path / "summary.json"
    assert run.model("completed") == run.final_model == tmp_path / "final_model.pt"
    assert run.model("failed") == tmp_path / "model_at_failed.pt"
    assert run.party_model(3) == tmp_path / "party_models" / "party_3.pt"
    assert run.latest == tmp_path / "checkpoint" / "LATEST" and not run.checkpointed
    assert run.rank(2).process(1).status == tmp_path / "rank-2" / "process-1" / "status.json"
    run.latest.parent.mkdir()
    run.latest.write_text("4")
    (tmp_path / "model_at_interrupted.pt").write_bytes(b"")
    assert run.checkpointed and run.models_at() == [tmp_path / "model_at_interrupted.pt"]


def test_an_atomic_write_leaves_the_old_file_or_the_new_never_a_part(tmp_path):
    """A reader in another thread, reading while the file is rewritten again and again, only ever
    sees one of the whole versions; no temporary file is left."""
    path = tmp_path / "status.json"
    versions = [{"round": i, "pad": "x" * (50_000 + i)} for i in range(40)]
    write_json(path, versions[0])
    seen, done = [], threading.Event()

    def read() -> None:
        while not done.is_set():
            seen.append(json.loads(path.read_text()))  # raises on a part

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for version in versions[1:]:
            write_json(path, version, indent=1)
    finally:
        done.set()
        reader.join()
    assert seen and all(v in versions for v in seen)
    assert read_json(path) == versions[-1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["status.json"]


def test_an_atomic_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "job.json"
    write_text(path, "old")
    with pytest.raises(RuntimeError), replacing(path) as tmp:
        tmp.write_text("half of the ne")
        raise RuntimeError("the writer stopped")
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["job.json"]
    with pytest.raises(ValueError):  # JSON that cannot be written is refused before the file is touched
        write_json(path, {"loss": float("nan")}, allow_nan=False)
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["job.json"]


def test_an_atomic_write_makes_its_folder(tmp_path):
    write_text(tmp_path / "rank-1" / "data_digest.json", "{}\n")
    assert read_json(tmp_path / "rank-1" / "data_digest.json") == {}


def test_reading_json_that_is_missing_or_not_json(tmp_path):
    assert read_json(tmp_path / "summary.json", None) is None
    (tmp_path / "summary.json").write_text('{"status": "compl')
    assert read_json(tmp_path / "summary.json", {}) == {}
    with pytest.raises(ValueError):
        read_json(tmp_path / "summary.json")
    with pytest.raises(FileNotFoundError):
        read_json(tmp_path / "status.json")


def test_the_records_reader_leaves_out_a_line_being_written(tmp_path):
    assert read_records(tmp_path) == []  # no metrics.jsonl yet
    rows = [{"round": 0, "train_loss": 1.5}, {"round": 1, "train_loss": 1.25}]
    whole = "".join(json.dumps(r) + "\n" for r in rows)
    (tmp_path / "metrics.jsonl").write_text(whole + '{"round": 2, "train_lo')
    assert read_records(tmp_path) == rows
    assert read_records(RunFolder(tmp_path)) == rows
    (tmp_path / "metrics.jsonl").write_text(whole + "\n")  # a blank line is no record
    assert read_records(tmp_path) == rows
