"""Secure aggregation in a distributed buffered run (distributed/server/buffered_secure.py): each buffer is a
secure sum among its parties, whose uploads never leave their silos.

The server manager runs in this process on a tiny real run (FedAvg, 4 silos of one party each, all
training at once, K = 3); each silo is played by the plugin's own worker side of the protocol
(`SecureWorker`: it holds its parties' uploads, checks the server's requests against its own config,
and masks), and answers its messages in the order they were sent, the ranks in turn. A TRAIN is
trained as in tests/test_buffered_resume.py: the model it was sent, moved by 0.01 x the rank."""

from __future__ import annotations

import math
import re
from collections import Counter
from types import SimpleNamespace

import pytest
from fedml.core.distributed.communication.message import Message

from fedml_moon.distributed import managers as m
from fedml_moon.distributed import protocol as p
from fedml_moon.distributed.secure_wire import keys_to_wire
from fedml_moon.distributed.silo.secure import SecureWorker
from fedml_moon.privacy.party import PrivacyError
from fedml_moon.privacy.secagg import PartySession
from tests.support.buffered_silos import CLOCK, Silos, finish
from tests.support.marks import needs_fmnist
from tests.support.server import receive, same_tree, server_manager

pytestmark = needs_fmnist

BUFFERED = [
    "server_args.aggregation=buffered",
    "server_args.buffer_size=3",
    "train_args.comm_round=5",
    "train_args.checkpoint_every=1",
]
SECURE = ["privacy_args.secure_aggregation=true"]
TO_WORKER = {p.OPEN: "on_sa_open", p.ROSTER: "on_sa_roster", p.MASK: "on_sa_mask", p.UNMASK: "on_sa_unmask"}


class Worker(SecureWorker):
    """A silo's worker side of secure aggregation, its messages sent to the server in this process."""

    def __init__(self, rank: int, manager) -> None:
        model = SimpleNamespace(trainer=SimpleNamespace(model=manager.rounds.aggregator.model))
        built = SimpleNamespace(run_config=manager.run_config, runner=model)
        super().__init__(SimpleNamespace(rank=rank, state=SimpleNamespace(built=built)))  # its silo
        self.manager = manager
        self.sent: list[tuple[str, dict]] = []

    def send(self, kind: str, to: int, **params) -> None:
        self.sent.append((kind, params))
        receive(self.manager, self.rank, kind, **params)


class SecureSilos(Silos):
    """The silos (tests/test_buffered_resume.py's), each with its worker: a TRAIN's uploads are held
    (`secure_hold`), a secure session's messages answered by the worker."""

    def __init__(self, manager, wire, workers: dict[int, Worker] | None = None) -> None:
        super().__init__(manager, wire)
        self.queues = {rank: [] for rank in manager.settings.workers}
        self.gone: set[int] = set()  # silos stopped: their messages are lost
        self.workers = workers or {rank: Worker(rank, manager) for rank in manager.settings.workers}
        for worker in self.workers.values():
            worker.manager = manager

    def collect(self) -> None:
        for msg in self.wire.sent[self.seen :]:
            if (
                msg.get_type() in (m.TRAIN, m.CHECKPOINT, m.EVAL, *TO_WORKER)
                and msg.get_receiver_id() not in self.gone
            ):
                self.queues[msg.get_receiver_id()].append(msg)
        self.seen = len(self.wire.sent)

    def answer(self, rank: int, msg, to=None) -> None:
        worker = self.workers[rank]
        if msg.get_type() in TO_WORKER:
            getattr(worker, TO_WORKER[msg.get_type()])(msg)
            return
        if msg.get_type() != m.TRAIN:
            super().answer(rank, msg, to)
            return
        trained = []
        for task in msg.get("tasks"):
            model = task["payload"]["model"]
            moved = {k: v + 0.01 * rank if v.is_floating_point() else v for k, v in model.items()}
            upload = {
                "model": moved,
                "party_id": task["party"],
                "metrics": {"ce": 0.1 * rank, "loss": 0.1 * rank},
            }
            trained.append((self.manager.rounds.samples[task["party"]], upload))
        worker.secure_hold(msg.get("round"), msg.get("tasks"), trained)


