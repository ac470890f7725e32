"""What a site with a problem meets in a real cross-silo run on the sites' own data (gRPC, 127.0.0.1,
real processes: the server, each site and their restarts are separate programs, as at three
organisations). A site whose folder holds a file that does not decode refuses its own data in one
line with exit code 2; the server names the rank and the kind of problem (no path), keeps waiting,
the other site says what it waits for, and the site, fixed and started again, joins. Killed mid-run
and started again with one image moved to another class (the same count), the site refuses itself;
with its data put back it rejoins and the run completes. A second run, its server in another folder,
needs nothing new on the sites' command lines, even where a site's data changed since the first: the
site keeps the first run's files apart (`earlier/<run>/`). No string of the site's folder's path ever
reaches the server, the other site, or the server's records."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from fedml_moon import conformance
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from tests.support.processes import start_rank, wait_for_text
from tests.support.site_data import party_folders, site_sets

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist"),
]
CONFIG = Path(__file__).resolve().parent.parent / "config" / "fashion_mnist" / "moon.yaml"
SECRET = "site-folder-qx7"  # a part of site 1's path: it must never leave site 1's process
BROKEN = "scan-0042-broken.png"


def _command(tmp_path: Path, rounds: int = 40) -> tuple[list[str], Path]:
    ipconfig = conformance.write_ipconfig(tmp_path / "ip.csv", 3, conformance.free_port())
    (tmp_path / "server-data").mkdir()
    run = [
        *site_sets(),
        "data_args.dataset=imagefolder",
        "data_args.partition_method=natural",
        f"data_args.data_cache_dir={tmp_path / 'server-data'}",
        "train_args.client_num_in_total=2",
        "train_args.client_num_per_round=2",
        f"train_args.comm_round={rounds}",  # 40: the site killed mid-run, rounds of a few tenths of a second
        "train_args.batch_size=32",
        "train_args.epochs=1",
        "common_args.training_type=cross_silo",
        "comm_args.backend=GRPC",
        f"comm_args.grpc_ipconfig_path={ipconfig}",
        "comm_args.heartbeat_s=1",
        "comm_args.timeout_s=150",
        "comm_args.min_reports=all",  # a round waits for the killed site: its restarts are mid-run
        "comm_args.round_timeout_s=600",
        "device_args.torch_threads=1",
        "tracking_args.enable_wandb=false",
    ]
    return conformance.cli_command("run", CONFIG, run, tmp_path / "out"), tmp_path / "out"


def _site(cmd: list[str], rank: int, folder: Path, tmp_path: Path, name: str):
    """Site `rank` on its own folder: the server's command with the site's data_cache_dir."""
    own = [*cmd, "--set", f"data_args.data_cache_dir={folder}", "--rank", str(rank)]
    env = conformance.process_env(tmp_path)
    return conformance.spawn(own, tmp_path / name, env, tmp_path), tmp_path / name


def test_a_site_refuses_its_own_data_the_run_waits_and_the_fixed_site_joins(tmp_path):
    sites = party_folders(tmp_path / "sites", per_party=40, n_test=10)
    mine = tmp_path / SECRET
    (sites / "party-a").rename(mine)
    broken = mine / "train" / "coat" / BROKEN
    broken.write_bytes(b"\x89PNG\r\n\x1a\n but then nothing")
    cmd, out = _command(tmp_path)
    server, log = start_rank(cmd, 0, tmp_path)
    other, other_log = _site(cmd, 2, sites / "party-b", tmp_path, "site-2.log")
    refusing, refusing_log = _site(cmd, 1, mine, tmp_path, "site-1.log")
    procs = [server, other, refusing]
    try:
        assert conformance.wait_all([refusing], 120) == [2]  # exit 2: it refuses its own data
        said = refusing_log.read_text()
        errors = [line for line in said.splitlines() if " ERROR " in line or "Traceback" in line]
        assert len(errors) == 1 and BROKEN in errors[0] and "refuses its data" in errors[0], said[-3000:]
        wait_for_text(log, "rank 1 refused its own data: a file of its data cannot be read", 60)
        wait_for_text(other_log, "is ready and waits for its first task", 60)
        _wait_line(log, "waiting for rank(s) [1] to say hello", "; rank 1 refused its own data: a file of")
        assert server.poll() is None and other.poll() is None  # nobody stopped the run

        broken.unlink()  # fixed: the site joins
        fixed, fixed_log = _site(cmd, 1, mine, tmp_path, "site-1-fixed.log")
        procs.append(fixed)
        wait_for_text(log, "round 1:", 150)
        conformance.stop(fixed, first=signal.SIGKILL)  # killed mid-run: the round waits for it
        moved = next((mine / "train" / "coat").glob("*.png"))
        target = mine / "train" / "shirt" / moved.name
        moved.rename(target)  # the same number of images, one of them in another class
        changed, changed_log = _site(cmd, 1, mine, tmp_path, "site-1-changed.log")
        procs.append(changed)
        assert conformance.wait_all([changed], 120) == [2]
        assert "differ from those it read earlier in this run" in changed_log.read_text()
        assert "--overwrite" in changed_log.read_text()
        wait_for_text(log, "its data differ from those it read earlier in this run", 60)

        target.rename(moved)  # put back as it was: the site rejoins and the run completes
        back, _ = _site(cmd, 1, mine, tmp_path, "site-1-back.log")
        procs.append(back)
        assert conformance.wait_all([server, other, back], 240) == [0, 0, 0]
    finally:
        for proc in procs:
            conformance.stop(proc)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == 40
    _nothing_of_the_path_left(mine, [log, other_log, *out.glob("*.json*"), *out.glob("rank-2/**/*.json*")])


def test_a_second_run_needs_nothing_new_on_the_sites_command_lines(tmp_path):
    """Run 1 completes; the server's next run goes to another folder (as a server refusing the first
    one's folder suggests), the sites start with the same commands, site 1 with one image moved to
    another class: run 2 completes, and each site's folder holds run 2's files and, under
    `earlier/<run 1>/`, run 1's, its final model among them."""
    sites = party_folders(tmp_path / "sites", per_party=40, n_test=10)
    cmd, out = _command(tmp_path, rounds=2)
    second = tmp_path / "second-run"
    for server_out in (out, second):
        procs = [start_rank([*cmd, "--output-dir", str(server_out)], 0, tmp_path)[0]]
        procs += [_site(cmd, r, sites / f"party-{'ab'[r - 1]}", tmp_path, f"site-{r}.log")[0] for r in (1, 2)]
        try:
            assert conformance.wait_all(procs, 240) == [0, 0, 0], (tmp_path / "site-1.log").read_text()[
                -3000:
            ]
        finally:
            for proc in procs:
                conformance.stop(proc)
        if server_out == out:
            first = json.loads((out / "run.json").read_text())["run"]
            final = (out / "rank-1" / "final_model.pt").read_bytes()
            moved = next((sites / "party-a" / "train" / "coat").glob("*.png"))
            moved.rename(sites / "party-a" / "train" / "shirt" / moved.name)  # its data changed
    run = json.loads((second / "run.json").read_text())["run"]
    assert run != first and json.loads((second / "summary.json").read_text())["status"] == "completed"
    for rank in (1, 2):
        site = out / f"rank-{rank}"
        assert json.loads((site / "run.json").read_text())["run"] == run
        assert (site / "final_model.pt").is_file() and (site / "earlier" / first / "final_model.pt").is_file()
    assert (out / "rank-1" / "earlier" / first / "final_model.pt").read_bytes() == final
    assert f"the files of run {first} are kept in" in (tmp_path / "site-1.log").read_text()


def _wait_line(log: Path, *parts: str) -> None:
    """Wait (up to 60 s) for a line of `log` that holds every one of `parts`."""
    deadline = time.monotonic() + 60
    while not any(all(p in line for p in parts) for line in log.read_text(errors="replace").splitlines()):
        assert time.monotonic() < deadline, f"no line with {parts} in {log}:\n{log.read_text()[-2000:]}"
        time.sleep(0.2)


def _nothing_of_the_path_left(folder: Path, files: list[Path]) -> None:
    """No part of `folder`'s path below the test's root (its name, its file's name), and no file or
    folder name of its own, appears in `files`."""
    names = {SECRET, BROKEN} | {p.name for p in folder.rglob("*.png")}
    for path in files:
        text = path.read_text(errors="replace")
        leaked = sorted(n for n in names if n in text)
        assert not leaked, f"{path.name} holds {leaked[:5]}"
