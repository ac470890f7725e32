"""The documentation: the README stays short, and the strict build fails on what drifts.

`bash run/docs.sh` (in the test command) builds the site with `mkdocs build --strict`. These tests
copy the documentation into a temporary folder, break it the ways it drifts (a page left out of the
navigation, a link to a page that moved, an anchor that is gone, a wrapped line that starts with `>`
and renders as a block quote) and check that the same build fails naming each; the home page is
the README with its links made relative to docs/.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MKDOCS = ROOT / ".venv/bin/mkdocs"
needs_mkdocs = pytest.mark.skipif(not MKDOCS.is_file(), reason="bash run/setup.sh installs mkdocs")


def test_the_readme_is_a_front_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    links = re.findall(r"\]\(((?:docs/|CHANGELOG)[^)#]*)", readme)
    assert links and all((ROOT / link).is_file() for link in links), [
        link for link in links if not (ROOT / link).is_file()
    ]


def test_the_home_page_is_the_readme_with_site_links():
    spec = importlib.util.spec_from_file_location("readme_hook", ROOT / "docs/hooks/readme.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = hook.home_page()
    assert "](docs/" not in page and "](CHANGELOG.md)" not in page
    assert "](tutorials/first-run.md)" in page and "](changelog.md)" in page


def _build(folder: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [str(MKDOCS), "build", "--strict", "--site-dir", str(folder / "site")]
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=180)


@needs_mkdocs
@pytest.mark.slow
def test_the_strict_build_fails_on_what_drifts(tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("mkdocs.yml", "README.md", "CHANGELOG.md"):
        shutil.copy(ROOT / name, copy / name)
    shutil.copytree(ROOT / "docs", copy / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "fedml_moon").symlink_to(ROOT / "fedml_moon")  # mkdocstrings reads the package's source
    (copy / "examples").symlink_to(ROOT / "examples")  # the tutorial includes the example's code
    docs = copy / "docs"
    (docs / "how-to" / "orphan.md").write_text("# A page nobody linked\n")
    page = docs / "tutorials" / "first-run.md"
    page.write_text(page.read_text() + "\n[gone](../how-to/moved.md) [anchor](../benchmarks.md#no-such)\n")
    wrapped = docs / "explanation" / "security.md"  # a wrapped line that starts with ">"
    wrapped.write_text(wrapped.read_text() + "\nBatchNorm variances must be\n>= 0 in every upload.\n")
    result = _build(copy)
    assert result.returncode != 0
    assert "explanation/security.md: a line starts with '>' and became a block quote ('= 0" in result.stderr
    assert "how-to/orphan.md" in result.stderr  # not in the navigation
    assert "../how-to/moved.md" in result.stderr  # a link to a page that is not there
    assert "#no-such" in result.stderr  # an anchor that is not there


@pytest.mark.slow
@pytest.mark.skipif(not (ROOT / ".venv/setup-stamp").is_file(), reason="run/setup.sh has not stamped .venv")
def test_setup_does_nothing_when_nothing_changed():
    """README: run/setup.sh "does nothing the second time": with its stamp current it runs no pip."""
    log = ROOT / ".venv/setup.log"
    before = log.stat().st_mtime_ns if log.exists() else None
    result = subprocess.run(["bash", "run/setup.sh"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    done = r"setup: done \(\.venv: Python 3\.1[1-3], torch \S+, numpy 2\.\S+, fedml 0\.9\.6\)"
    said = re.fullmatch(done, result.stderr.strip())
    assert result.returncode == 0 and said, result.stderr
    assert (log.stat().st_mtime_ns if log.exists() else None) == before  # pip was not called


def _stand_ins(tmp_path: Path, apt_exit: int) -> dict[str, str]:
    """PATH with stand-ins: `id -u` says root, `dpkg -s` finds no package, `apt-get` prints 300 lines
    and exits `apt_exit`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {
        "id": "#!/bin/sh\necho 0\n",
        "dpkg": "#!/bin/sh\nexit 1\n",
        "apt-get": f'#!/bin/sh\nfor i in $(seq 300); do echo "apt line $i"; done\nexit {apt_exit}\n',
    }
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


@pytest.mark.slow
@pytest.mark.skipif(not (ROOT / ".venv/setup-stamp").is_file(), reason="run/setup.sh has not stamped .venv")
@pytest.mark.parametrize("apt_exit", [0, 100])
def test_setup_shows_apts_output_only_when_apt_fails(tmp_path, apt_exit):
    env = _stand_ins(tmp_path, apt_exit)
    result = subprocess.run(
        ["bash", "run/setup.sh"], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env
    )
    said = result.stdout + result.stderr
    if apt_exit == 0:
        assert result.returncode == 0 and "apt line" not in said, said[-2000:]
        assert len(said.splitlines()) == 2  # what it installs, and done
    else:
        assert result.returncode == 1 and "apt-get install dataset-fashion-mnist" in result.stderr
        assert "failed; its output:" in result.stderr and "apt line 300" in result.stderr
        assert "apt line 200" not in result.stderr  # its last 40 lines


def test_the_command_line_reference_fits_its_code_blocks():
    """The CLI page is argparse's help wrapped at 80 columns, which a code block on the site shows whole."""
    spec = importlib.util.spec_from_file_location("cli_hook", ROOT / "docs/hooks/cli_reference.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    lines = "\n".join(hook._sections()).splitlines()
    assert any("--overwrite" in line for line in lines)
    assert max(len(line) for line in lines) <= 80, [line for line in lines if len(line) > 80]
