"""A real silo that dies, as a killed process does (no BYE, no ERROR, no more heartbeats), at the
moment its first argument names; otherwise the plugin's own silo:

- `unmask`: when the server asks it to unmask, after it sent its masked vector and before it reveals
  any share (tests/test_secure_modes.py);
- `train`: when its first TRAIN arrives, before training it (tests/test_buffered_modes.py).

    python tests/support/dying_silo.py unmask|train run --cf CONFIG --set KEY=VALUE ... --rank R
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fedml_moon.cli import main  # noqa: E402
from fedml_moon.distributed.silo.manager import SiloManager  # noqa: E402
from fedml_moon.distributed.silo.secure import SecureWorker  # noqa: E402

HANDLERS = {"unmask": (SecureWorker, "on_sa_unmask"), "train": (SiloManager, "on_train")}
"""The moment -> the silo's handler of the message it dies on (its class, and the handler's name)."""


def die(self, msg) -> None:
    """The process ends at once, as a killed one does (no BYE, no ERROR, no more heartbeats)."""
    os._exit(9)


if __name__ == "__main__":
    setattr(*HANDLERS[sys.argv.pop(1)], die)
    sys.exit(main())
