"""The C heap of the gRPC server: what glibc keeps of the large frames it has read.

glibc's malloc serves each thread from an arena of its own (up to 8 per core) and, once a freed block
of several MB has raised its mmap threshold, keeps later frame-sized blocks in those arenas when they
are freed. A server whose many gRPC threads read 7 MB frames therefore held more of them, freed, the
longer a flood went on (its resident set rose quarter by quarter, `benchmarks/server_memory.py`).
`HeapLimits` caps the arenas at `ARENAS` (the main thread's and one for all the others) and hands
the free memory back to the system (`malloc_trim`) at most once every `TRIM_EVERY_S` seconds after a
large frame was read. Neither changes how the server's tensors are allocated (a fixed mmap
threshold would: it made a forward pass 1.5x slower). Elsewhere than glibc both are no-ops.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
import time

log = logging.getLogger(__name__)
M_ARENA_MAX = -8  # glibc's mallopt parameter
ARENAS = 2
TRIM_EVERY_S = 1.0


def _glibc() -> ctypes.CDLL | None:
    """glibc, when this process runs on it (it has `mallopt` and `malloc_trim`); else None."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


class HeapLimits:
    """Caps the C heap's arenas when made; `read(size)` after each frame a peer sent trims the heap
    when a frame over `large_bytes` was read and the last trim is `TRIM_EVERY_S` old."""

    def __init__(self, large_bytes: int, arenas: int = ARENAS) -> None:
        self.large_bytes, self.trims = int(large_bytes), 0
        self._libc = _glibc()
        self.glibc = self._libc is not None
        self._last = 0.0
        self._lock = threading.Lock()
        if self._libc is not None:
            self._libc.mallopt(M_ARENA_MAX, int(arenas))

    def read(self, size: int) -> None:
        """A frame of `size` bytes was read (taken or refused): trim the heap if it is time."""
        if self._libc is None or size <= self.large_bytes:
            return
        now = time.monotonic()
        with self._lock:
            if now - self._last < TRIM_EVERY_S:
                return
            self._last = now
        self._libc.malloc_trim(0)
        self.trims += 1
