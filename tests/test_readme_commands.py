"""The README's commands and the docs' single-process ones, run as written from the repository root
at tiny scale; and the table of every command the README and the docs show (tests/support/doc_table.py),
checked against them.

A run appends only tiny-scale `--set` values (tests/support/doc_runs.py: TINY; a key the command sets
itself keeps its value) and an output folder under tmp; placeholders are substituted (RUN_DIR,
`certs/`, the sweeps' `outputs/sweeps/...`). Single-process commands run through `fedml_moon.cli.main`
in this process (the `fedml-moon` entry point, without paying for a Python and FedML start-up each),
the main job as a real process. Not run inside the suite, checked instead: `bash run/main.sh` and
`bash run/test.sh` (they install, then run the main job / the whole suite: their contents are checked
and the command main.sh execs is run), the pip installs (setup.sh runs them; the packages imported
are this tree's), the benchmarks (measurements, minutes each at full scale, some for a GPU: each
script exists, compiles and takes the options shown) and the conformance check (run as written by
tests/test_contributor_kit.py) and the GPU checks (run as written, at quick scale on the CPU, by
tests/test_gpu_check.py). The two sweeps run with all but three of their runs already complete
(copies of a tiny run, so the sweep skips them): the commands, the skip logic and the report run for
real, 3 tiny runs instead of 42.
"""

from __future__ import annotations

import json
import runpy
import shlex
import shutil
import sys
import time
from pathlib import Path

import pytest
import torch

from fedml_moon.config.load import config_to_dict, load_config
from fedml_moon.results.sweep import load_sweep, read_sweep_file
from tests.support import ROOT
from tests.support.doc_commands import (
    BUFFERED,
    BUFFERED_PRIVATE,
    CERTS,
    COMPARE_REPORT,
    COMPARE_RUNS,
    CONFIG_ALL,
    CONFIG_KEY,
    DP,
    GPU_CHECK,
    HEADPROX,
    KIT_CHECK,
    MAIN_JOB,
    PYTHON_M,
    REPLAY,
    REPORT,
    REPORT_DP,
    REPORT_LG,
    REPORT_PRECISION,
    REPORT_STRAGGLERS,
    SECURE,
    SPLIT_RUNS,
    STANDALONE,
    STATUS,
    SWEEP,
    SWEEP_DP,
    SWEEP_LG,
    SWEEP_LIST,
    SWEEP_LIST_SET,
    SWEEP_PRECISION,
    SWEEP_STRAGGLERS,
    SYNOPSIS,
    TSNE,
    TSNE_PAIR,
    TSNE_RUNS,
)
from tests.support.doc_runs import TINY, completed, entry_point, quiet, run_all, tiny_sets
from tests.support.doc_table import COMMANDS, shown_commands
from tests.support.marks import needs_fmnist


def test_the_docs_show_only_commands_this_file_runs():
    shown = shown_commands()
    unknown = {c: files for c, files in shown.items() if c not in COMMANDS}
    assert not unknown, f"commands no test runs (add them to COMMANDS, tests/support/doc_table.py): {unknown}"
    gone = [c for c in COMMANDS if c not in shown]
    assert not gone, f"COMMANDS that neither the README nor the docs show any more (remove them): {gone}"


def _script(name: str) -> list[str]:
    return [line.strip() for line in (ROOT / "run" / name).read_text().splitlines()]


def _exec_line() -> str:
    """The command run/main.sh execs, "$@" left out."""
    (line,) = [x for x in _script("main.sh") if x.startswith("exec ")]
    assert line.endswith(' "$@"'), line
    return line.removeprefix("exec ").removesuffix(' "$@"')


