"""Run one config in every mode on this machine (processes, loopback services, comparisons).

Modes: standalone, the MPI simulation (N parties on W < N workers, with sampling), cross-silo over
MPI, cross-silo over gRPC (silos started before the server) and MQTT + S3 (a mosquitto broker and a
moto S3 endpoint started here on 127.0.0.1). Every process runs the real command line; every
process started here is stopped again, and every wait is bounded.

Used by `fedml-moon check ALGORITHM` and by the test suite.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from fedml_moon.conformance.preloaded import enabled as preload_enabled
from fedml_moon.conformance.preloaded import forkable
from fedml_moon.conformance.preloaded import start as fork
from fedml_moon.modes import MODES  # noqa: F401 (the conformance suite's name for them)
from fedml_moon.run_folder import RunFolder, read_records

log = logging.getLogger(__name__)
TINY = [
    "data_args.max_train_samples=384",
    "data_args.max_test_samples=96",
    "train_args.client_num_in_total=3",
    "train_args.client_num_per_round=2",
    "train_args.comm_round=3",
    "train_args.epochs=1",
    "train_args.batch_size=32",
    "train_args.learning_rate=0.05",
    "train_args.state_store=disk",
    "tracking_args.enable_wandb=false",
    "tracking_args.plots=false",  # what is compared is in the records; a picture costs a run 0.5 s
    "validation_args.local_test=true",
]
MPI_WORKERS = 2
_ROOT_MPI = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout_s:.0f} s")


def stop(proc: subprocess.Popen, grace_s: float = 5.0, first: int = signal.SIGTERM) -> None:
    """Stop a process started with start_new_session=True, and everything it started: `first`
    (SIGTERM), then SIGKILL after `grace_s`."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, first)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


@dataclass
class Services:
    """A mosquitto broker and a moto S3 endpoint on 127.0.0.1 (for the MQTT_S3 mode)."""

    mqtt_port: int
    s3_port: int
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def overrides(self) -> list[str]:
        return [
            f"comm_args.mqtt_port={self.mqtt_port}",
            f"comm_args.s3_endpoint=http://127.0.0.1:{self.s3_port}",
        ]


def mosquitto_binary() -> str:
    found = shutil.which("mosquitto") or next(
        (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if Path(p).is_file()), None
    )
    if found is None:
        raise FileNotFoundError("mosquitto not found; install Debian's mosquitto (bash run/setup.sh does)")
    return found


@contextlib.contextmanager
def services(folder: Path, broker: str = "allow_anonymous true", listener: str = "") -> Iterator[Services]:
    """Start mosquitto and moto_server on free loopback ports; stop both on exit. `broker` and
    `listener`: mosquitto settings for the whole broker and for its listener (TLS files)."""
    folder.mkdir(parents=True, exist_ok=True)
    svc = Services(free_port(), free_port())
    conf = folder / "mosquitto.conf"
    conf.write_text(f"{broker}\npersistence false\nlistener {svc.mqtt_port} 127.0.0.1\n{listener}\n")
    moto = Path(sys.executable).with_name("moto_server")
    try:
        for cmd, name in (
            ([mosquitto_binary(), "-c", str(conf)], "mosquitto"),
            ([str(moto), "-H", "127.0.0.1", "-p", str(svc.s3_port)], "moto"),
        ):
            out = open(folder / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
            svc.procs.append(subprocess.Popen(cmd, stdout=out, stderr=out, start_new_session=True))
        wait_for_port(svc.mqtt_port, 20)
        wait_for_port(svc.s3_port, 30)
        yield svc
    finally:
        for proc in svc.procs:
            stop(proc)


@dataclass
class RunResult:
    mode: str
    out_dir: Path
    returncodes: list[int]
    logs: list[Path]

    @property
    def ok(self) -> bool:
        return all(rc == 0 for rc in self.returncodes) and RunFolder(self.out_dir).summary.is_file()

    def tail(self, lines: int = 30) -> str:
        return "\n".join(
            f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-lines:])
            for p in self.logs
        )


def process_env(home: Path) -> dict[str, str]:
    env = {**os.environ, "HOME": str(home), "PYTHONUNBUFFERED": "1"}
    env.setdefault("AWS_ACCESS_KEY_ID", "testing")  # moto accepts any credentials
    env.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    if os.geteuid() == 0:
        env.update(_ROOT_MPI)
    return env


def cli_command(command: str, config: str | Path, overrides: list[str], out_dir: Path) -> list[str]:
    cmd = [sys.executable, "-m", "fedml_moon", command, "--cf", str(config), "--output-dir", str(out_dir)]
    for item in overrides:
        cmd += ["--set", item]
    return cmd


def mpirun_command(np: int, cmd: list[str]) -> list[str]:
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise FileNotFoundError("mpirun not found; install Debian's openmpi-bin (bash run/setup.sh does)")
    return [mpirun, "--oversubscribe", "-np", str(np), *cmd]


def spawn(cmd: list[str], log_path: Path, env: dict[str, str], cwd: Path) -> subprocess.Popen:
    """Start `cmd` in a session of its own, its output to `log_path`: `python -m fedml_moon ...` and
    `python SCRIPT.py ...` forked from a process that has imported PyTorch and FedML's parts
    (`preloaded`, unless FEDML_MOON_PRELOAD=0 here), anything else (`mpirun ...`) as it is."""
    if preload_enabled() and forkable(cmd):
        return fork(cmd, log_path, env, cwd)  # type: ignore[return-value]
    out = open(log_path, "wb")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(
        cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True
    )


