"""`fedml-moon check` names the cause of what a contributor breaks without noticing, in words to act
on: a party that changes what it received in place, random numbers from the global state (party
side, server side), party state kept on the object or in a module global, float32 tensors in a
float64 run; float32's rounding excuses nothing when another check fails. Broken plugins:
tests/broken_plugins.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedml_moon import conformance
from fedml_moon.conformance.causes import global_random_problems
from fedml_moon.conformance.checks import Check, _no_excuse
from fedml_moon.conformance.inprocess import Traced, quiet_run
from fedml_moon.data.datasets import DEBIAN_FASHION_MNIST
from tests.helpers import restored_main

needs_fmnist = pytest.mark.skipif(
    not DEBIAN_FASHION_MNIST.is_dir(), reason="apt-get install dataset-fashion-mnist"
)
ROOT = Path(__file__).resolve().parent.parent
FEDAVG = ROOT / "config" / "fashion_mnist" / "fedavg.yaml"
BROKEN = ROOT / "tests" / "broken_plugins.py"
NAMES = {
    "inplace": "broken_inplace",
    "randn": "broken_randn",
    "python_random": "broken_python_random",
    "on_self": "broken_self",
    "module_global": "broken_global",
    "float32": "broken_float32",
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
@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("on_self", "party state kept on self, not in PartyRound.state"),
        ("module_global", "a module-level global or a class attribute"),
    ],
)
def test_check_names_state_a_resumed_process_starts_without(name, says, tmp_path):
    traced = conformance.traced_run(FEDAVG, broken(name), tmp_path / "traced")
    check = conformance.resume_check(FEDAVG, broken(name), tmp_path, traced)
    assert not check.ok and says in check.detail, check.detail
    if name == "on_self":  # the party's attribute is named before the server's consequences
        assert "party.seen" in check.detail and "state() / load_state()" not in check.detail


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