def test_scripts_installs_and_benchmarks_the_suite_does_not_run():
    # run/main.sh and run/test.sh install first (README: "installs, then ...")
    main_sh, test_sh = _script("main.sh"), _script("test.sh")
    assert main_sh.index("bash run/setup.sh") < main_sh.index(f'exec {_exec_line()} "$@"')
    assert _exec_line() == STANDALONE  # the main job is the standalone row's command, run below
    setup = test_sh.index("bash run/setup.sh --tests || exit 1")
    steps = [
        ".venv/bin/ruff check fedml_moon tests benchmarks examples docs || exit 1",
        ".venv/bin/ruff format --check fedml_moon tests benchmarks examples docs || exit 1",
        "bash run/docs.sh || exit 1",  # the documentation, built --strict
        ".venv/bin/python -m pytest -q -n auto --dist load --maxschedchunk 2"
        ' --junitxml=outputs/suite/junit.xml "$@"',
        ".venv/bin/python benchmarks/suite_budget.py --top 10 >&2",  # where the time went
    ]
    positions = [test_sh.index(step) for step in steps]
    assert setup < positions[0] and positions == sorted(positions)
    quick = test_sh.index('.venv/bin/python -m pytest -q -n auto --dist load -m "not slow" "$@"')
    assert positions[1] < quick < positions[2]  # --quick: lint, then the tests not marked slow
    assert "bash run/test.sh --quick" in (ROOT / ".ci" / "run").read_text()  # and CI times it
    assert (ROOT / ".venv/bin/mkdocs").is_file()  # `mkdocs serve` serves what run/docs.sh builds
    # the pip installs: run/setup.sh runs them, and the packages imported are this tree's
    setup_sh = "\n".join(_script("setup.sh"))
    assert 'pip_install -q --no-deps -r "$LOCK"' in setup_sh  # every version from the Python's lock
    for lock in sorted((ROOT / "requirements").glob("py3.*.txt")):
        assert "\nfedml==0.9.6\n" in lock.read_text(), lock  # FedML, installed without its pins
    assert 'pip_install -q --no-deps -e ".[test]"' in setup_sh
    assert "pip_install -q --no-deps -e examples/headprox" in setup_sh
    import fedml_moon_headprox

    import fedml_moon

    assert Path(fedml_moon.__file__).resolve().parent == ROOT / "fedml_moon"
    assert Path(fedml_moon_headprox.__file__).resolve().is_relative_to(ROOT / "examples" / "headprox")
    # benchmarks: the script exists, compiles and takes every option the README gives it
    for command in (c for c, kind in COMMANDS.items() if kind == "benchmark"):
        words = shlex.split(command)
        source = (ROOT / words[1]).read_text()
        compile(source, words[1], "exec")
        for option in (w for w in words[2:] if w.startswith("--")):
            assert f'"{option}"' in source, f"{command}: {words[1]} has no {option}"
    # the GPU checks run, as written at quick scale, in tests/test_gpu_check.py (GPU_CHECK)
    assert [c for c, kind in COMMANDS.items() if kind == "gpu-check"] == [GPU_CHECK]
    # the conformance check runs, as written, in tests/test_contributor_kit.py (KIT_CHECK)
    (check,) = [c for c, kind in COMMANDS.items() if kind == "contributor-kit"]
    assert KIT_CHECK == check


