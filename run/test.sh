#!/usr/bin/env bash
# Install, then lint (ruff check + format check), build the documentation (mkdocs --strict) and run the
# whole test suite, slow tests included, one pytest-xdist worker per core; then where its time went
# (benchmarks/suite_budget.py: the slowest tests, each file's share, the tests that run each mode).
#   bash run/test.sh --quick   the quick tier, for the edit-and-test loop: install and lint, then the
#                              tests not marked slow (no test of it starts a process; tests/conftest.py)
# Other arguments go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
quick=0
if [ "${1:-}" = "--quick" ]; then
  quick=1
  shift
fi
bash run/setup.sh --tests || exit 1
.venv/bin/ruff check fedml_moon tests benchmarks examples docs || exit 1
.venv/bin/ruff format --check fedml_moon tests benchmarks examples docs || exit 1
if [ "$quick" -eq 1 ]; then
  .venv/bin/python -m pytest -q -n auto --dist load -m "not slow" "$@"
else
  bash run/docs.sh || exit 1
  # the budget's record: pytest's junit and each test's started processes (benchmarks/suite_budget.py)
  rm -rf outputs/suite && mkdir -p outputs/suite/processes
  FEDML_MOON_TEST_PROCESSES="$PWD/outputs/suite/processes" \
    .venv/bin/python -m pytest -q -n auto --dist load --maxschedchunk 2 --junitxml=outputs/suite/junit.xml "$@"
fi
rc=$?
if [ "$quick" -eq 0 ] && [ -s outputs/suite/junit.xml ]; then
  .venv/bin/python benchmarks/suite_budget.py --top 10 >&2
fi
if [ "$rc" -eq 5 ]; then
  echo "run/test.sh: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit "$rc"
