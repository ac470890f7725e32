"""Suite-wide scheduling: the slow, multi-process tests start first.

`bash run/test.sh` runs the suite on every core with pytest-xdist (`-n auto --dist worksteal`): a
worker that runs out of tests takes pending ones from another. Starting the slow tests first keeps
one long end-to-end test from starting last while the other worker sits idle; the order of the
tests within each group is unchanged, and no test depends on another's order.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
