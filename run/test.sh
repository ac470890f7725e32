#!/usr/bin/env bash
# Install, then lint (ruff check + format check) and run the whole test suite, slow tests included.
set -uo pipefail
cd "$(dirname "$0")/.."
bash run/setup.sh || exit 1
.venv/bin/ruff check fedml_moon tests benchmarks examples || exit 1
.venv/bin/ruff format --check fedml_moon tests benchmarks examples || exit 1
.venv/bin/python -m pytest -q "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "run/test.sh: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit "$rc"