def wait_all(procs: list[subprocess.Popen], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            codes.append(-999)
    for proc in procs:
        stop(proc)
    return codes


def write_ipconfig(path: Path, ranks: int, port: int) -> Path:
    """FedML 0.9.6's ipconfig CSV for ranks 0..ranks-1 on 127.0.0.1; the server (rank 0) on `port`."""
    rows = ["eid,rank,grpc_server_ip,grpc_server_port,ingress_ip"]
    rows += [f"{r},{r},127.0.0.1,{port if r == 0 else port + r},127.0.0.1" for r in range(ranks)]
    path.write_text("\n".join(rows) + "\n")
    return path


def run_mode(
    mode: str,
    config: str | Path,
    overrides: list[str],
    folder: Path,
    svc: Services | None = None,
    timeout_s: float = 300.0,
) -> RunResult:
    """Run `config` in `mode`; outputs under folder/mode. Silos start before their server.

    The processes run in this process's working directory, so a relative path (the config, an
    override, a path inside the config) means what it means here."""
    config, folder = Path(config).resolve(), Path(folder).resolve()
    out, home = folder / mode, folder / "home"
    out.mkdir(parents=True, exist_ok=True)
    env, n = process_env(home), _parties(config, overrides)
    silo = ["common_args.training_type=cross_silo", f"comm_args.timeout_s={max(30, timeout_s / 3):.0f}"]
    if mode == "standalone":
        cmds = [cli_command("simulate", config, overrides, out / "run")]
    elif mode == "mpi-simulation":
        sim = [*overrides, "comm_args.backend=MPI", f"comm_args.timeout_s={max(30, timeout_s / 3):.0f}"]
        cmds = [mpirun_command(MPI_WORKERS + 1, cli_command("simulate", config, sim, out / "run"))]
    elif mode == "cross-silo-mpi":
        cmds = [
            mpirun_command(
                n + 1, cli_command("run", config, [*overrides, *silo, "comm_args.backend=MPI"], out / "run")
            )
        ]
    elif mode == "cross-silo-grpc":
        ipconfig = write_ipconfig(out / "ipconfig.csv", n + 1, free_port())
        grpc = [*overrides, *silo, "comm_args.backend=GRPC", f"comm_args.grpc_ipconfig_path={ipconfig}"]
        cmds = [
            [*cli_command("run", config, grpc, out / "run"), "--rank", str(r)] for r in (*range(1, n + 1), 0)
        ]
    elif mode == "mqtt-s3":
        if svc is None:
            raise ValueError("the mqtt-s3 mode needs the loopback services (conformance.services)")
        mqtt = [*overrides, *silo, "comm_args.backend=MQTT_S3", f"comm_args.run_id=check-{free_port()}"]
        mqtt += svc.overrides
        cmds = [
            [*cli_command("run", config, mqtt, out / "run"), "--rank", str(r)] for r in (*range(1, n + 1), 0)
        ]
    else:
        raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    logs = [out / f"process-{i}.log" for i in range(len(cmds))]
    procs = []
    for i, (cmd, log_path) in enumerate(zip(cmds, logs, strict=True)):
        procs.append(spawn(cmd, log_path, env, Path.cwd()))
        if i == len(cmds) - 2 and len(cmds) > 1:
            time.sleep(1.0)  # the silos are up (or starting) before the server
    return RunResult(mode, out / "run", wait_all(procs, timeout_s), logs)


def _parties(config: str | Path, overrides: list[str]) -> int:
    from fedml_moon.config.load import load_config

    return load_config(config, overrides).train_args.client_num_in_total


def compare(a: RunResult, b: RunResult) -> tuple[float, list[str]]:
    """(max |parameter difference| of the final models, metrics that differ beyond 1e-4)."""
    import torch

    ma = torch.load(RunFolder(a.out_dir).final_model, map_location="cpu", weights_only=True)
    mb = torch.load(RunFolder(b.out_dir).final_model, map_location="cpu", weights_only=True)
    diff = max(float((ma[k].double() - mb[k].double()).abs().max()) for k in ma)
    return diff, metric_differences(a, b)


def metric_differences(a: RunResult, b: RunResult) -> list[str]:
    """The recorded metrics of two runs that differ beyond 1e-4 (round times aside; and the bytes of
    evaluation and the pooled and site-mean figures where one run was evaluated centrally, the other by
    its parties), by round."""
    ra, rb = read_records(a.out_dir), read_records(b.out_dir)
    problems = [] if len(ra) == len(rb) else [f"{len(ra)} vs {len(rb)} rounds recorded"]
    other_evaluation = any("party_test" in r for r in ra) != any("party_test" in r for r in rb)
    for x, y in zip(ra, rb, strict=False):
        for key, value in x.items():
            federated_only = key.startswith(("eval_bytes", "pooled_", "site_mean_"))
            if key.endswith("_time_s") or (other_evaluation and federated_only):
                continue
            other = y.get(key)
            same = other == value or (
                isinstance(value, float) and isinstance(other, float) and abs(value - other) <= 1e-4
            )
            if not same:
                problems.append(f"round {x['round']} {key}: {value} vs {other}")
    return problems


def scratch_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="fedml-moon-check-"))
