"""A silo of several processes (common_args.scenario: hierarchical): each step's batch split across a
torch.distributed group (gloo on 127.0.0.1), gradients summed, trains what the one-process silo
trains; the algorithm does not know."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import signal
import sys
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from fedml_moon.config.schema import ServerArgs, TrainArgs
from fedml_moon.conformance import free_port
from fedml_moon.core.models import MoonNet, build_model
from fedml_moon.engine import sync_batchnorm
from fedml_moon.engine.batched import train_party
from fedml_moon.engine.data_parallel import DataParallel, active
from fedml_moon.registry import get_algorithm

ROUNDS, BATCH = 2, 10


def test_a_batch_is_split_in_contiguous_slices_that_cover_it_once():
    x, y = torch.arange(10).view(10, 1), torch.arange(10)
    for size in (1, 2, 3, 4, 12):
        parts = [DataParallel(r, size).shard(x, y) for r in range(size)]
        assert torch.equal(torch.cat([p[1] for p in parts]), y)
        assert abs(sum(p[2] for p in parts) - 1.0) < 1e-12
        assert max(len(p[1]) for p in parts) - min(len(p[1]) for p in parts) <= 1


def _options(name: str):
    spec = get_algorithm(name)
    extra = {"lg": {"split_preset": "head"}}.get(name, {})
    return spec, spec.options(**extra)


class BatchNormEncoder(torch.nn.Module):
    """A small encoder with BatchNorm2d and BatchNorm1d (resnet50's BatchNorm, at a test's size)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 6, 5, stride=2)
        self.bn2 = torch.nn.BatchNorm2d(6)
        self.fc = torch.nn.Linear(6 * 12 * 12, 40)
        self.bn1 = torch.nn.BatchNorm1d(40)
        self.out_features = 40

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn2(self.conv(x)))
        return torch.relu(self.bn1(self.fc(torch.flatten(x, 1))))


def _model(name: str) -> torch.nn.Module:
    if name == "batchnorm":
        return MoonNet(BatchNormEncoder(), 10, True, 32)
    return build_model(name, (1, 28, 28), 10, True, 32)


def _party_rounds(
    name: str, group: DataParallel | None, model_name: str = "simple-cnn", batch: int = BATCH
) -> dict:
    """ROUNDS local rounds of one party through the algorithm's both sides (the server algorithm
    moving the model between them), data-parallel over `group` when given; the uploads."""
    torch.manual_seed(0)
    spec, options = _options(name)
    train = TrainArgs(algorithm=name, epochs=1, batch_size=BATCH, learning_rate=0.05, momentum=0.9)

    def factory() -> torch.nn.Module:
        return _model(model_name)

    model = factory()
    if group is not None:
        sync_batchnorm.convert(model)
    generator = torch.Generator().manual_seed(1)
    data = [
        (torch.randn(n, 1, 28, 28, generator=generator), torch.randint(0, 10, (n,), generator=generator))
        for n in (batch, 7)
    ]
    client = spec.client(options, train, factory, 0)
    server = spec.server(options, ServerArgs(), train, 0)
    server.trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    server.class_counts = {0: [3] * 10}
    global_state = server.setup(OrderedDict((k, v.clone()) for k, v in model.state_dict().items()))
    state, uploads = {}, {}
    for r in range(ROUNDS):
        received = copy.deepcopy(server.download(global_state, 0))
        with active(group):
            _, upload = train_party(client, model, received, state, data, torch.device("cpu"), r, 0)
        uploads[r] = upload
        global_state = server.aggregate(global_state, [(17.0, upload)])
    return uploads


NAMES = ("scaffold", "lg", "moon", "fedssc", "fedprox")
BN_NAMES = ("moon", "scaffold", "lg")  # on the BatchNorm model: synchronised, then DDP's slices
CASES = [(n, "simple-cnn", True) for n in NAMES] + [
    (n, "batchnorm", sync) for sync in (True, False) for n in BN_NAMES
]


def _all_cases(group: DataParallel | None) -> dict:
    return {
        f"{name}/{model}/{sync}": _party_rounds(
            name, None if group is None else DataParallel(group.rank, group.size, sync_batchnorm=sync), model
        )
        for name, model, sync in CASES
        if group is not None or sync
    }


