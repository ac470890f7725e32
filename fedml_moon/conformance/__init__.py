"""Run one config in every mode on this machine and check that the modes agree, that a stopped run
resumes where it stopped, that secure sums carry what the plain aggregate reads, that buffered
aggregation reduces to the synchronous round and takes stale updates, and that stacked parties
compute what sequential ones do.

Modes: standalone, the MPI simulation (N parties on W < N workers, with sampling), cross-silo over
MPI, cross-silo over gRPC (silos started before the server) and MQTT + S3 (a mosquitto broker and a
moto S3 endpoint started here on 127.0.0.1). Every process runs the real command line; every process
started here is stopped again, and every wait is bounded. Used by `fedml-moon check ALGORITHM` and by
the test suite.
"""

from fedml_moon.conformance.buffered import buffered_vs_sync
from fedml_moon.conformance.checks import (
    Check,
    check_algorithm,
    party_states,
    payload_problems,
    resume_check,
)
from fedml_moon.conformance.inprocess import Traced, traced_run
from fedml_moon.conformance.paths import Outcome, float64_rounds, secure_vs_plain
from fedml_moon.conformance.processes import (
    MODES,
    TINY,
    RunResult,
    Services,
    cli_command,
    compare,
    free_port,
    mpirun_command,
    process_env,
    run_mode,
    services,
    spawn,
    stop,
    wait_all,
    wait_for_port,
    write_ipconfig,
)
from fedml_moon.conformance.snapshot import differences, same_tree, snapshot

__all__ = [
    "Outcome",
    "buffered_vs_sync",
    "Traced",
    "differences",
    "float64_rounds",
    "resume_check",
    "secure_vs_plain",
    "snapshot",
    "traced_run",
    "MODES",
    "TINY",
    "Check",
    "RunResult",
    "Services",
    "check_algorithm",
    "compare",
    "free_port",
    "party_states",
    "payload_problems",
    "run_mode",
    "same_tree",
    "services",
    "stop",
    "wait_for_port",
    "write_ipconfig",
    "cli_command",
    "process_env",
    "mpirun_command",
    "spawn",
    "wait_all",
]
