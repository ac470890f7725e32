"""`fedml-moon check` names the cause of what a contributor breaks without noticing, in words to act
on: a party that changes what it received in place, module globals and class attributes a run
changes (named before the symptoms they cause), random numbers from the global state (party side,
server side), party state kept on the object, float32 tensors in a float64 run; float32's rounding
excuses nothing when another check fails. Broken plugins: tests/support/broken_plugins.py."""

from __future__ import annotations

import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from fedml_moon import conformance
from fedml_moon.conformance.causes import global_random_problems, resume_hint
from fedml_moon.conformance.checks import Check, _kept_first, _no_excuse
from fedml_moon.conformance.inprocess import Traced, quiet_run
from fedml_moon.conformance.kept import KEPT, changed, fingerprint
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from tests.support.cli import restored_main

needs_fmnist = pytest.mark.skipif(
    not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist"
)
ROOT = Path(__file__).resolve().parent.parent
FEDAVG = ROOT / "config" / "fashion_mnist" / "fedavg.yaml"
BROKEN = ROOT / "tests" / "support" / "broken_plugins.py"
NAMES = {
    "inplace": "broken_inplace",
    "randn": "broken_randn",
    "python_random": "broken_python_random",
    "on_self": "broken_self",
    "module_global": "broken_global",
    "float32": "broken_float32",
    "feddyn": "broken_feddyn",
    "keeping": "broken_keeping",
}


def broken(name: str) -> list[str]:
    return [
        *conformance.TINY,
        "train_args.checkpoint_every=1",
        f"common_args.plugins=[{BROKEN}:{name}]",
        f"train_args.algorithm={NAMES[name]}",
    ]


@needs_fmnist
@pytest.mark.slow
def test_check_names_a_party_that_changes_what_it_received_through_the_command_line(tmp_path, capsys):
    argv = ["check", NAMES["inplace"], "--cf", str(FEDAVG), "--modes", "standalone"]
    argv += ["--plugin", f"{BROKEN}:inplace", "--keep", str(tmp_path)]
    with restored_main() as main:
        assert main(argv) == 1
    said = capsys.readouterr().out
    line = next(x for x in said.splitlines() if "what a party received is as it was sent" in x)
    assert line.startswith("FAIL"), said
    assert "received.model." in said and "changed what it received in place" in said
    assert "clone_state" in said


@needs_fmnist
def test_the_received_payloads_of_a_correct_algorithm_are_untouched(tmp_path):
    for config in ("fedavg", "moon", "fedssc", "scaffold", "lg"):
        sets = [*conformance.TINY, "data_args.partition_method=hetero"]
        traced = conformance.traced_run(
            ROOT / "config" / "fashion_mnist" / f"{config}.yaml", sets, tmp_path / config
        )
        assert not traced.error and not traced.changed, (config, traced.changed[:2])
        assert not traced.kept, (config, traced.kept)  # no module state in the built-in algorithms


@needs_fmnist
@pytest.mark.parametrize(
    ("name", "side"),
    [("randn", "the party side"), ("python_random", "the server side"), (None, None)],
)
def test_check_names_random_numbers_not_drawn_from_the_runs_generators(name, side, tmp_path):
    sets = broken(name) if name else [*conformance.TINY, "algorithm_args.mu=1"]
    config = FEDAVG if name else ROOT / "config" / "fashion_mnist" / "moon.yaml"
    found = global_random_problems(config, sets, tmp_path, quiet_run)
    if name is None:  # MOON draws its unseen parties' models from its own stream: nothing found
        assert found == []
        return
    assert len(found) == 1 and found[0].startswith("a random number not drawn from the run's generators")
    assert side in found[0] and "generator(" in found[0] and "global random state" in found[0]


@needs_fmnist
@pytest.mark.slow
def test_check_names_party_state_kept_on_self_that_a_resumed_process_starts_without(tmp_path):
    traced = conformance.traced_run(FEDAVG, broken("on_self"), tmp_path / "traced")
    check = conformance.resume_check(FEDAVG, broken("on_self"), tmp_path, traced)
    assert not traced.kept  # on the object: no module state
    assert not check.ok and "party state kept on self, not in PartyRound.state" in check.detail, check.detail
    # the party's attribute is named before the server's consequences
    assert "party.seen" in check.detail and "state() / load_state()" not in check.detail


