"""MkDocs hook: the architecture page's floors and layout, read from the code at build time.

`<!-- architecture-floors -->` becomes the rooms of the import contracts' layers (pyproject.toml,
`[tool.importlinter]`), top floor first, each with the first sentence of its docstring, and the
other contracts by name; `<!-- architecture-layout -->` becomes every module of the package under
its room, each with the first sentence of its docstring."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

PACKAGE = Path(__import__("fedml_moon").__file__).resolve().parent  # the code the site documents
ROOT = PACKAGE.parent  # its pyproject.toml holds the import contracts
FLOORS, LAYOUT = "<!-- architecture-floors -->", "<!-- architecture-layout -->"


def first_sentence(path: Path) -> str:
    """The first sentence of a module's docstring: its first paragraph up to the first full stop
    outside backquotes (the whole paragraph when none ends it)."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    quoted = False
    for i, char in enumerate(paragraph):
        quoted = quoted != (char == "`")
        if char == "." and not quoted and paragraph[i + 1 : i + 2] in ("", " "):
            return paragraph[: i + 1]
    return paragraph or "(no docstring)"


def _path(module: str) -> Path:
    """`fedml_moon.x.y` -> the file or package folder it names."""
    parts = module.split(".")[1:]
    folder = PACKAGE.joinpath(*parts)
    return folder / "__init__.py" if folder.is_dir() else folder.with_suffix(".py")


def _shown(module: str) -> str:
    path = _path(module)
    rel = path.parent.relative_to(PACKAGE) if path.name == "__init__.py" else path.relative_to(PACKAGE)
    return f"`{rel}/`" if path.name == "__init__.py" else f"`{rel}`"


def floors() -> list[str]:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c for c in contracts if c["type"] == "layers"]
    out = ["| floor | rooms | what each is |", "|---|---|---|"]
    for n, layer in enumerate(layers["layers"]):
        rooms = [m.strip() for m in re.split(r"[|:]", layer)]
        joined = " : " if ":" in layer else " \\| "
        what = "<br>".join(f"{_shown(m)}: {first_sentence(_path(m))}" for m in rooms)
        out.append(f"| {len(layers['layers']) - n} | {joined.join(_shown(m) for m in rooms)} | {what} |")
    out += ["", "The other contracts:", ""]
    out += [f"- {c['name']}." for c in contracts if c["type"] != "layers"]
    return out


def layout() -> list[str]:
    out = []
    for folder in [PACKAGE, *sorted(p for p in PACKAGE.rglob("*") if (p / "__init__.py").is_file())]:
        if "__pycache__" in folder.parts:
            continue
        rel = "fedml_moon" if folder == PACKAGE else f"fedml_moon/{folder.relative_to(PACKAGE)}"
        out += [f"**`{rel}/`**: {first_sentence(folder / '__init__.py')}", ""]
        for path in sorted(folder.glob("*.py")):
            if path.name != "__init__.py":
                out.append(f"- `{path.name}`: {first_sentence(path)}")
        out.append("")
    return out


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    if FLOORS in markdown:
        markdown = markdown.replace(FLOORS, "\n".join(floors()))
    if LAYOUT in markdown:
        markdown = markdown.replace(LAYOUT, "\n".join(layout()))
    return markdown