@needs_fmnist
@pytest.mark.slow
def test_single_process_commands(tmp_path, home, root_cli, capsys, monkeypatch):
    done: set[str] = set()
    started = time.monotonic()

    # the main job: what `bash run/main.sh --set train_args.comm_round=5` execs, as a real process
    # (also the standalone row's command); its output starts with the plugin's own lines
    args = shlex.split(MAIN_JOB)[2:]
    job = [*shlex.split(_exec_line()), *args, *tiny_sets(MAIN_JOB), "--output-dir", str(tmp_path / "job")]
    quiet(run_all([job], tmp_path / "job-logs", home, 300)[0])
    template = tmp_path / "job"
    assert len((template / "metrics.jsonl").read_text().splitlines()) == 5
    completed(template, 5)
    done |= {MAIN_JOB, STANDALONE}

    # a setting changed, then the same run through `python -m fedml_moon`: the same final model
    words = entry_point(SYNOPSIS)
    assert words[-2:] == ["--output-dir", "outputs/moon-mu5"]
    assert root_cli([*words[:-1], str(tmp_path / "mu5"), *tiny_sets(SYNOPSIS), "-v"]) == 0
    assert completed(tmp_path / "mu5", 1)["config"]["algorithm_args"]["mu"] == 5
    done.add(SYNOPSIS)
    words = entry_point(STATUS)
    assert words[-1] == "outputs/moon-mu5"  # the run just made, in this test's folder
    capsys.readouterr()
    assert root_cli([*words[:-1], str(tmp_path / "mu5")]) == 0
    assert "run mu5: moon, round 0 of 1 (from 0), finished (1 rounds recorded" in capsys.readouterr().out
    done.add(STATUS)
    words = shlex.split(PYTHON_M)
    assert words[:3] == [".venv/bin/python", "-m", "fedml_moon"] and words[-1] == "outputs/moon-mu5-again"
    out = tmp_path / "python-m"
    monkeypatch.setattr(sys, "argv", ["fedml_moon", *words[3:-1], str(out), *tiny_sets(PYTHON_M)])
    with pytest.raises(SystemExit) as exit_code:
        runpy.run_module("fedml_moon", run_name="__main__", alter_sys=True)
    assert exit_code.value.code == 0
    both = [torch.load(d / "final_model.pt", weights_only=True) for d in (tmp_path / "mu5", out)]
    assert all(torch.equal(both[0][k], both[1][k]) for k in both[0])
    done.add(PYTHON_M)

    # privacy: secure aggregation, and DP with its epsilon in every round
    crowd = ["--set", "train_args.client_num_in_total=3", "--set", "train_args.client_num_per_round=3"]
    for command, out in ((SECURE, tmp_path / "secure"), (DP, tmp_path / "dp")):
        extra = crowd if command == SECURE else []  # secure aggregation sums 3 parties at least
        assert root_cli([*entry_point(command), *tiny_sets(command), *extra, "--output-dir", str(out)]) == 0
        summary = completed(out, 1)
        assert summary["secure_aggregation"] == (command == SECURE)
        assert (command == DP) == (summary.get("dp_epsilon_release", 0) > 0)
    done |= {SECURE, DP}

    # buffered aggregation on its simulated clock: the record of the one buffer applied says when
    words = entry_point(BUFFERED)
    assert words[-2:] == ["--output-dir", "outputs/moon-buffered"]
    assert root_cli([*words[:-1], str(tmp_path / "buffered"), *tiny_sets(BUFFERED)]) == 0
    record = json.loads((tmp_path / "buffered" / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["sim_time_s"] > 0 and record["parties"] == 5 and "staleness_max" in record
    completed(tmp_path / "buffered", 1)
    done.add(BUFFERED)
    words = entry_point(REPLAY)  # that run replayed from its records: the same model
    assert words[-1] == "outputs/moon-buffered"
    capsys.readouterr()
    assert root_cli([*words[:-1], str(tmp_path / "buffered")]) == 0
    assert "the same model" in capsys.readouterr().out
    completed(tmp_path / "buffered" / "replay", 1)
    done.add(REPLAY)

    # the stragglers' comparison, two rounds each on tiny data: one report, the two as rows of one
    # setting, with the simulated seconds to the target and accuracy against them
    compare = tmp_path / "stragglers"
    shrink = ["--set", "data_args.max_train_samples=100", "--set", "train_args.comm_round=2"]
    for command in COMPARE_RUNS:
        words = entry_point(command)
        assert words[-2] == "--output-dir" and words[-1].startswith("outputs/stragglers/")
        folder = compare / Path(words[-1]).name
        assert root_cli([*words[:-1], str(folder), *tiny_sets(command), *shrink]) == 0
        completed(folder, 2)
    words = entry_point(COMPARE_REPORT)
    assert words[1] == "outputs/stragglers"  # the runs' parent folder
    assert root_cli([words[0], str(compare), *words[2:]]) == 0
    report = (compare / "report" / "report.md").read_text()
    assert "| fedavg | " in report and "| fedavg (aggregation=buffered, buffer_size=5) | " in report
    assert "simulated s to target" in report and "### all runs (target 30.00%)" in report
    assert (compare / "report" / "time_all_runs.png").stat().st_size > 0
    done |= {*COMPARE_RUNS, COMPARE_REPORT}

    # with secure aggregation and DP: every buffer a secure sum of 3 of the 5 parties, each charged
    words, out = entry_point(BUFFERED_PRIVATE), tmp_path / "buffered-private"
    five = ["--set", "train_args.client_num_in_total=5", "--set", "train_args.client_num_per_round=5"]
    assert root_cli([*words[:-1], str(out), *tiny_sets(BUFFERED_PRIVATE), *five]) == 0
    ledger = [json.loads(line) for line in (out / "privacy_ledger.jsonl").read_text().splitlines()]
    assert len(ledger) == 5 and all(len(set(r["parties"])) == 3 for r in ledger)
    summary = completed(out, 5)
    assert summary["secure_aggregation"] and summary["dp_epsilon_release"] == summary["dp_epsilon_server"] > 0
    done.add(BUFFERED_PRIVATE)

    # the example algorithm
    assert (
        root_cli([*entry_point(HEADPROX), *tiny_sets(HEADPROX), "--output-dir", str(tmp_path / "headprox")])
        == 0
    )
    assert completed(tmp_path / "headprox", 1)["config"]["train_args"]["algorithm"] == "fedprox_head"
    done.add(HEADPROX)

    # certificates for 10 silos
    assert root_cli([str(tmp_path / "certs") if w == "certs/" else w for w in entry_point(CERTS)]) == 0
    written = {p.name for p in (tmp_path / "certs").iterdir()}
    assert {"ca.pem", "server.pem", "silo-10.pem", "silo-10.token", "server-tokens.json"} <= written
    done.add(CERTS)

    # the config reference in the terminal: every section, and one key of every algorithm that has it
    capsys.readouterr()
    assert root_cli(entry_point(CONFIG_ALL)) == 0
    out = capsys.readouterr().out
    assert all(f"\n{section}:" in out for section in ("train_args", "privacy_args", "algorithm_args")), out
    assert root_cli(entry_point(CONFIG_KEY)) == 0
    assert "temperature" not in (out := capsys.readouterr().out) and "moon" in out and "fedprox" in out
    done |= {CONFIG_ALL, CONFIG_KEY}

    # `--list`, as written (they write nothing)
    capsys.readouterr()
    assert root_cli(entry_point(SWEEP_LIST)) == 0
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == 36 and all(line.startswith("fedml-moon simulate --cf ") for line in listed)
    assert root_cli(entry_point(SWEEP_LIST_SET)) == 0
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == 36 and all("--set train_args.epochs=2" in line for line in listed)
    done |= {SWEEP_LIST, SWEEP_LIST_SET}

    # the sweeps, all but `real` of their runs already complete (copies of the main job's tiny run),
    # then their reports and a t-SNE picture of a real run
    shards = ["train_args.client_num_in_total=5", "train_args.client_num_per_round=5"]  # 10 classes
    # the speeds file names 100 parties; Dir(0.5) over them needs some thousand images, test too
    stragglers = ["train_args.client_num_in_total=100", "data_args.max_train_samples=3000"]
    stragglers += ["data_args.max_test_samples=1000"]
    sweeps = (
        (SWEEP, REPORT, (0, 3), []),
        (SWEEP_LG, REPORT_LG, (0,), shards),
        (SWEEP_DP, REPORT_DP, (3,), []),
        (SWEEP_PRECISION, REPORT_PRECISION, (3,), []),  # run 3: FedAvg in bf16
        (SWEEP_STRAGGLERS, REPORT_STRAGGLERS, (0,), stragglers),  # run 0: sync FedAvg, seed 0 (200 rounds)
    )
    for sweep, report, real, extra in sweeps:
        words = entry_point(sweep)
        output = tmp_path / "sweeps" / Path(words[1]).stem
        extra = [*extra, "train_args.save_party_models=true"]
        grid = {k for entry in read_sweep_file(ROOT / words[1])["grid"].get("run", []) for k in entry}
        tiny = [item for item in TINY if item.split("=", 1)[0] not in grid]  # the grid's own: not overridden
        sets = [*(a for item in [*tiny, *extra] for a in ("--set", item))]
        runs = load_sweep(words[1], output, sets[1::2])
        for i, run in enumerate(runs):
            if i not in real:
                config = config_to_dict(load_config(run.config, list(run.overrides)))
                _complete_copy(template, run.folder, config)
        assert root_cli([*words, *sets, "--output", str(output)]) == 0
        ran = sorted(r.name for r in runs if (r.folder / "run.log").is_file())
        assert ran == sorted(runs[i].name for i in real)
        for i in real:
            quiet(runs[i].folder / "run.log")
            own = [o.split("=", 1)[1] for o in runs[i].overrides if o.startswith("train_args.comm_round=")]
            completed(runs[i].folder, int(own[-1]) if own else 1)  # the grid's rounds, else TINY's one
        report_words = entry_point(report)
        assert report_words[1] == f"outputs/sweeps/{output.name}"  # the sweep's own output folder
        assert root_cli([report_words[0], str(output), *report_words[2:]]) == 0
        assert (output / "report" / "report.md").is_file()
        done |= {sweep, report}
        if sweep == SWEEP:
            run_dir = runs[real[0]].folder
            assert root_cli([str(run_dir) if w == "RUN_DIR" else w for w in entry_point(TSNE)]) == 0
            assert (run_dir / "tsne.png").stat().st_size > 10_000
            done.add(TSNE)

    # the Results page's t-SNE: FedAvg and MOON trained (their own rounds and epochs on tiny data),
    # then one picture of both; every path under tmp
    runs = []
    for command in TSNE_RUNS:
        words = entry_point(command)
        runs.append(tmp_path / words[-1])
        assert root_cli([*words[:-1], str(runs[-1]), *tiny_sets(command)]) == 0
        assert completed(runs[-1], 10)["config"]["train_args"]["save_party_models"]
    picture = tmp_path / "tsne_pair.png"
    pair = entry_point(TSNE_PAIR)
    assert pair[1:3] == [f"outputs/tsne/{run.name}" for run in runs] and pair[-2] == "--out"
    assert root_cli([pair[0], *map(str, runs), *pair[3:-1], str(picture)]) == 0
    assert picture.stat().st_size > 10_000
    done |= {*TSNE_RUNS, TSNE_PAIR}

    # a partition from a file: the second run reads the first's partition.json and ends on its model
    for command in SPLIT_RUNS:
        words = [str(tmp_path / w) if w.startswith("outputs/split-") else w for w in entry_point(command)]
        words = [w.replace("=outputs/split-a/", f"={tmp_path}/outputs/split-a/") for w in words]
        assert root_cli([*words, *tiny_sets(command)]) == 0
        completed(Path(words[words.index("--output-dir") + 1]), 1)
    first, second = (
        torch.load(tmp_path / f"outputs/split-{x}/final_model.pt", weights_only=True) for x in "ab"
    )
    assert all(torch.equal(first[k], second[k]) for k in first)
    done |= set(SPLIT_RUNS)

    assert done == {c for c, kind in COMMANDS.items() if kind == "single"}
    print(f"single-process README commands: {time.monotonic() - started:.1f} s")


def _complete_copy(template: Path, folder: Path, config: dict) -> None:
    """A completed run folder for a sweep to skip: the template's records under this run's config."""
    folder.mkdir(parents=True)
    shutil.copy(template / "metrics.jsonl", folder / "metrics.jsonl")
    summary = json.loads((template / "summary.json").read_text())
    (folder / "summary.json").write_text(json.dumps({**summary, "config": config}))