def _worker(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.save(_all_cases(DataParallel(rank, 2)), os.path.join(out, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_two_processes_train_what_one_trains(tmp_path):
    """SCAFFOLD's step hooks, LG-FedAvg's split, MOON's teachers, FedSSC's prototypes and FedProx's
    anchor, each over two rounds with a last batch of 7 split 4 + 3: both processes of the group end
    where the one-process party does (<= 1e-5), with the same upload; on a model with BatchNorm2d
    and BatchNorm1d too (synchronised BatchNorm: the whole batch's statistics). Without
    synchronisation (DDP's default) each slice's statistics give another model (by > 1e-5), which
    both processes still hold alike (the leader's running statistics)."""
    from fedml_moon.conformance.snapshot import differences, snapshot

    torch.set_num_threads(1)
    alone = _all_cases(None)
    mp.spawn(_worker, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    group = [torch.load(tmp_path / f"{rank}.pt", weights_only=True) for rank in (0, 1)]
    for rank in (0, 1):
        for case in alone:
            names = ("one process", f"process {rank}")
            found = differences(snapshot(alone[case]), snapshot(group[rank][case]), case, 1e-5, names)
            assert not found, found[:3]
    for name in BN_NAMES:
        synced, sliced = f"{name}/batchnorm/True", f"{name}/batchnorm/False"
        assert not differences(snapshot(group[0][sliced]), snapshot(group[1][sliced]), name, 0.0)
        assert differences(snapshot(alone[synced]), snapshot(group[0][sliced]), name, 1e-5)


def test_a_batch_smaller_than_the_group_is_refused_with_synchronised_batchnorm():
    """Every process takes part in every batch's statistics: a batch of 1 over 2 processes says so
    (before any collective, so the whole group stops alike)."""
    with pytest.raises(ValueError, match="batch of 1 samples cannot be split over the silo's 2 processes"):
        _party_rounds("fedavg", DataParallel(0, 2), "batchnorm", batch=1)


# --- a hierarchical silo in a cross-silo run over gRPC ----------------------------------------------

CONFIG = Path(__file__).resolve().parent.parent / "config" / "fashion_mnist" / "moon.yaml"
RUN = [
    "data_args.max_train_samples=600",
    "data_args.max_test_samples=200",
    "train_args.client_num_in_total=2",
    "train_args.client_num_per_round=2",
    "train_args.comm_round=3",
    "train_args.epochs=1",
    "train_args.batch_size=32",
    "tracking_args.enable_wandb=false",
    "common_args.training_type=cross_silo",
    "comm_args.backend=GRPC",
    "comm_args.timeout_s=60",
    "device_args.torch_threads=1",
]


def torchrun(port: int, nproc: int = 2) -> list[str]:
    """torchrun starting `nproc` processes of one silo on this host (its group's store on `port`)."""
    exe = Path(sys.executable).with_name("torchrun")
    return [str(exe), "--nnodes", "1", "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
            "--master-port", str(port), "-m", "fedml_moon"]  # fmt: skip


def _commands(
    folder: Path, hierarchical: int | None, extra: list[str], svc=None
) -> tuple[dict[int, list[str]], Path]:
    """The command of each rank (1, 2, then the server 0) of a gRPC run on 127.0.0.1 in `folder`
    (with `svc`, the loopback broker and S3 endpoint: an MQTT + S3 run); silo `hierarchical` as a
    torchrun group of 2 processes."""
    from fedml_moon.conformance.processes import cli_command, write_ipconfig

    folder.mkdir(parents=True, exist_ok=True)
    if svc is None:
        comm = [f"comm_args.grpc_ipconfig_path={write_ipconfig(folder / 'ipconfig.csv', 3, free_port())}"]
    else:
        comm = ["comm_args.backend=MQTT_S3", f"comm_args.run_id=group-{free_port()}", *svc.overrides]
    sets, out = [*RUN, *comm, *extra], folder / "run"
    cmds = {}
    for rank in (1, 2, 0):
        cmd = [*cli_command("run", CONFIG, sets, out), "--rank", str(rank)]
        if rank == hierarchical:
            group = ["common_args.scenario=hierarchical", "device_args.n_proc_per_node=2"]
            cmd = [*torchrun(free_port()), *cmd[3:], *[a for s in group for a in ("--set", s)]]
        cmds[rank] = cmd
    return cmds, out


def silo_run(
    folder: Path,
    hierarchical: int | None,
    extra: list[str] = (),
    kill_after: int | None = None,
    restart_after: int | None = None,
    svc=None,
    rejoin: bool = False,
) -> tuple[Path, list[int]]:
    """Server and silos 1, 2 over gRPC on 127.0.0.1; silo `hierarchical` is a torchrun group of 2
    processes. `kill_after`: SIGKILL its second process once that many rounds are recorded (with
    `rejoin`: once its torchrun has ended, its command again; the codes then start with the first
    torchrun's). `restart_after`: once that many rounds are checkpointed, SIGKILL the server and the
    group's torchrun, and start both again (the server with --resume). `svc`: over MQTT + S3
    through these loopback services."""
    from fedml_moon.conformance.processes import process_env, spawn, stop, wait_all
    from fedml_moon.conformance.recovery import wait_checkpoint, wait_rounds

    cmds, out = _commands(folder, hierarchical, list(extra), svc)
    env, procs = process_env(folder / "home"), {}
    try:
        for rank, cmd in cmds.items():
            procs[rank] = spawn(cmd, folder / f"rank-{rank}.log", env, Path.cwd())
        first = []
        if kill_after is not None:
            wait_rounds(out, kill_after, 240)
            pids = _group_pids(folder / f"rank-{hierarchical}.log")
            os.kill(pids[1], signal.SIGKILL)
            if rejoin:
                first = wait_all([procs[hierarchical]], 120)
                _gone(pids.values(), 30)
                log = folder / f"rank-{hierarchical}-again.log"
                procs[hierarchical] = spawn(cmds[hierarchical], log, env, Path.cwd())
        if restart_after is not None:
            wait_checkpoint(out, restart_after - 1, 240)
            for rank in (0, hierarchical):
                stop(procs[rank], first=signal.SIGKILL)
            _gone(_group_pids(folder / f"rank-{hierarchical}.log").values(), 30)
            again = {hierarchical: cmds[hierarchical], 0: [*cmds[0], "--resume", str(out)]}
            for rank, cmd in again.items():
                procs[rank] = spawn(cmd, folder / f"rank-{rank}-again.log", env, Path.cwd())
        codes = first + wait_all([procs[r] for r in (1, 2, 0)], 400)
    finally:
        for proc in procs.values():
            stop(proc)
    return out, codes


def _group_pids(log: Path) -> dict[int, int]:
    """process -> pid of a torchrun group, from the lines its processes log as they join."""
    found = re.findall(r"process (\d) of 2 \(gloo\), pid (\d+)", log.read_text(errors="replace"))
    assert len(found) == 2, log.read_text(errors="replace")[-2000:]
    return {int(k): int(pid) for k, pid in found}


def _gone(pids, timeout_s: float) -> None:
    """Every pid has exited within `timeout_s` (a group's processes end with their torchrun)."""
    import time

    deadline = time.monotonic() + timeout_s
    while (alive := [p for p in pids if Path(f"/proc/{p}").exists()]) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in alive:  # the test leaves nothing behind, whatever it finds
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not alive, f"group processes {alive} outlived their torchrun"


def _final(out: Path) -> dict:
    return torch.load(out / "final_model.pt", weights_only=True)


@pytest.mark.slow
def test_a_hierarchical_silo_ends_where_the_one_process_silo_ends(tmp_path):
    """Server and two silos over gRPC, 3 rounds of MOON: silo 1 as torchrun's 2 processes (gloo),
    killed with the server (SIGKILL to both, after round 1's checkpoint; the group's processes end
    with their torchrun) and restarted (the server with --resume), gives the final model of the
    same run never interrupted, whose every party trains in one process: the standalone loop's
    (<= 1e-5; its equality with one-process silos in every mode: tests/test_modes.py)."""
    from tests.support.cli import restored_main

    flat = tmp_path / "flat"
    alone = [*RUN, "common_args.training_type=simulation", "comm_args.backend=sp"]
    with restored_main() as main:
        sets = [a for s in alone for a in ("--set", s)]
        assert main(["simulate", "--cf", str(CONFIG), *sets, "--output-dir", str(flat)]) == 0
    extra = ["train_args.checkpoint_every=1"]
    group, codes = silo_run(tmp_path / "group", 1, extra, restart_after=1)
    logs = {name: (tmp_path / "group" / f"{name}.log").read_text() for name in ("rank-1", "rank-1-again")}
    assert codes == [0, 0, 0], logs["rank-1-again"][-3000:]
    for log in logs.values():
        assert "silo 1: process 0 of 2 (gloo)" in log and "silo 1: process 1 of 2 (gloo)" in log
    for r in range(3):
        said = f"silo group process 1 of 2: round {r} trained on its slice of every batch"
        assert said in logs["rank-1" if r == 0 else "rank-1-again"]
    for name in ("rank-0", "rank-0-again"):  # only the leader talks to the server
        server = (tmp_path / "group" / f"{name}.log").read_text()
        assert server.count("rank 1 subscribed") == 1 and "refused" not in server.lower(), server[-3000:]
    # the leader alone checkpoints (docs/reference/outputs.md): its folder, never a follower's
    leader, follower = group / "rank-1", group / "rank-1" / "process-1"
    assert (leader / "checkpoint").is_dir() and follower.is_dir() and not (follower / "checkpoint").exists()
    a, b = _final(flat), _final(group)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-5


@pytest.mark.slow
def test_a_dead_group_process_fails_its_silos_round_and_the_restarted_group_rejoins(tmp_path):
    """Over MQTT + S3 (a broker and an S3 endpoint on 127.0.0.1): silo 1's group trains round 0
    through its leader; SIGKILL to its second process after round 1: the silo's round fails, its
    torchrun ends (exit != 0), the server goes on without it (min_reports 1) until the group's
    torchrun command, started again, rejoins: the round it failed is sent to it again if the server
    still waits for it, and both processes train every round from then on, to the last; the run
    completes."""
    from fedml_moon.conformance.processes import services

    rounds = 60  # room for a restart that is slow on a busy machine: the others go on meanwhile
    sets = ["comm_args.min_reports=1", f"train_args.comm_round={rounds}"]
    with services(tmp_path / "services") as svc:
        out, codes = silo_run(tmp_path / "run", 1, sets, kill_after=1, svc=svc, rejoin=True)
    folder = tmp_path / "run"
    dead, silo, other, server = codes
    first, again = [(folder / name).read_text() for name in ("rank-1.log", "rank-1-again.log")]
    assert "silo group process 1 of 2: round 0 trained on its slice of every batch" in first
    assert dead != 0 and (silo, other, server) == (0, 0, 0), (folder / "rank-0.log").read_text()[-3000:]
    assert re.search(r"rank 1 (is back|restarted during)", (folder / "rank-0.log").read_text())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == rounds
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    said = r"silo group process 1 of 2: round (\d+) trained"
    failed = max(int(r) for r in re.findall(said, first)) + 1  # the round the kill failed
    without = [r["round"] for r in records if r["parties"] == 1]
    parties = [r["parties"] for r in records]
    # the rounds the server went on without it (none where the restart beat its wait: it was then
    # sent that round's work again), then every round trained by the restarted group, to the last
    assert without == list(range(failed, failed + len(without))), parties
    trained = [int(r) for r in re.findall(said, again)]
    assert trained and trained == list(range(failed + len(without), rounds)), again[-3000:]


def _silo_config(*sets: str):
    from fedml_moon.config.load import load_config

    base = [*RUN, "comm_args.backend=MQTT_S3", "common_args.scenario=hierarchical", *sets]
    return load_config(CONFIG, base)


def test_a_group_torchrun_did_not_start_is_refused_naming_what_is_missing(monkeypatch):
    from fedml_moon.distributed.silo.group import TORCHRUN_ENV, join
    from fedml_moon.errors import ConfigError

    for key in TORCHRUN_ENV:
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(
        ConfigError, match="common_args.scenario: torchrun starts a hierarchical silo and sets RANK.*mpirun"
    ):
        join(_silo_config(), 1)
    assert join(_silo_config(), 0) is None  # the server is never a group
    assert join(_silo_config("common_args.scenario=horizontal"), 1) is None


def test_a_rank_of_one_process_that_torchrun_started_several_times_is_refused(monkeypatch):
    """Each copy would act as the whole rank (two silos 1, two servers): the server says to start it
    without torchrun, a horizontal silo names the --set that make it a group; one copy is fine."""
    from fedml_moon.distributed.silo.group import join
    from fedml_moon.errors import ConfigError

    env = {"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "4", "GROUP_WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    horizontal = _silo_config("common_args.scenario=horizontal")
    fix = "--set common_args.scenario=hierarchical --set device_args.n_node_in_silo=2 "
    fix += "--set device_args.n_proc_per_node=2"
    with pytest.raises(ConfigError, match=re.escape(f"torchrun started 4 processes of silo 1: add {fix}")):
        join(horizontal, 1)
    for cfg in (horizontal, _silo_config()):
        with pytest.raises(ConfigError, match=r"4 processes of the server \(rank 0\), which is one process"):
            join(cfg, 0)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert join(horizontal, 1) is None and join(horizontal, 0) is None


def test_on_gpus_the_leaders_cpu_broadcasts_go_through_gloo_and_cuda_tensors_through_nccl():
    """nccl carries CUDA tensors only; the leader's broadcasts (`Channel`, the group's settings) are
    CPU tensors, so a group on GPUs takes both backends, one per device type."""
    from fedml_moon.distributed.silo.group import group_backend

    assert group_backend(cuda=False) == "gloo"
    assert group_backend(cuda=True) == "cpu:gloo,cuda:nccl"


def test_a_group_of_the_wrong_size_is_refused_before_it_forms(monkeypatch):
    from fedml_moon.distributed.silo.group import join
    from fedml_moon.errors import ConfigError

    env = {"RANK": "0", "WORLD_SIZE": "3", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    cfg = _silo_config("device_args.n_node_in_silo=1", "device_args.n_proc_per_node=2")
    with pytest.raises(
        ConfigError, match=r"n_node_in_silo x n_proc_per_node is 1 x 2 = 2, but torchrun started 3"
    ):
        join(cfg, 1)


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("common_args.scenario=vertical", r"horizontal \(a silo is one process\) or hierarchical"),
        ("device_args.n_proc_per_node=0", "device_args.n_proc_per_node: must be an integer >= 1"),
        ("device_args.n_node_in_silo=two", "device_args.n_node_in_silo"),
        ("device_args.sync_batchnorm=sometimes", "device_args.sync_batchnorm: must be true or false"),
    ],
)
def test_hierarchical_keys_are_checked(key, says):
    from fedml_moon.errors import ConfigError

    with pytest.raises(ConfigError, match=says):
        _silo_config(key)


def test_a_groups_batchnorm_is_the_plain_module_outside_a_group():
    """A silo's model keeps its parameters, buffers and state-dict keys (a group's upload is a plain
    model's), and outside a group, or in eval mode, computes exactly what the plain model does."""
    from fedml_moon.distributed.silo.group import Group, prepare_batchnorm

    torch.manual_seed(0)
    plain = build_model("resnet50", (3, 32, 32), 10, True, 32)
    model = copy.deepcopy(plain)
    prepare_batchnorm(model, Group(0, 2, 0, 2))
    converted = [m for m in model.modules() if isinstance(m, sync_batchnorm.GroupBatchNorm)]
    assert len(converted) == 53  # resnet50's BatchNorm2d layers
    assert list(model.state_dict()) == list(plain.state_dict())
    x = torch.randn(4, 3, 32, 32)
    for mode in ("train", "eval"):
        getattr(plain, mode)(), getattr(model, mode)()
        assert torch.equal(plain(x).logits, model(x).logits)
    pairs = zip(plain.state_dict().values(), model.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
