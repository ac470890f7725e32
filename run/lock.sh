#!/usr/bin/env bash
# Regenerate the locks run/setup.sh installs: requirements/py3.X.txt for each supported Python found.
#   bash run/lock.sh [python3.12 ...]     (default: python3.11 python3.12 python3.13)
# Each lock is what pip resolves today for `pip install -e ".[test]"` (fedml_moon's own requirements
# and FedML's parts', none of FedML's pins) in a new virtual environment, plus FedML 0.9.6 installed
# --no-deps: every package at one version, for `pip install --no-deps -r`. Run the suite on the new
# locks before committing them.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p requirements
pythons=("$@")
[ ${#pythons[@]} -gt 0 ] || pythons=(python3.11 python3.12 python3.13)
for name in "${pythons[@]}"; do
  ver=$("$name" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  tmp=$(mktemp -d)
  "$name" -m venv "$tmp/venv"
  "$tmp/venv/bin/python" -m pip install -q --upgrade pip wheel
  "$tmp/venv/bin/python" -m pip install -q -e ".[test]" -e examples/headprox
  "$tmp/venv/bin/python" -m pip install -q --no-deps fedml==0.9.6
  {
    echo "# CPython $ver, Linux x86_64: bash run/lock.sh writes this file; pip install --no-deps -r reads it."
    echo "# fedml 0.9.6 is here without its published pins (docs/explanation/fedml-compat.md)."
    "$tmp/venv/bin/python" -m pip freeze --exclude-editable --all | grep -v -e '^pip==' -e '^wheel==' | LC_ALL=C sort -f
  } >"requirements/py$ver.txt"
  rm -rf "$tmp"
  echo "lock: requirements/py$ver.txt ($(grep -vc '^#' "requirements/py$ver.txt") packages)" >&2
done
