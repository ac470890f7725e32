"""A run's identity and a site's folder kept to one run (distributed/run_identity.py): the server
makes a new key for a new run and keeps it for a resumed one; a site's folder holds one run's files,
another run's WELCOME moves them to `earlier/<run>/` (never a hierarchical silo's processes' folders,
never an earlier run's), the same run's moves nothing; a key that could name another folder (a
hostile server's `../..`) is refused by the protocol and by the site."""

from __future__ import annotations

import json

import pytest

from fedml_moon.distributed import protocol
from fedml_moon.distributed.run_identity import enter_run, recorded_run, server_run


def test_a_new_run_gets_a_new_key_and_a_resumed_one_keeps_its_own(tmp_path):
    first = server_run(tmp_path, resume=False)
    assert recorded_run(tmp_path) == first
    assert server_run(tmp_path, resume=True) == first  # --resume: the same run
    again = server_run(tmp_path, resume=False)  # --overwrite: another run
    assert again != first and recorded_run(tmp_path) == again
    (tmp_path / "run.json").unlink()  # a folder written before runs had a key: resumed, it gets one
    made = server_run(tmp_path, resume=True)
    assert recorded_run(tmp_path) == made


def _site_files(site, run: str | None) -> None:
    site.mkdir(parents=True, exist_ok=True)
    if run is not None:
        (site / "run.json").write_text(json.dumps({"run": run}))
    (site / "final_model.pt").write_bytes(b"run's model")
    (site / "data_digest.json").write_text('{"sha256": "aa"}')
    (site / "party_state").mkdir()
    (site / "party_state" / "party_0.pt").write_bytes(b"state")
    (site / "secure_sums.json").write_text("{}")
    (site / "process-1").mkdir()
    (site / "process-1" / "partition.json").write_text("{}")


def test_another_runs_welcome_moves_the_sites_files_apart_and_the_same_runs_moves_nothing(tmp_path):
    site = tmp_path / "rank-1"
    _site_files(site, "aaaaaaaa0001")
    assert enter_run(site, "aaaaaaaa0001", 1) is None  # a restart, or a resumed run
    assert (site / "final_model.pt").is_file() and (site / "data_digest.json").is_file()

    moved = enter_run(site, "bbbbbbbb0002", 1)
    assert moved == site / "earlier" / "aaaaaaaa0001"
    assert sorted(p.name for p in moved.iterdir()) == [
        "data_digest.json",
        "final_model.pt",
        "party_state",
        "run.json",
    ]
    assert (moved / "party_state" / "party_0.pt").read_bytes() == b"state"
    assert sorted(p.name for p in site.iterdir()) == [  # what the site's shares revealed stays for every run
        "earlier",
        "party_state",
        "process-1",
        "run.json",
        "secure_sums.json",
    ]
    assert not any((site / "party_state").iterdir()) and recorded_run(site) == "bbbbbbbb0002"

    (site / "final_model.pt").write_bytes(b"second")
    assert enter_run(site, "aaaaaaaa0001", 1) == site / "earlier" / "bbbbbbbb0002"  # back to the first key
    (site / "final_model.pt").write_bytes(b"third")
    assert enter_run(site, "cccccccc0003", 1) == site / "earlier" / "aaaaaaaa0001-2"  # never over one kept
    assert (site / "earlier" / "aaaaaaaa0001" / "final_model.pt").read_bytes() == b"run's model"


def test_a_folder_of_no_run_becomes_the_welcomed_runs_own(tmp_path):
    site = tmp_path / "rank-2"
    _site_files(site, None)
    assert enter_run(site, "dddddddd0004", 2) is None
    assert (site / "final_model.pt").is_file() and recorded_run(site) == "dddddddd0004"


@pytest.mark.parametrize("run", ["../../etc", "", "ABCDEF12", "a" * 33, "abc", 12345678, ["aaaaaaaa"]])
def test_a_run_key_that_is_no_key_is_refused_by_the_protocol_and_by_the_site(tmp_path, run):
    fields = {"resume_from": None, "config": {}, "config_sha256": "0" * 64, "session": "s", "run": run}
    problem = protocol.message_problem(protocol.WELCOME, fields)
    assert problem and "run" in problem
    with pytest.raises(ValueError, match="names no run this site can keep files for"):
        enter_run(tmp_path / "rank-1", run, 1)
    assert not (tmp_path / "rank-1").exists()