ON_CLOCK = [*CLOCK, *SECURE, "server_args.buffer_size=3"]  # the MPI simulation's server
WIRE = ("wire_bytes_sent", "wire_bytes_received")


def _in_the_server(tmp_path, settings: list[str]) -> tuple:
    """The same run, each buffer's secure sum run by the server itself from the parties' uploads
    (the standalone simulation's SecAgg, in one process): its silos send RESULTs."""
    manager, wire = server_manager(tmp_path, *settings, silos=4, secure=False)
    silos = Silos(manager, wire)
    silos.queues = {rank: [] for rank in manager.settings.workers}
    return finish(manager, silos)


def _run(tmp_path, *settings: str) -> tuple:
    manager, wire = server_manager(tmp_path, *settings, silos=4)
    silos = SecureSilos(manager, wire)
    return finish(manager, silos), silos


@pytest.fixture(scope="module")
def honest(tmp_path_factory) -> tuple:
    """The secure run on the clock whose silos all follow the protocol: (its outcome, its silos)."""
    return _run(tmp_path_factory.mktemp("honest"), *ON_CLOCK)


def test_each_buffer_is_the_secure_sum_of_its_parties_and_no_upload_reaches_the_server(tmp_path, honest):
    """On the simulated clock (so the updates are taken in one order whatever the messages' order):
    the run whose silos hold their uploads and sum each buffer securely over the network ends bit
    for bit as the one whose server ran the same secure sums itself from the uploads (the masks
    cancel exactly): model, server state, records (the wire's byte counts apart). The silos sent no
    RESULT, nothing but notices and the protocol's messages, and each masked vector was of a party of
    the buffer it summed."""
    want = _in_the_server(tmp_path / "in-the-server", ON_CLOCK)
    (final, records, state), silos = honest
    assert same_tree(final, want[0]) and same_tree(state, want[2]) and len(records) == 6
    drop = [{k: v for k, v in r.items() if k not in WIRE} for r in records]
    assert drop == [{k: v for k, v in r.items() if k not in WIRE} for r in want[1]]
    assert any(r["staleness_max"] > 0 for r in records) and all(r["bytes_up"] > 0 for r in records)
    kinds = {kind for worker in silos.workers.values() for kind, _ in worker.sent}
    assert kinds == {p.HELD, p.KEYS, p.SHARES, p.MASKED, p.UNMASKED}
    masked = [
        (params["round"], item["party"])
        for worker in silos.workers.values()
        for kind, params in worker.sent
        if kind == p.MASKED
        for item in params["items"]
    ]
    by_round = {r["round"]: {party for party, _ in r["updates"]} for r in records}
    assert all(party in by_round[round_idx] for round_idx, party in masked) and len(masked) == 18


