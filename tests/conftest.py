"""Suite-wide scheduling: the slow, multi-process tests start first.

`bash run/test.sh` runs the suite on every core with pytest-xdist (`-n auto --dist load
--maxschedchunk 2`): each worker is handed two tests at a time, in collection order, as it finishes
its last. Starting the slow tests first keeps one long end-to-end test from starting last while the
other workers sit idle; the order of the tests within each group is unchanged, and no test depends
on another's order.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
