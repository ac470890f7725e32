#!/usr/bin/env bash
# Install, then lint (ruff check + format check), build the documentation (mkdocs --strict) and run the
# whole test suite, slow tests included, one pytest-xdist worker per core.
set -uo pipefail
cd "$(dirname "$0")/.."
bash run/setup.sh --tests || exit 1
.venv/bin/ruff check fedml_moon tests benchmarks examples docs || exit 1
.venv/bin/ruff format --check fedml_moon tests benchmarks examples docs || exit 1
bash run/docs.sh || exit 1
.venv/bin/python -m pytest -q -n auto --dist load --maxschedchunk 2 "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "run/test.sh: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit "$rc"
