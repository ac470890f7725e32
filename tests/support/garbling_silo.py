"""A real silo with valid credentials whose party sends its first neighbour random bytes in place of
its encrypted shares, and is otherwise the plugin's own silo (tests/test_secure_modes.py).

    python tests/support/garbling_silo.py run --cf CONFIG --set KEY=VALUE ... --rank R
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fedml_moon.cli import main  # noqa: E402
from fedml_moon.privacy.secagg import PartySession  # noqa: E402

_honest_share = PartySession.share


def garbled_share(self: PartySession, roster: dict, digests: dict) -> dict[int, bytes]:
    """The party's honest ciphertexts, the one to its lowest-numbered neighbour replaced by garbage."""
    out = _honest_share(self, roster, digests)
    first = min(out)
    out[first] = os.urandom(len(out[first]))
    return out


PartySession.share = garbled_share
sys.exit(main())
