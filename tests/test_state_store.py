"""Where parties' states live between rounds (`core.state`): a disk store that reads ahead answers
every request as the memory store does, whatever the order of reads, writes and read-ahead; `auto`
keeps states in memory up to its limit and then moves every one to disk, and a run with it ends
with the model of a run that keeps them in memory."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from fedml_moon import conformance
from fedml_moon.core import state as store_module
from fedml_moon.core.state import AutoPartyStore, DiskPartyStore, PartyStore, make_store, state_bytes

ROOT = Path(__file__).resolve().parent.parent


def _state(rng: random.Random) -> dict:
    return {"pool": [torch.full((rng.randint(1, 4),), float(rng.random()))], "round": rng.randint(0, 9)}


@pytest.mark.parametrize("seed", range(5))
def test_a_disk_store_that_reads_ahead_answers_as_the_memory_store(tmp_path, seed):
    """300 random operations on 6 parties (put, drop, get, prefetch of a random order, including
    parties about to be written): every get equals the memory store's, so a state read ahead is
    never older than the party's last write."""
    rng, memory, disk = random.Random(seed), PartyStore(), DiskPartyStore(tmp_path / f"s{seed}")
    for _ in range(300):
        party, op = rng.randrange(6), rng.random()
        if op < 0.3:
            state = _state(rng)
            memory.put(party, state)
            disk.put(party, state)
        elif op < 0.4:
            memory.drop(party)
            disk.drop(party)
        elif op < 0.6:
            disk.prefetch(rng.sample(range(6), rng.randint(1, 6)))
        else:
            one, two = memory.get(party), disk.get(party)
            assert one.keys() == two.keys() and all(
                torch.equal(a, b) for a, b in zip(one.get("pool", []), two.get("pool", []), strict=True)
            )
            assert one.get("round") == two.get("round")
    assert memory.parties() == disk.parties()


def test_auto_keeps_states_in_memory_up_to_its_limit_then_on_disk(tmp_path, caplog):
    rng = random.Random(0)
    states = {p: _state(rng) for p in range(5)}
    limit = sum(state_bytes(s) for s in list(states.values())[:3])
    store = AutoPartyStore(tmp_path / "auto", limit)
    for p in range(3):
        store.put(p, states[p])
    assert type(store.inner) is PartyStore and not (tmp_path / "auto").exists()
    with caplog.at_level("INFO", logger="fedml_moon.core.state"):
        store.put(3, states[3])
    assert type(store.inner) is DiskPartyStore and "it moves to disk" in caplog.text
    store.put(4, states[4])
    assert (
        store.parties()
        == [0, 1, 2, 3, 4]
        == sorted(int(f.stem[6:]) for f in (tmp_path / "auto").glob("*.pt"))
    )
    for p, s in states.items():
        assert torch.equal(store.get(p)["pool"][0], s["pool"][0])
    assert type(make_store("auto", tmp_path / "x")) is AutoPartyStore
    with pytest.raises(ValueError, match="choose 'memory', 'disk' or 'auto'"):
        make_store("tape", tmp_path)


def test_auto_moving_to_disk_leaves_no_state_an_earlier_process_wrote_there(tmp_path):
    rng = random.Random(1)
    earlier = DiskPartyStore(tmp_path / "auto")
    earlier.put(7, _state(rng))  # a killed process's party 7, not in this run's checkpoint
    states = {p: _state(rng) for p in range(2)}
    store = AutoPartyStore(tmp_path / "auto", state_bytes(states[0]))
    for p, state in states.items():
        store.put(p, state)
    assert type(store.inner) is DiskPartyStore
    assert store.parties() == [0, 1] and 7 not in store


@pytest.mark.slow
def test_a_run_whose_states_move_to_disk_ends_as_one_that_keeps_them_in_memory(tmp_path, monkeypatch):
    """MOON, 6 parties, 3 a round: `auto` with a limit of one byte moves every state to disk from the first;
    the final model and the records equal the memory store's run."""
    from fedml_moon import conformance

    config = ROOT / "config" / "fashion_mnist" / "moon.yaml"
    sets = [*conformance.TINY, "train_args.client_num_in_total=6", "train_args.client_num_per_round=3"]
    memory = conformance.run_mode(
        "standalone", config, [*sets, "train_args.state_store=memory"], tmp_path / "m"
    )
    monkeypatch.setattr(store_module, "AUTO_MEMORY_BYTES", 1)
    from fedml_moon.conformance.inprocess import quiet_run

    with quiet_run(config, [*sets, "train_args.state_store=auto"], tmp_path / "auto") as run:
        run.loop.run()
        assert type(run.loop.runner.trainer.store.inner) is DiskPartyStore
    assert memory.ok
    diff, differences = conformance.compare(memory, conformance.RunResult("auto", tmp_path / "auto", [0], []))
    assert diff == 0.0 and not differences


@pytest.mark.slow
def test_a_resumed_run_ignores_states_a_killed_process_left_on_disk_after_its_checkpoint(tmp_path):
    """A process killed after round 0's checkpoint may have written later states into its disk
    store (a party first sampled after it, and newer states of the others): the resumed run takes
    the checkpoint's, and a party that is not in it starts afresh, as the uninterrupted run."""
    import shutil
    import subprocess

    from fedml_moon.conformance.inprocess import stopped_run

    config = Path(__file__).resolve().parent.parent / "config" / "fashion_mnist" / "moon.yaml"
    sets = [*conformance.TINY, "train_args.checkpoint_every=1", "device_args.torch_threads=1"]
    whole = conformance.run_mode("standalone", config, sets, tmp_path / "whole")
    assert whole.ok, whole.tail()
    stopped = tmp_path / "stopped"
    assert stopped_run(config, sets, stopped, after=0) == ""
    left = sorted((whole.out_dir / "party_state").glob("party_*.pt"))
    assert len(left) == 3 > len(list((stopped / "party_state").glob("party_*.pt")))
    for path in left:  # what the killed process wrote after round 0's checkpoint
        shutil.copy(path, stopped / "party_state" / path.name)
    cmd = [*conformance.cli_command("simulate", config, sets, stopped), "--resume", str(stopped)]
    env = conformance.process_env(tmp_path)
    done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    a = torch.load(whole.out_dir / "final_model.pt", weights_only=True)
    b = torch.load(stopped / "final_model.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)
