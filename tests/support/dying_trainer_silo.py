"""A real silo that dies when its first TRAIN arrives, before training it (tests/test_buffered_modes.py):
no BYE, no ERROR, no more heartbeats, as a killed process. Otherwise the plugin's own silo.

    python tests/support/dying_trainer_silo.py run --cf CONFIG --set KEY=VALUE ... --rank R
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fedml_moon.cli import main  # noqa: E402
from fedml_moon.distributed.silo.manager import PluginClientManager  # noqa: E402


def die(self, msg) -> None:
    """The process ends at once, as a killed one does (no BYE, no ERROR, no more heartbeats)."""
    os._exit(9)


PluginClientManager.on_train = die
sys.exit(main())
