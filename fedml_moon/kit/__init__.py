"""`fedml-moon new NAME`: a plugin package for a new algorithm that passes `fedml-moon check` as
written. What it writes into FOLDER (default ./NAME):

    fedml_moon_NAME/__init__.py   the algorithm: both sides' hooks, commented (from `kit/template.py`)
    NAME.yaml                     a config that loads it (common_args.plugins) on Fashion-MNIST
    tests/test_NAME.py            a test that runs `fedml-moon check NAME --cf NAME.yaml`
    pyproject.toml                the package, with its entry point (pip install -e FOLDER)
    README.md                     the commands
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path

from fedml_moon.errors import ConfigError

TEMPLATE = Path(__file__).with_name("template.py")
NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")


def camel(name: str) -> str:
    """fed_proto -> FedProto; fedproto -> Fedproto."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def _config(name: str, package: str) -> str:
    return f"""# {name} on Fashion-MNIST, Dir(0.5), 10 parties: written by `fedml-moon new {name}`
common_args:
  training_type: simulation
  random_seed: 0
  plugins: [{package}:spec]   # found beside this file; once installed, its entry point is enough

data_args:
  dataset: fashion-mnist
  data_cache_dir: null      # null: Debian's dataset-fashion-mnist folder, else the folder holding the data
  partition_method: hetero  # hetero = Dirichlet(partition_alpha), homo = IID, shards = label shards
  partition_alpha: 0.5

model_args:
  model: simple-cnn
  use_projection_head: true
  out_dim: 256

train_args:
  algorithm: {name}
  client_num_in_total: 10
  client_num_per_round: 10
  comm_round: 30
  epochs: 2
  batch_size: 64
  learning_rate: 0.01
  momentum: 0.9
  weight_decay: 1.0e-5

validation_args:
  frequency_of_the_test: 1

comm_args:
  backend: sp

tracking_args:
  enable_wandb: false

algorithm_args:
  label_smoothing: 0.0
"""


def _test(name: str) -> str:
    return f'''"""{name} through the conformance suite: payloads, stacked parties, resume, secure sums and
every deployment mode (`fedml-moon check`; MPI, mosquitto and moto must be installed for all modes)."""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
MODES = None  # or a subset, e.g. "standalone,cross-silo-grpc"


def test_{name}_passes_fedml_moon_check(tmp_path):
    cmd = [sys.executable, "-m", "fedml_moon", "check", "{name}", "--cf", str(HERE / "{name}.yaml")]
    cmd += ["--modes", MODES] if MODES else []
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
'''


def _pyproject(name: str, package: str) -> str:
    return f"""[build-system]
requires = ["setuptools>=77,<81"]
build-backend = "setuptools.build_meta"

[project]
name = "fedml-moon-{name.replace("_", "-")}"
version = "0.1.0"
description = "The {name} algorithm for fedml_moon"
requires-python = ">=3.11,<3.14"
dependencies = ["fedml_moon"]

[project.entry-points."fedml_moon.algorithms"]
{name} = "{package}:spec"

[tool.setuptools]
packages = ["{package}"]
"""


def _readme(name: str, folder: Path) -> str:
    return f"""# {name}

A fedml_moon algorithm. `{{package}}/__init__.py` holds it; `{name}.yaml` runs it.

    fedml-moon simulate --cf {folder}/{name}.yaml  # a run
    fedml-moon check {name} --cf {folder}/{name}.yaml  # the conformance suite
    pip install -e {folder}  # installed, its entry point registers it (no plugins key needed)
"""


def _taken(name: str) -> bool:
    """Whether `name` is an algorithm already (built in, or an installed plugin's), or the template's."""
    from fedml_moon.registry import get_algorithm

    try:
        get_algorithm(name)
    except ConfigError:
        return name == "newalgo"
    return True


def write_plugin(name: str, folder: Path) -> list[Path]:
    """Write the plugin package for algorithm `name` into `folder` (module docstring); returns the
    files written. A ConfigError for a name that is not a lowercase identifier or already an
    algorithm, or a folder that holds files."""
    if not NAME.fullmatch(name) or keyword.iskeyword(name):
        raise ConfigError(f"new {name!r}: a name is a lowercase identifier (a-z, 0-9, _), e.g. fedproto")
    if _taken(name):
        raise ConfigError(f"new {name!r}: an algorithm of that name exists; choose another")
    if folder.exists() and any(folder.iterdir()):
        raise ConfigError(f"new {name}: {folder} is not empty; give an empty or new folder (--dir)")
    package = f"fedml_moon_{name}"
    code = TEMPLATE.read_text().replace("NewAlgo", camel(name)).replace("newalgo", name)
    files = {
        folder / package / "__init__.py": code,
        folder / f"{name}.yaml": _config(name, package),
        folder / "tests" / f"test_{name}.py": _test(name),
        folder / "pyproject.toml": _pyproject(name, package),
        folder / "README.md": _readme(name, folder).replace("{package}", package),
    }
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return list(files)
