"""The files a run's settings name are part of what its processes agree on: another file under the
same `model_args.pretrained` or `data_args.partition_path` differs like another value would, for a
silo joining the server (at its HELLO and when it builds from the server's settings) and for
`--resume` of a run whose partition file was changed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from fedml_moon import conformance
from fedml_moon.config.files import DIGEST_KEYS, file_sha256
from fedml_moon.config.load import load_config
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from fedml_moon.distributed import managers as m
from fedml_moon.distributed.deploy import shared_config, with_shared
from tests.support.cli import restored_main
from tests.support.server import receive, server_manager

pytestmark = pytest.mark.skipif(
    not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist"
)
CONFIG = Path(__file__).resolve().parent.parent / "config" / "fashion_mnist" / "fedavg.yaml"
TINY = [*conformance.TINY, "data_args.max_train_samples=400", "data_args.max_test_samples=200"]


def _weights(path: Path, value: float) -> Path:
    torch.save({"fc.weight": torch.full((2, 2), value)}, path)
    return path


def test_another_pretrained_file_under_the_same_path_is_another_setting(tmp_path):
    path = _weights(tmp_path / "start.pt", 1.0)
    server = shared_config(load_config(CONFIG, [*TINY, f"model_args.pretrained={path}"]))
    assert server["model_args.pretrained_sha256"] == file_sha256(path)
    _weights(path, 2.0)  # the site's own copy, other weights under the same path
    silo = load_config(CONFIG, TINY)  # its own config: the path is the server's to say
    built = shared_config(with_shared(silo, server))  # what a silo compares with the server's
    differ = [k for k in server if server[k] != built.get(k)]
    assert differ == ["model_args.pretrained_sha256"]
    assert "model_args.pretrained_sha256" not in shared_config(load_config(CONFIG, TINY))
    _weights(path, 1.0)
    assert shared_config(with_shared(silo, server)) == server  # the same file: the same settings


def test_a_hello_with_another_file_under_a_path_is_refused_naming_it(tmp_path, caplog):
    manager, wire = server_manager(tmp_path)
    config = dict(manager.settings.config)
    for key in sorted(DIGEST_KEYS):
        receive(
            manager,
            1,
            m.HELLO,
            parties=[0],
            config={**config, key: "ab" * 32},
            explicit=[],
            fresh_parties=[],
            process="p",
        )
        abort = [x for x in wire.sent if x.get_type() == m.ABORT and x.get_receiver_id() == 1]
        assert abort and key in abort[-1].get("reason"), key


def test_resume_refuses_a_partition_file_changed_under_the_same_path(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    written = {}
    for alpha in ("0.1", "5.0"):
        out = tmp_path / f"alpha-{alpha}"
        with restored_main() as main:
            assert main(_simulate(out, [f"data_args.partition_alpha={alpha}"])) == 0
        written[alpha] = out
    path = tmp_path / "agreed" / "partition.json"
    shutil.copytree(
        written["0.1"], path.parent, ignore=lambda d, names: [n for n in names if not _partition(n)]
    )
    on_file = ["data_args.partition_method=file", f"data_args.partition_path={path}"]
    out = tmp_path / "on-file"
    with restored_main() as main:
        assert main(_simulate(out, on_file)) == 0
    same_json = (written["0.1"] / path.name).read_bytes() == (written["5.0"] / path.name).read_bytes()
    assert same_json  # the indices differ in the arrays file beside it: its digest is part of the file's
    for name in filter(_partition, (p.name for p in written["5.0"].iterdir())):
        shutil.copy(written["5.0"] / name, path.parent / name)  # another partition under the same path
    capsys.readouterr()
    with restored_main() as main:
        code = main(["simulate", "--cf", str(CONFIG), "--resume", str(out), *_sets([*TINY, *on_file])])
    said = capsys.readouterr()
    assert code == 2 and "data_args.partition_sha256" in said.out + said.err


def _partition(name: str) -> bool:
    """A file of a written partition (`partition.json` and what it names beside it), not its picture."""
    return name.startswith("partition.") and not name.endswith(".png")


def _sets(overrides: list[str]) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


def _simulate(out: Path, extra: list[str]) -> list[str]:
    sets = _sets([*TINY, "tracking_args.enable_wandb=false", *extra])
    return ["simulate", "--cf", str(CONFIG), "--output-dir", str(out), *sets]
