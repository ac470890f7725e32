"""A worker's side of secure aggregation's messages (`SecureWorker`), on a silo holding three parties:
a party whose upload diverged leaves at masking while the others go on, and the worker takes the
round's participant count and threshold from its own config and the digests it is sent, never from
the server's word: a roster that disagrees with itself, or names fewer than 3, is refused; what a plan
sums in the clear is checked against the silo's own model."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch
from fedml.core.distributed.communication.message import Message

from fedml_moon.distributed import protocol as p
from fedml_moon.distributed.secure_wire import keys_from_wire
from fedml_moon.distributed.silo.secure import SecureWorker
from fedml_moon.privacy.mod import PrivateAggregation
from fedml_moon.privacy.options import PrivacyArgs
from fedml_moon.privacy.secagg import key_digest


class _Worker(SecureWorker):
    """The worker side's handlers, on a silo holding parties 0, 1 and 2 (what its manager would hold)."""

    def __init__(self, privacy, folder=None) -> None:
        train = SimpleNamespace(client_num_per_round=3, algorithm="fedavg")
        server = SimpleNamespace(aggregation="sync", buffer_weights="uniform", party_weights="samples")
        config = SimpleNamespace(privacy_args=privacy, train_args=train, server_args=server)
        model = torch.nn.Module()
        model.w = torch.nn.Parameter(torch.zeros(3))  # the silo's model: what a plan may name
        built = SimpleNamespace(
            run_config=config,
            runner=SimpleNamespace(trainer=SimpleNamespace(model=model)),
            config={"train_args.algorithm": "fedavg"},  # the run's shared settings (their digest keys a sum)
            data_sha256="",
        )
        silo = SimpleNamespace(rank=1, state=SimpleNamespace(built=built), folder=folder)  # its silo, rank 1
        super().__init__(silo)
        self.sent = []

    def send(self, kind: str, receiver: int, **params) -> None:
        self.sent.append((kind, params))


def _aggregation(privacy) -> PrivateAggregation:
    """The server's side of a round of the 3 parties (FedAvg's sums and training metrics)."""
    return PrivateAggregation(
        privacy, {"model": "update"}, dict.fromkeys(range(3), 1.0), 3, metrics=("ce", "loss")
    )


def _msg(kind: str, **params) -> Message:
    msg = Message(kind, 0, 1)
    for key, value in params.items():
        msg.add_params(key, value)
    return msg


def _worker_with_keys(
    privacy, values=(math.nan, 0.5, -0.5), folder=None
) -> tuple[_Worker, list[dict], list[dict]]:
    """A worker whose 3 parties trained and advertised; the ROSTER fields an honest server sends it
    (every party's keys: the complete graph of 3) and their digests."""
    worker = _Worker(privacy, folder)
    received = {"model": {"w": torch.zeros(3)}}
    tasks = [{"party": q, "payload": received} for q in (0, 1, 2)]
    uploads = [
        {"model": {"w": torch.full((3,), v)}, "party_id": q, "metrics": {"ce": 1.0, "loss": 1.0}}
        for q, v in enumerate(values)
    ]
    worker.secure_train(0, tasks, [(10.0, u) for u in uploads])
    ((kind, keys),) = worker.sent
    assert kind == p.KEYS and [k["party"] for k in keys["keys"]] == [0, 1, 2]
    digests = [{"party": k["party"], "digest": key_digest(keys_from_wire(k)[1]).hex()} for k in keys["keys"]]
    return worker, [{"party": q, "keys": keys["keys"]} for q in (0, 1, 2)], digests


def test_a_diverged_party_leaves_at_masking_and_the_silos_other_parties_go_on(caplog):
    privacy = PrivacyArgs(secure_aggregation=True)
    worker, roster, digests = _worker_with_keys(privacy)
    worker.on_sa_roster(_msg(p.ROSTER, round=0, participants=3, digests=digests, rosters=roster))
    shares = worker.sent[-1][1]["shares"]
    assert len(shares) == 6  # each of 3 parties to its 2 neighbours
    plan = _aggregation(privacy).plan(0).to_dict()
    inbox = {
        q: [{"sender": s["sender"], "ct": s["ct"]} for s in shares if s["receiver"] == q] for q in (0, 1, 2)
    }
    mask = [{"party": q, "plan": plan, "inbox": inbox[q]} for q in (0, 1, 2)]
    worker.on_sa_mask(_msg(p.MASK, round=0, tasks=mask))
    kind, masked = worker.sent[-1]
    assert kind == p.MASKED and [i["party"] for i in masked["items"]] == [1, 2]
    assert all(i["accused"] == [] for i in masked["items"])
    assert "party 0 does not mask its vector this round: the upload holds NaN or Inf" in caplog.text


