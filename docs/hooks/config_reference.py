"""MkDocs hook: the config reference page's tables are `fedml_moon.config.reference.markdown()`,
generated from the config's dataclasses at build time; the cluster how-to's table of a sweep file's
`slurm:` keys is `table_markdown()` of its dataclass, `results.cluster.SlurmArgs`."""

from __future__ import annotations

from typing import Any

MARKER = "<!-- config-reference -->"
PAGE = "reference/config.md"
SLURM_MARKER = "<!-- sweep-slurm-reference -->"  # the sweep file's slurm: section, on the cluster how-to
SLURM_PAGE = "how-to/cluster-sweep.md"


def _source(page: Any) -> str:
    """The page's path under docs/, with forward slashes."""
    file = getattr(page, "file", None)
    return str(getattr(file, "src_uri", None) or getattr(file, "src_path", "")).replace("\\", "/")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any, **kwargs: Any) -> str:
    if SLURM_MARKER in markdown and _source(page) == SLURM_PAGE:
        from fedml_moon.config.reference import table_markdown
        from fedml_moon.results.cluster import SECTION, SlurmArgs

        return markdown.replace(SLURM_MARKER, table_markdown(SlurmArgs, SECTION))
    if MARKER not in markdown or _source(page) != PAGE:
        return markdown
    from fedml_moon.config.reference import markdown as reference

    return markdown.replace(MARKER, reference())