def _line(said: str, name: str) -> str:
    return next(x for x in said.splitlines() if x[6:].startswith(name))


@needs_fmnist
@pytest.mark.slow
def test_check_names_module_state_before_its_symptoms_through_the_command_line(tmp_path, capsys):
    """FedDyn written from the docs, each party's linear term in a module global: `check` names the
    global; the random-number check, whose runs in this process would each start from another value
    of it, is not judged, and the checks it makes fail (a resumed server whose h differs, stacked
    parties replayed from another value) name it as their cause, not state() / load_state()."""
    argv = ["check", NAMES["feddyn"], "--cf", str(FEDAVG), "--modes", "standalone"]
    argv += ["--plugin", f"{BROKEN}:feddyn", "--keep", str(tmp_path)]
    with restored_main() as main:
        assert main(argv) == 1
    said = capsys.readouterr().out
    kept = _line(said, KEPT)
    assert kept.startswith("FAIL") and "broken_plugins.py:LINEAR changed in round 0, party " in kept, said
    assert "LINEAR[" in kept and "added" in kept and "PartyRound.state" in kept
    assert kept.count("broken_plugins.py:") == 1  # the constants ALPHA, SCALE and the other globals are not
    state = "the module-level state the run changed (broken_plugins.py:LINEAR;"
    random_line = _line(said, "random numbers come from the run's generators")
    assert (
        random_line.startswith("FAIL")
        and f"not judged: each run it compares would start from other values of {state}" in random_line
    ), random_line
    assert "a random number not drawn" not in random_line and "may follow" not in random_line
    cause = f"may follow from {state}"
    resumed = _line(said, "stopped after round 1 and resumed")
    assert resumed.startswith("FAIL") and cause in resumed, resumed
    assert "state() / load_state() do not carry it" not in resumed
    stacked = _line(said, "stacked parties: one local round")  # replayed from another value of LINEAR
    assert stacked.startswith("FAIL") and cause in stacked, stacked
    for name in ("payloads, reports and party states", "what a party received is as it was sent"):
        assert _line(said, name).startswith("PASS"), said  # not symptoms: no cause stamped on them


@needs_fmnist
@pytest.mark.parametrize(
    ("name", "kept"),
    [("feddyn", {"LINEAR"}), ("keeping", {"DRIFT", "HISTORY", "KeepingClient.rounds"})],
)
def test_module_globals_and_class_attributes_a_round_changes_are_named(name, kept, tmp_path):
    """A module-level dict of tensors (FedDyn's linear terms), list and tensor, and a class attribute
    changed in place are named, with the round and party that changed them; the module's constants
    (ALPHA, SCALE, read every round), its other globals and the classes' name and terms are not."""
    traced = conformance.traced_run(FEDAVG, broken(name), tmp_path)
    assert not traced.error, traced.error
    assert {k.split(" ", 1)[0] for k in traced.kept} == {f"broken_plugins.py:{n}" for n in kept}, traced.kept
    assert all(" changed in round 0, party " in k for k in traced.kept), traced.kept


DEMO = """
import functools, logging
from dataclasses import dataclass
from typing import Callable, ClassVar
import torch

RATE, NAME, SHAPE, LOOKUP = 0.1, "demo", (3, 4), {"a": [1, 2]}
TABLE = torch.arange(3.0)
log = logging.getLogger("demo")
Factory, Pair = Callable[[], int], tuple[int, int]
COUNT, ITEMS, STATE, TOTAL = 0, [], {}, torch.zeros(2)
GEN = torch.Generator().manual_seed(0)

@dataclass
class Opts:
    mu: float = 0.1

OPTS = Opts()

class Algo:
    name = "demo"
    terms: ClassVar[tuple] = ("ce",)
    cache: ClassVar[dict] = {}

    def method(self):
        return RATE

    @property
    def prop(self):
        return TABLE.sum()

@functools.lru_cache
def cached(x):
    return x * RATE
"""