@pytest.mark.parametrize(
    ("keep", "participants", "said"),
    [
        (3, 4, "the roster says 4 participants but names 3"),
        (2, 2, "2 participants, fewer than 3"),
    ],
)
def test_a_worker_checks_the_rosters_participants_against_its_own_config(caplog, keep, participants, said):
    """The participant count and t come from the worker's own config and the digests it is sent,
    never from the server's word: a roster that disagrees, or names fewer than 3, is refused."""
    worker, roster, digests = _worker_with_keys(PrivacyArgs(secure_aggregation=True))
    rosters = [{"party": r["party"], "keys": r["keys"][:keep]} for r in roster[:keep]]
    msg = _msg(p.ROSTER, round=0, participants=participants, digests=digests[:keep], rosters=rosters)
    worker.on_sa_roster(msg)
    assert worker.sent[-1] == (p.SHARES, {"round": 0, "shares": []})
    assert said in caplog.text and "refusing to share" in caplog.text


def _masked_with(privacy, plan: dict, folder=None) -> _Worker:
    worker, roster, digests = _worker_with_keys(privacy, values=(0.5, 0.25, -0.5), folder=folder)
    worker.on_sa_roster(_msg(p.ROSTER, round=0, participants=3, digests=digests, rosters=roster))
    shares = worker.sent[-1][1]["shares"]
    inbox = {
        q: [{"sender": s["sender"], "ct": s["ct"]} for s in shares if s["receiver"] == q] for q in (0, 1, 2)
    }
    worker.on_sa_mask(
        _msg(p.MASK, round=0, tasks=[{"party": q, "plan": plan, "inbox": inbox[q]} for q in (0, 1, 2)])
    )
    return worker


def test_under_dp_a_party_unmasks_no_sum_of_fewer_than_its_noise_was_sized_for(tmp_path, caplog):
    """DP with secure aggregation: the plan sizes each party's noise for a sum of 3 (min_sum); the
    parties raise their crowd (secagg_min_group 2) to 3, so an unmasking request that keeps 2 of them
    is refused, revealing nothing (their 2 shares of noise would fall short of the accounted sigma)."""
    privacy = PrivacyArgs(
        secure_aggregation=True, secagg_min_group=2, dp_clip_norm=1.0, dp_noise_multiplier=1.0
    )
    plan = _aggregation(privacy).plan(0)
    assert plan.min_sum == 3
    worker = _masked_with(privacy, plan.to_dict(), tmp_path)
    assert [i["party"] for i in worker.sent[-1][1]["items"]] == [0, 1, 2]
    assert all(held["session"].params.min_group == 3 for held in worker.sa_parties.values())
    worker.on_sa_unmask(_msg(p.UNMASK, round=0, survivors=[1, 2], dropped=[0], parties=[1, 2]))
    assert worker.sent[-1][1]["items"] == [] and "fewer than" in caplog.text


@pytest.mark.parametrize("dp", [False, True])
def test_a_party_reveals_a_rounds_shares_for_one_set_of_survivors_only(tmp_path, caplog, dp):
    """A curious server kills itself after round 0's sum of parties 0, 1, 2 and resumes: the silo's
    parties, restored, train the same updates and mask them anew. Asked to unmask the sum of 1 and 2
    (0 "dropped"), which with the first sum would tell party 0's update (under DP its training metrics,
    which no noise covers), they refuse, revealing nothing; the same survivors as before (the same sum)
    they unmask. The record is the silo's folder's, so a new silo process keeps it."""
    noise = {"dp_clip_norm": 1.0, "dp_noise_multiplier": 0.5} if dp else {}
    privacy = PrivacyArgs(secure_aggregation=True, secagg_min_group=2, **noise)
    plan = _aggregation(privacy).plan(0).to_dict()
    first = _masked_with(privacy, plan, tmp_path)
    first.on_sa_unmask(_msg(p.UNMASK, round=0, survivors=[0, 1, 2], dropped=[], parties=[0, 1, 2]))
    assert [i["party"] for i in first.sent[-1][1]["items"]] == [0, 1, 2]
    again = _masked_with(privacy, plan, tmp_path)  # the resumed round: a new session, the same updates
    again.on_sa_unmask(_msg(p.UNMASK, round=0, survivors=[1, 2], dropped=[0], parties=[1, 2]))
    assert again.sent[-1][1]["items"] == []
    assert "party 1's update of round 0 was revealed for the survivors [0, 1, 2]" in caplog.text
    assert "a sum of other survivors [1, 2] would tell the difference" in caplog.text
    again.on_sa_unmask(_msg(p.UNMASK, round=0, survivors=[0, 1, 2], dropped=[], parties=[0, 1, 2]))
    assert [i["party"] for i in again.sent[-1][1]["items"]] == [0, 1, 2]  # the same sum: nothing more


