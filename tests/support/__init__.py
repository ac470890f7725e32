"""What the test files share: builders, marks, wires, writers of data and the scripts and plugins a
test starts or loads. A test file imports from here, never from another test file
(tests/test_suite_layout.py checks it)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository's root."""
