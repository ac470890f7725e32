"""MkDocs hook: the documentation quotes nothing, so a block quote on a page is a wrapped line that
began with `>` (">= 0" at a line's start): a warning naming the page and the line, which fails the
strict build."""

from __future__ import annotations

import logging
import re

log = logging.getLogger("mkdocs.plugins.quotes")


def on_page_content(html: str, page, config, files, **kwargs) -> str:
    for quoted in re.findall(r"<blockquote>(.*?)</blockquote>", html, flags=re.S):
        text = " ".join(re.sub(r"<[^>]+>", "", quoted).split())[:80]
        log.warning(
            "%s: a line starts with '>' and became a block quote (%r): rewrap it so that it does not",
            page.file.src_path,
            text,
        )
    return html