def test_a_record_of_revealed_sums_that_cannot_be_read_refuses_every_reveal(tmp_path, caplog):
    (tmp_path / "secure_sums.json").write_text("{not json")
    privacy = PrivacyArgs(secure_aggregation=True)
    worker = _masked_with(privacy, _aggregation(privacy).plan(0).to_dict(), tmp_path)
    worker.on_sa_unmask(_msg(p.UNMASK, round=0, survivors=[0, 1, 2], dropped=[], parties=[0, 1, 2]))
    assert worker.sent[-1][1]["items"] == [] and "cannot be read" in caplog.text


def test_a_party_refuses_to_mask_under_a_plan_that_is_not_its_runs(caplog):
    """A plan whose noise share is not sigma C / sqrt(min_sum) (a server that would have the parties add
    less noise than the run's privacy_args ask) is refused: no party masks."""
    privacy = PrivacyArgs(secure_aggregation=True, dp_clip_norm=1.0, dp_noise_multiplier=1.0)
    plan = _aggregation(privacy).plan(0).to_dict()
    worker = _masked_with(privacy, {**plan, "noise_std": plan["noise_std"] / 10})
    assert worker.sent[-1][1]["items"] == []
    assert "is not sigma C / sqrt(3)" in caplog.text


def test_a_party_checks_what_a_plan_sums_in_the_clear_against_its_own_model():
    """DP with `dp_buffers: average`: the server's plan sums the model's BatchNorm statistics in the
    clear, which the party accepts; a plan that also puts a trainable parameter there (unclipped,
    unnoised) is refused, as is one that puts anything there without DP."""
    dp = PrivacyArgs(secure_aggregation=True, dp_clip_norm=1.0, dp_noise_multiplier=1.0, dp_buffers="average")
    worker = _Worker(dp)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    worker.built.runner.trainer.model = model
    aggregation = _aggregation(dp)
    aggregation.set_model([n for n, _ in model.named_parameters()], model.state_dict())
    plan = aggregation.plan(0)
    assert set(plan.clear) == {"1.running_mean", "1.running_var"}
    assert worker._plan_fields_problem(plan) is None
    leaky = dataclasses.replace(plan, clear=(*plan.clear, "0.weight"))
    assert "in the clear" in worker._plan_fields_problem(leaky)
    worker = _Worker(PrivacyArgs(secure_aggregation=True))
    worker.built.runner.trainer.model = model
    assert "in the clear" in worker._plan_fields_problem(dataclasses.replace(plan, ratio=1.0, noise_std=0.0))


def test_a_party_refuses_a_ratio_below_1_where_every_party_weighs_the_same_and_integer_entries_summed():
    """Without DP and with sample-weighted parties any ratio in (0, 1] is the server's to set; with
    `party_weights: uniform` every party's ratio is 1, and a plan giving one party less (a server
    leaving another party alone in the sum) is refused. A plan that leaves out of the sum anything but
    the model's integer entries is refused too."""
    worker = _Worker(PrivacyArgs(secure_aggregation=True))
    plan = _aggregation(worker.built.run_config.privacy_args).plan(0)
    assert worker._plan_fields_problem(dataclasses.replace(plan, ratio=0.5)) is None
    worker.built.run_config.server_args.party_weights = "uniform"
    assert "ratio 0.5 is not 1" in worker._plan_fields_problem(dataclasses.replace(plan, ratio=0.5))
    assert "leaves ['w'] out" in worker._plan_fields_problem(dataclasses.replace(plan, left_out=("w",)))