def test_a_party_masks_its_update_once_and_only_with_its_own_staleness_rule(tmp_path):
    """A silo's own checks, whatever the server asks: a second session with an update it masked
    already gets no keys for it; a plan whose discount is not s(round - start version) of the run's
    staleness rule (here the paper's 1 / sqrt(1 + tau)) is refused, as is one past max_staleness."""
    manager, wire = server_manager(tmp_path, *BUFFERED, *SECURE, "server_args.max_staleness=3", silos=4)
    silos = SecureSilos(manager, wire)
    while not any(msg.get_type() == p.MASK for msg in wire.sent):
        assert silos.step()
    opened = next(msg for msg in wire.sent if msg.get_type() == p.OPEN)
    rank = opened.get_receiver_id()
    while manager.state.round.recorded < 0:
        assert silos.step()
    worker = silos.workers[rank]
    worker.on_sa_open(opened)  # the same session again: its update is masked already
    assert worker.sent[-1] == (p.KEYS, {"round": 0, "keys": []})
    privacy, party = manager.rounds.privacy, opened.get("parties")[0]["party"]
    upload = {"model": {}, "metrics": {"loss": 0.1}}
    held = {"version": 1, "upload": upload, "received": {}, "session": None}
    worker.sa_round = 3  # two rounds stale: s = 1 / sqrt(3)
    for s in (1.0, 0.5):
        with pytest.raises(PrivacyError, match="discount"):
            worker._masked(held, privacy.plan(party, s).to_dict(), {})
    assert worker._expected_terms(held) == (3, 1 / math.sqrt(3))
    right = privacy.plan(party, 1 / math.sqrt(3)).to_dict()
    weights = next(k for k in manager.rounds.aggregator.global_state if k.endswith("weight"))
    for change, why in [
        ({"ratio": 0.5}, "ratio 0.5 is not 1"),  # the others' tiny ratios would isolate one party
        ({"clear": [weights]}, "in the clear"),  # unclipped, unnoised
        ({"summed": {"model": "sum"}}, "sums"),
        ({"metrics": ["loss"]}, "metrics"),
    ]:
        with pytest.raises(PrivacyError, match=why):
            worker._masked(held, {**right, **change}, {})
    worker.sa_round = 5  # four rounds stale
    with pytest.raises(PrivacyError, match="max_staleness"):
        worker._expected_terms(held)


def test_a_party_shares_only_in_a_session_of_its_buffers_k_parties(tmp_path):
    """A server that opens a session of fewer parties than K (a smaller crowd to unmask) gets no
    shares from the silo: its roster is refused."""
    manager, wire = server_manager(tmp_path, *BUFFERED, *SECURE, silos=4)
    silos = SecureSilos(manager, wire)
    while not any(msg.get_type() == p.ROSTER for msg in wire.sent):
        assert silos.step()
    roster = next(msg for msg in wire.sent if msg.get_type() == p.ROSTER)
    rank, worker = roster.get_receiver_id(), silos.workers[roster.get_receiver_id()]
    fewer = Message(p.ROSTER, 0, rank)
    for key, value in roster.get_params().items():
        if key not in ("msg_type", "sender", "receiver"):
            fewer.add_params(key, value)
    fewer.add_params("digests", roster.get("digests")[:2])
    fewer.add_params("participants", 2)
    worker.on_sa_roster(fewer)
    assert worker.sent[-1] == (p.SHARES, {"round": 0, "shares": []})
    worker.on_sa_roster(roster)  # the whole roster: it shares
    assert worker.sent[-1][0] == p.SHARES and worker.sent[-1][1]["shares"]


def test_silos_that_never_send_keys_stop_the_run_rather_than_stall_it(tmp_path):
    """Credentialed silos that say HELD for their parties' updates, then answer every session's
    opening with no keys: the parties leave the buffer each time and take work again; once so many
    updates have left buffers (10 x max(K, concurrency)) with none applied, the run stops, naming
    why."""
    manager, wire = server_manager(tmp_path, *BUFFERED, *SECURE, silos=4)
    silos = SecureSilos(manager, wire)
    for worker in silos.workers.values():
        worker.on_sa_open = lambda msg, w=worker: w.send(p.KEYS, 0, round=msg.get("round"), keys=[])
    for _ in range(10_000):
        if manager.state.round.phase == "done" or not silos.step():
            break
    assert manager.state.round.phase == "done" and manager.status == "failed"
    reason = next(msg.get("reason") for msg in wire.sent if msg.get_type() == m.ABORT)
    taken = int(re.search(r"(\d+) updates taken out of the buffer before its secure sum", reason)[1])
    assert 40 <= taken < 43 and "(no keys for its secure sum" in reason  # 10 x max(K, concurrency)
    assert manager.rounds.recorder.records == []


