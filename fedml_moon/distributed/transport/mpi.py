"""MPI transport: codec bytes in MPI_BYTE buffers (mpi4py's buffer API, which does not pickle).

A receive thread probes for messages with a growing sleep (0.5 ms up to 20 ms while idle), so a
waiting rank uses a few hundred wake-ups a second rather than a core. Sends are non-blocking
(`Isend`; the buffer is kept until the send completes), so a stalled rank cannot stall the server.
Needs MPI_THREAD_MULTIPLE (mpi4py asks for it by default): several threads send while the receive
thread receives.

No thread calls MPI once it is being finalized: every call of a transport's threads (the receive
loop, a heartbeat's send) holds `_CALLS` and first checks `_closed`, which `finalize()` and, at the
interpreter's exit, a hook that runs before mpi4py's own finalize set under the same lock. (A daemon
thread's send after MPI_Finalize makes Open MPI abort the process, and mpirun the job, after a run
that completed.)
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from typing import Any

from fedml_moon.distributed.transport.base import QueueTransport

log = logging.getLogger(__name__)
TAG = 7113
IDLE_SLEEP_S = (0.0005, 0.02)
_CALLS = threading.Lock()
_closed = False  # MPI is (being) finalized: no transport thread calls it any more
_hooked = False  # _close registered with atexit


def _close() -> None:
    global _closed
    with _CALLS:
        _closed = True


def finalize() -> None:
    """Finalize MPI (where initialized and not yet finalized) with no transport thread inside an MPI
    call, and none calling it after."""
    from mpi4py import MPI

    _close()
    with _CALLS:
        if MPI.Is_initialized() and not MPI.Is_finalized():
            MPI.Finalize()


class MpiTransport(QueueTransport):
    def __init__(self, comm: Any, rank: int) -> None:
        super().__init__(rank)
        from mpi4py import MPI

        self._mpi, self.comm = MPI, comm
        self._sends: list[tuple[Any, bytes]] = []
        self._send_lock = threading.Lock()
        global _hooked
        if not _hooked:  # runs before mpi4py's finalize at exit (registered at its import)
            atexit.register(_close)
            _hooked = True
        self._thread = threading.Thread(target=self._receive_loop, name=f"mpi-recv-{rank}", daemon=True)
        self._thread.start()

    def send_bytes(self, receiver: int, data: bytes) -> None:
        with self._send_lock, _CALLS:
            if _closed:
                log.debug("not sent to rank %d: MPI is finalized", receiver)
                return
            self._sends = [(req, buf) for req, buf in self._sends if not req.Test()]
            request = self.comm.Isend([data, self._mpi.BYTE], dest=receiver, tag=TAG)
            self._sends.append((request, data))

    def _receive_loop(self) -> None:
        mpi, status, pause = self._mpi, self._mpi.Status(), IDLE_SLEEP_S[0]
        while self.running:
            with _CALLS:
                if _closed:
                    return
                buf = None
                if self.comm.Iprobe(source=mpi.ANY_SOURCE, tag=TAG, status=status):
                    buf = bytearray(status.Get_count(mpi.BYTE))
                    self.comm.Recv([buf, mpi.BYTE], source=status.Get_source(), tag=TAG)
            if buf is None:
                time.sleep(pause)
                pause = min(pause * 2, IDLE_SLEEP_S[1])
                continue
            pause = IDLE_SLEEP_S[0]
            self.deliver(bytes(buf), f"rank {status.Get_source()}")

    def close(self) -> None:
        deadline = time.monotonic() + 10.0  # let the last messages (BYE, ABORT) leave
        with self._send_lock:
            while self._sends and time.monotonic() < deadline:
                with _CALLS:
                    if _closed:
                        break
                    self._sends = [(req, buf) for req, buf in self._sends if not req.Test()]
                time.sleep(0.005)
        self._thread.join(timeout=2 * IDLE_SLEEP_S[1] + 1)
