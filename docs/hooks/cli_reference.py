"""MkDocs hook: the command-line reference page is `fedml-moon`'s own argparse help, at build time."""

from __future__ import annotations

import argparse
import os

MARKER = "<!-- cli-reference -->"


def _sections() -> list[str]:
    os.environ["COLUMNS"] = "80"  # argparse wraps to the terminal's width; the page: 80 fits its code blocks
    from fedml_moon.cli import build_parser

    parser = build_parser()
    out = ["## fedml-moon", "", "```text", parser.format_help().rstrip(), "```", ""]
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for name, command in sub.choices.items():
        out += [f"## fedml-moon {name}", "", "```text", command.format_help().rstrip(), "```", ""]
    return out


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, "\n".join(_sections()))
