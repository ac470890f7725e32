#!/usr/bin/env bash
# Build the documentation site into ./site (or the folder given) with `mkdocs build --strict`: a broken
# link, a page missing from the navigation or a reference page that cannot be generated fails it.
set -euo pipefail
cd "$(dirname "$0")/.."
NO_MKDOCS_2_WARNING=1 exec .venv/bin/mkdocs build --strict --site-dir "${1:-site}"
