"""A site's refusal of its own data, in the process: what leaves the site is the kind of problem and
a setting's name from fixed vocabularies (never a path), a REFUSE that says anything else is refused
naming the field, a site that refused counts as missing until it says HELLO again, and the digest of
what a site read tells one image moved to another class from the same data
(tests/test_site_startup.py runs it all in a real cross-silo run)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fedml_moon.config.schema import ConfigError
from fedml_moon.data.datasets import DataNotFoundError
from fedml_moon.data.federated import FederatedData
from fedml_moon.data.formats import DataFileError
from fedml_moon.data.holdings import Holdings
from fedml_moon.distributed import managers as m
from fedml_moon.distributed.protocol import REFUSAL_KINDS, REFUSE, message_problem, refusal_text
from fedml_moon.distributed.silo.refusal import (
    DataChanged,
    check_digest,
    held_data_digest,
    kind_of,
    record_digest,
)
from tests.support.server import answer_train, receive, server_manager

SECRET = "/srv/site-a/private-scans/train/coat/patient-0042.png"


def _wrapped(err: Exception) -> ConfigError:
    """As `data.federated.prepare_own` raises a file's problem: a ConfigError, from None."""
    try:
        raise err
    except DataFileError:
        try:
            raise ConfigError(f"data_args.data_cache_dir: {err}") from None
        except ConfigError as wrapped:
            return wrapped


@pytest.mark.parametrize(
    ("err", "kind", "key"),
    [
        (_wrapped(DataFileError(SECRET, "not an image that can be decoded")), "unreadable", None),
        (
            DataFileError(SECRET, "has 3 channel(s); data_args.channels: 1"),
            "unreadable",
            "data_args.channels",
        ),
        (ConfigError(f"data_args.classes: {SECRET} holds a class the run does not name"), "agreement", None),
        (DataNotFoundError(SECRET), "missing", None),
        (DataChanged(f"data_args.data_cache_dir: {SECRET} differ"), "changed", "data_args.data_cache_dir"),
    ],
)
def test_what_leaves_a_site_is_a_kind_and_a_settings_name_never_its_paths(err, kind, key):
    found, named = kind_of(err)
    assert found == kind and (key is None or named == key)
    said = refusal_text(found, named)
    assert message_problem(REFUSE, {"kind": found, "key": named}) is None
    for part in SECRET.strip("/").split("/"):
        assert part not in said, (part, said)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"kind": "file /srv/site-a/x.png", "key": None}, "kind"),
        ({"kind": "agreement", "key": "/srv/site-a/x.png"}, "key"),
        ({"kind": "agreement", "key": "data_args.classes /srv"}, "key"),
        ({"kind": "agreement", "key": "x" * 81}, "key"),
        ({"kind": "agreement", "key": "attacker_args.visit_evil_example_com"}, "key"),  # the form, no setting
        ({"kind": "agreement", "key": "data_args.no_such_setting"}, "key"),
        ({"kind": ["agreement"], "key": None}, "kind"),
        ({"kind": "agreement", "key": None, "reason": "/srv/site-a"}, "unexpected fields"),
    ],
)
def test_a_refuse_that_says_more_than_its_vocabulary_is_refused_naming_the_field(fields, field):
    problem = message_problem(REFUSE, fields)
    assert problem is not None and field in problem


def test_every_kind_reads_as_a_sentence():
    assert all(refusal_text(k, None) == REFUSAL_KINDS[k] for k in REFUSAL_KINDS)
    assert refusal_text("missing", "data_args.data_cache_dir").endswith("(data_args.data_cache_dir)")


def _fed(y_train: list[int]) -> FederatedData:
    x = torch.arange(len(y_train) * 4, dtype=torch.uint8).reshape(len(y_train), 1, 2, 2)
    data = Holdings("site", x, torch.tensor(y_train), x[:2], torch.tensor([0, 1]), 3, (0.5,), (0.5,), "none")
    return FederatedData(data, [np.arange(len(y_train))], [np.arange(2)], np.zeros((1, 3)), party_ids=[4])


def test_the_digest_tells_one_image_moved_to_another_class_with_the_same_count(tmp_path):
    read = held_data_digest(_fed([0, 1, 2, 1]), [4])
    moved = held_data_digest(_fed([0, 1, 2, 2]), [4])  # one image from class 1 to class 2
    assert read == held_data_digest(_fed([0, 1, 2, 1]), [4]) and moved != read
    check_digest(tmp_path, moved, overwrite=False)  # nothing recorded yet (a run that never began)
    record_digest(tmp_path, read)  # its first task in the run
    assert json.loads((tmp_path / "data_digest.json").read_text()) == {"sha256": read}
    check_digest(tmp_path, read, overwrite=False)  # started again on the same data: taken
    with pytest.raises(DataChanged, match="differ from those it read earlier in this run.*--overwrite"):
        check_digest(tmp_path, moved, overwrite=False)
    assert kind_of(DataChanged("x"))[0] == "changed"
    check_digest(tmp_path, moved, overwrite=True)  # a new run: taken, and recorded at its first task


def test_a_site_that_refused_counts_as_missing_until_it_says_hello_again(tmp_path):
    """Its honest-looking RESULT after a valid REFUSE is dropped: the round goes on without its party
    (as after an ERROR), not with its training and without its evaluation."""
    manager, wire = server_manager(tmp_path)
    answer_train(manager, wire, 1)
    answer_train(manager, wire, 2)
    receive(manager, 3, REFUSE, kind="changed", key="data_args.data_cache_dir")
    answer_train(manager, wire, 3)  # it goes on as if it had not refused
    receive(manager, 0, m.TICK)
    record = manager.rounds.recorder.records[0]
    assert record["parties"] == 2 and record["missing_parties"] == [2], record


def test_no_message_type_starts_a_line_of_the_servers_log(tmp_path, caplog):
    manager, _ = server_manager(tmp_path)
    receive(manager, 3, "refuse\n10:00 INFO ok", kind="agreement", key=None)
    said = [r.getMessage() for r in caplog.records if "10:00 INFO ok" in r.getMessage()]
    assert said and all("\n" not in line for line in said), said
