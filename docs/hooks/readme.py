"""MkDocs hook: the site's home page is the README, its links made relative to `docs/`."""

from __future__ import annotations

import re
from pathlib import Path

MARKER = "<!-- readme -->"
ROOT = Path(__file__).resolve().parents[2]


def home_page() -> str:
    """README.md with `docs/...` links pointing inside the site and the changelog at its page."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    text = re.sub(r"\]\(docs/", "](", text)
    return text.replace("](CHANGELOG.md)", "](changelog.md)")


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    return markdown.replace(MARKER, home_page()) if MARKER in markdown else markdown