def test_the_fingerprint_names_every_value_changed_and_nothing_read(monkeypatch):
    """Invariant: a name is reported exactly when its value changed, however: rebound, grown,
    written in place, drawn from, an object's field set, a class attribute changed in place, added
    or deleted; reading constants, calling cached functions and logging change nothing."""
    module = types.ModuleType("fedml_moon_plugin_demo")
    module.__file__ = "/somewhere/demo.py"
    monkeypatch.setitem(sys.modules, module.__name__, module)  # as a plugin file is (dataclass needs it)
    exec(compile(textwrap.dedent(DEMO), "demo.py", "exec"), vars(module))
    before = fingerprint([module])
    module.cached(3), module.log.isEnabledFor(10), module.Algo().method(), module.Algo().prop
    assert changed(before, fingerprint([module]), "a round") == {}
    module.COUNT += 1
    module.ITEMS.append(1.0)
    module.STATE[3] = torch.ones(1)
    module.TOTAL.add_(1)
    torch.rand(1, generator=module.GEN)
    module.OPTS.mu = 0.2
    module.Algo.cache["k"] = 1
    module.NEW = 5
    del module.RATE
    said = changed(before, fingerprint([module]), "round 0, party 1's local round")
    names = ("COUNT", "ITEMS", "STATE", "TOTAL", "GEN", "OPTS", "Algo.cache", "NEW", "RATE")
    assert set(said) == {f"demo.py:{n}" for n in names}, said
    assert said["demo.py:STATE"] == (
        "demo.py:STATE changed in round 0, party 1's local round (STATE[3] added, a tensor [1] float32)"
    )
    assert "demo.py:NEW appeared" in said["demo.py:NEW"]
    assert "demo.py:RATE disappeared" in said["demo.py:RATE"]
    assert "TOTAL[0]: before 0, after 1" in said["demo.py:TOTAL"]


def test_module_state_comes_before_the_symptoms_it_causes():
    """The resume check's hint and every later failing check name the module state; a check before
    it, or one that passes, is left as it was."""
    kept = ["broken_plugins.py:LINEAR changed in round 0, party 1's local round (...)"]
    server = ["at the start of round 2: server.h.w[0]: uninterrupted 1, resumed 2"]
    assert "state() / load_state() do not carry it" in resume_hint(server)  # no module state: the server's
    assert "neither algorithm object differs" in resume_hint(["final model.w[0]: uninterrupted 1, resumed 2"])
    hint = resume_hint(server, kept)
    assert "(broken_plugins.py:LINEAR;" in hint and "state() / load_state() do not carry" not in hint
    checks = [Check("received", False, "x"), Check(KEPT, False, kept[0]), Check("same run", False, "y")]
    checks += [Check("secure", True), Check("resume", False, "z" + hint)]
    out = _kept_first(checks, Traced(Path("."), kept=kept))
    assert out[0].detail == "x" and out[1].detail == kept[0] and out[3].detail == ""
    assert out[2].detail.startswith("y -- may follow from the module-level state the run changed")
    assert out[4].detail == "z" + hint  # said once
    assert _kept_first(checks, Traced(Path("."))) == checks


@needs_fmnist
def test_check_names_float32_tensors_in_a_float64_run_and_where(tmp_path):
    outcome = conformance.float64_rounds(FEDAVG, broken("float32"), tmp_path, 2)
    assert "made float32 tensors where the run is float64" in outcome.error, outcome
    assert "broken_plugins.py:" in outcome.error and "(in after_step)" in outcome.error


def test_float32_rounding_excuses_nothing_when_another_check_fails():
    traced = Traced(Path("."), replay=["round 0, party 1: upload model.w: differ by 2e-05"])
    excused = Check(
        "stacked one round",
        True,
        "",
        "groups of [2]; float32 differs by up to 2e-05 ...: rounding, not a difference of the two paths",
    )
    alone = _no_excuse([Check("payloads", True), excused], traced)
    assert alone[1] is excused  # every other check passes: rounding it is
    with_failure = _no_excuse([Check("payloads", True), excused, Check("resume", False, "x")], traced)
    assert not with_failure[1].ok and "rounding" not in with_failure[1].note
    assert "float32 rounding does not explain it" in with_failure[1].detail