def test_a_diverged_update_sends_no_keys(tmp_path):
    """An update holding NaN is not offered to a sum: the silo sends no keys for it."""
    manager, _ = server_manager(tmp_path, *BUFFERED, *SECURE, silos=4)
    worker = Worker(1, manager)
    model = {k: v.clone() for k, v in manager.rounds.aggregator.global_state.items()}
    next(v for v in model.values() if v.is_floating_point())[0] = float("nan")
    worker.secure_hold(0, [{"party": 0, "payload": {}}], [(1, {"model": model, "metrics": {"loss": 0.1}})])
    opening = Message(p.OPEN, 0, 1)
    opening.add_params("round", 0)
    opening.add_params("parties", [{"party": 0, "version": 0}])
    worker.on_sa_open(opening)
    assert worker.sent[-1] == (p.KEYS, {"round": 0, "keys": []})


GONE = {  # when a silo says BYE, and what its party's update becomes
    "open": (p.OPEN, [], "no keys for its secure sum"),
    "roster": (p.ROSTER, [], "no shares for its secure sum"),
    "roster-dp": (
        p.ROSTER,
        ["privacy_args.dp_clip_norm=1", "privacy_args.dp_noise_multiplier=0.01"],
        "no shares",
    ),
    "mask": (p.MASK, [], None),
}


@pytest.mark.parametrize("case", list(GONE))
def test_a_silo_gone_during_a_buffers_session_is_not_waited_for(tmp_path, case):
    """5 silos, K = 4 (at least 3 a sum): a silo that says BYE when its buffer's session opens sends
    no keys, and one that says BYE when the roster comes sends no shares: no party has masked yet, so
    its party's update is taken out of the buffer (left out), which fills again (under DP too, where
    no sum of fewer than K is unmasked). One that says BYE when asked for its masked vector is not in
    the sum, named `not_summed` in the record. Either way the run goes on without the silo."""
    when, extra, why = GONE[case]
    manager, wire = server_manager(tmp_path, *BUFFERED, *SECURE, "server_args.buffer_size=4", *extra, silos=5)
    silos = SecureSilos(manager, wire)
    while not any(msg.get_type() == when for msg in wire.sent):
        assert silos.step()
    gone = next(msg for msg in wire.sent if msg.get_type() == when).get_receiver_id()
    receive(manager, gone, m.BYE)
    silos.gone.add(gone)
    for _ in range(1000):  # a tick once the others answered: the server gives up on the silo gone
        if manager.state.round.phase == "finish":
            break
        if not silos.step():
            receive(manager, 0, m.TICK)
    final, records, _ = finish(manager, silos)
    assert len(records) == 5 and all(v.double().isfinite().all() for v in final.values())
    if why is not None:
        assert [(party, w[: len(why)]) for party, _, w, _ in records[0]["left_out"]] == [(gone - 1, why)]
        assert all("not_summed" not in r for r in records)
    else:
        assert records[0]["not_summed"] == [gone - 1] and records[0]["left_out"] == []
    assert all(gone - 1 not in {q for q, _ in r["updates"]} for r in records[1:])


