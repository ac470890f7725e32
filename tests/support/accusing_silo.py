"""A real silo with valid credentials whose party falsely names one honest neighbour for bad shares:
it garbles, in its own inbox, the ciphertext of its lowest-numbered sender, so it does not mask with
it and names it, and is otherwise the plugin's own silo (tests/test_secure_modes.py).

    python tests/support/accusing_silo.py run --cf CONFIG --set KEY=VALUE ... --rank R
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fedml_moon.cli import main  # noqa: E402
from fedml_moon.privacy.secagg import PartySession  # noqa: E402

_honest_mask = PartySession.mask


def accusing_mask(self: PartySession, vector, inbox: dict):
    """The party's honest masking, its lowest sender's ciphertext garbled first: a false accusation."""
    inbox = dict(inbox)
    first = min(inbox)
    inbox[first] = os.urandom(len(inbox[first]))
    return _honest_mask(self, vector, inbox)


PartySession.mask = accusing_mask
sys.exit(main())