@pytest.mark.parametrize(("after", "masked"), [(2, False), (9, True)])
def test_on_the_clock_a_server_killed_and_resumed_masks_no_update_twice(tmp_path, honest, after, masked):
    """The MPI simulation's server under secure aggregation, its silos left running (they keep the
    uploads they hold): killed `after` answers past its first checkpoint and resumed. Where no update
    of the checkpoint's buffer was masked before the kill, the run ends bit for bit as the run never
    interrupted (a secure sum without DP is exact). Where some were, their silos do not mask them
    again: the resumed run leaves them out of the buffer, which fills again, and completes; no
    party masked an update twice for any round."""
    want = honest[0]
    first, wire = server_manager(tmp_path / "run", *ON_CLOCK, silos=4)
    silos = SecureSilos(first, wire)
    while first.state.round.last_checkpoint is None:
        assert silos.step()
    for _ in range(after):
        assert silos.step()
    kept = first.state.round.last_checkpoint + 1
    before = {(params["round"], item["party"]) for params, item in _masked(silos) if params["round"] >= kept}
    assert bool(before) == masked
    again, wire_again = server_manager(tmp_path / "run", *ON_CLOCK, silos=4, resume=True)
    got = finish(again, SecureSilos(again, wire_again, silos.workers))
    masks = Counter(item["party"] for _, item in _masked(silos))
    trained = Counter(  # the tasks each party trained (its HELD notices), for either server
        item["party"]
        for worker in silos.workers.values()
        for kind, params in worker.sent
        if kind == p.HELD
        for item in params["parties"]
    )
    assert not masks - trained and len(got[1]) == 6  # no held update masked twice
    if not masked:
        assert same_tree(got[0], want[0]) and got[1] == want[1] and same_tree(got[2], want[2])
        return
    assert got[1][:kept] == want[1][:kept]
    left = {(got[1][kept]["round"], party) for party, _, why, _ in got[1][kept]["left_out"]}
    assert left == before


def _masked(silos: SecureSilos) -> list[tuple[dict, dict]]:
    """(message, item) of every masked vector the silos' workers sent."""
    return [
        (params, item)
        for worker in silos.workers.values()
        for kind, params in worker.sent
        if kind == p.MASKED
        for item in params["items"]
    ]


def _hostile(manager, silos: SecureSilos) -> None:
    """Well-formed messages from the run's silos whose values are hostile: a HELD for another silo's
    party, for a version the sender has no task of, with a sample count not the party's, a HELD
    sent again, keys for a party outside the buffer or for another round, a RESULT in the clear."""
    version, samples = manager.flow.core.version, manager.rounds.samples
    for rank, worker in silos.workers.items():
        other = rank % len(silos.workers)  # the next rank's party
        mine = rank - 1
        receive(manager, rank, p.HELD, round=version, parties=[{"party": other, "n": samples[other]}])
        receive(manager, rank, p.HELD, round=version + 1, parties=[{"party": mine, "n": samples[mine]}])
        receive(manager, rank, p.HELD, round=version, parties=[{"party": mine, "n": samples[mine] + 1}])
        for kind, params in [x for x in worker.sent if x[0] == p.HELD][-1:]:
            receive(manager, rank, kind, **params)
        session = PartySession(other, version, manager.rounds.privacy.params(3))
        keys = [keys_to_wire(other, session.advertise())]  # well-formed keys, not its party's
        receive(manager, rank, p.KEYS, round=version, keys=keys)
        receive(manager, rank, p.KEYS, round=version + 1, keys=keys)
        upload = {"model": manager.rounds.aggregator.global_state, "party_id": mine, "metrics": {"loss": 0.0}}
        receive(
            manager,
            rank,
            m.RESULT,
            round=version,
            results=[{"party": mine, "n": samples[mine], "upload": upload}],
        )


def test_hostile_notices_and_keys_change_nothing(tmp_path, honest):
    """On the clock, before every silo's answer each silo also sends the hostile messages of
    `_hostile`, a party's upload in a RESULT among them: each is refused, the server holds no upload
    at any moment (what it took of each update is a notice), and the run ends bit for bit as the run
    without them (model, server state, records)."""
    want = honest[0]
    manager, wire = server_manager(tmp_path / "hostile", *ON_CLOCK, silos=4)
    silos = SecureSilos(manager, wire)
    for _ in range(10_000):
        if manager.state.round.phase == "finish":
            break
        _hostile(manager, silos)
        assert all(upload == {} for upload in manager.flow.core.arrived.values())  # notices only
        if not silos.step():
            break
    got = finish(manager, silos)
    assert same_tree(got[0], want[0]) and same_tree(got[2], want[2])
    strip = [{k: v for k, v in r.items() if k not in WIRE} for r in got[1]]
    assert strip == [{k: v for k, v in r.items() if k not in WIRE} for r in want[1]]
