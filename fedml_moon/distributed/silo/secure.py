"""A worker's side of secure aggregation's message rounds (see `fedml_moon.distributed.server.secure` for
the exchange): its parties' sessions, from their keys to their unmasking shares; a member of the
silo's manager. The worker checks what it
is asked against its own config (the threshold and the crowd rules, never taken from the server; the
participant count against the digests it is sent), and a party refuses what would reveal a secret
(`fedml_moon.privacy.secagg`: the graph it recomputes, the survivors' subgraph, t around it)."""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

import torch

from fedml_moon.core.buffering import buffer_shape
from fedml_moon.core.fedbuff import discount
from fedml_moon.distributed.managers import config_digest
from fedml_moon.distributed.protocol import HELD, KEYS, MASKED, SHARES, UNMASKED
from fedml_moon.distributed.secure_wire import keys_from_wire, keys_to_wire, shares_to_wire
from fedml_moon.distributed.silo.unmasked import counts_key, reveal_once, update_key
from fedml_moon.privacy.mod import secagg_params
from fedml_moon.privacy.party import Plan, PrivacyError, party_vector, plan_problem, warn_out_of_range
from fedml_moon.privacy.secagg import PartySession, SecAggError, pack
from fedml_moon.privacy.secure_counts import counts_params, counts_vector
from fedml_moon.registry import get_algorithm

log = logging.getLogger(__name__)


def finite(tree: Any) -> bool:
    """Whether every tensor and number in an upload (nested dicts and lists) is finite."""
    if isinstance(tree, torch.Tensor):
        return not tree.is_floating_point() or bool(torch.isfinite(tree).all())
    if isinstance(tree, dict):
        return all(finite(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return all(finite(v) for v in tree)
    if isinstance(tree, float):
        return math.isfinite(tree)
    return True


class SecureWorker:
    """A worker's side of the secure-aggregation phases, for its silo's manager (`silo`: its rank, what
    it sends, its state's parties once built). Its own: the round of the session its parties are in
    (`sa_round`), each party's session and what it adds (`sa_parties`), and in a buffered run the
    uploads it holds until their buffer's session (`sa_held`)."""

    def __init__(self, silo: Any) -> None:
        self.silo = silo
        self.sa_round: int | None = None
        self.sa_parties: dict[int, dict] = {}
        self.sa_held: dict[int, dict] = {}

    @property
    def rank(self) -> int:
        return self.silo.rank

    @property
    def built(self) -> Any:
        return self.silo.state.built

    def send(self, msg_type: str, receiver: int, **params: Any) -> None:
        self.silo.send(msg_type, receiver, **params)

    def secure_train(self, round_idx: int, tasks: list[dict], trained: list[tuple[float, dict]]) -> None:
        """Keep each party's upload and what it received; advertise fresh keys for each (its session's
        threshold is set again when the roster says how many take part)."""
        config = self.built.run_config
        planned = secagg_params(config.privacy_args, config.train_args.client_num_per_round)
        self.sa_round, self.sa_parties = round_idx, {}
        keys = []
        for task, (_, upload) in zip(tasks, trained, strict=True):
            party = int(task["party"])
            session = PartySession(party, round_idx, planned)
            self.sa_parties[party] = {"upload": upload, "received": task["payload"], "session": session}
            keys.append(keys_to_wire(party, session.advertise()))
        self.send(KEYS, 0, round=round_idx, keys=keys)

    def secure_hold(self, version: int, tasks: list[dict], trained: list[tuple[float, dict]]) -> None:
        """A buffered run: keep each party's upload and what it received until the server opens its
        buffer's secure session (`on_sa_open`), and say HELD (samples only: nothing of the upload)."""
        held = self.sa_held
        for task, (_, upload) in zip(tasks, trained, strict=True):
            held[int(task["party"])] = {"version": version, "upload": upload, "received": task["payload"]}
        parties = [{"party": int(t["party"]), "n": int(n)} for t, (n, _) in zip(tasks, trained, strict=True)]
        self.send(HELD, 0, round=version, parties=parties)

    def on_sa_open(self, msg: Any) -> None:
        """The buffer of round `round` is full: a session for each named party whose upload of the
        named start version this silo holds (a party it does not hold, e.g. after a restart, or
        masked already, is left out: it advertises no keys), with the crowd rules of a buffer of K
        from this worker's own config."""
        if self.built is None:
            log.warning("rank %d dropped a secure sum's opening sent before its WELCOME", self.rank)
            return
        config, round_idx = self.built.run_config, int(msg.get("round"))
        planned = secagg_params(config.privacy_args, buffer_shape(config)[1])
        keys = []
        self.sa_round, self.sa_parties = round_idx, {}
        for item in msg.get("parties"):
            party, mine = int(item["party"]), self._held_update(item, round_idx)
            if mine is not None:
                session = PartySession(party, round_idx, planned)
                self.sa_parties[party] = {**mine, "session": session}
                keys.append(keys_to_wire(party, session.advertise()))
        self.send(KEYS, 0, round=round_idx, keys=keys)

    def _held_update(self, item: dict, round_idx: int) -> dict | None:
        """The update this silo holds for `item` (party, start version), if it may enter round
        `round_idx`'s sum: held and not masked yet, of that version (not after the round), finite."""
        party, mine = int(item["party"]), self.sa_held.get(int(item["party"]))
        if mine is None or mine["version"] != item["version"] or mine["version"] > round_idx:
            log.warning(
                "rank %d holds no update of party %d from version %s", self.rank, party, item["version"]
            )
            return None
        if not finite(mine["upload"]):
            log.error("rank %d: party %d's update is not finite: it takes no part in a sum", self.rank, party)
            return None
        return mine

    def secure_eval(self, round_idx: int, reports: list[dict], names: list[str]) -> None:
        """Keep each party's test counts as its vector and advertise fresh keys for their secure sum
        (`privacy.secure_counts`): its counts never leave it in the clear."""
        config = self.built.run_config
        planned = counts_params(config.privacy_args, config.train_args.client_num_in_total)
        self.sa_round, self.sa_parties, keys = round_idx, {}, []
        for report in reports:
            party = int(report["party_id"])
            session = PartySession(party, round_idx, planned)
            self.sa_parties[party] = {"counts": counts_vector(report["test"], names), "session": session}
            keys.append(keys_to_wire(party, session.advertise()))
        self.send(KEYS, 0, round=round_idx, keys=keys)

    def _params(self, participants: int) -> Any:
        """The round's session parameters from this worker's own privacy_args (counts: their encoding)."""
        options = self.built.run_config.privacy_args
        counting = any("counts" in held for held in self.sa_parties.values())
        return counts_params(options, participants) if counting else secagg_params(options, participants)

    def _held(self, msg: Any, party: int) -> dict | None:
        held = self.sa_parties.get(int(party))
        if held is None or msg.get("round") != self.sa_round:
            log.warning(
                "rank %d dropped a %s message for party %s, round %s",
                self.rank,
                msg.get_type(),
                party,
                msg.get("round"),
            )
            return None
        return held

    def _each(self, msg: Any, items: list[dict], step: str, run: Any) -> list[tuple[dict, Any]]:
        """`run(held, item)` for each of `items` whose party this worker holds in this round; (item,
        answer) for each party that does not refuse (`_refusing`)."""
        out = []
        for item in items:
            held = self._held(msg, item["party"])
            if held is not None:
                answer = self._refusing(item["party"], step, run, held, item)
                if answer is not None:
                    out.append((item, answer))
        return out

    def on_sa_roster(self, msg: Any) -> None:
        """Each party checks its roster against the round's graph it draws from the digests, with t
        from this worker's config for as many participants as the digests name."""
        digests, problem = self._digests(msg), None
        try:
            params = self._params(len(digests))
        except SecAggError as err:
            problem = str(err)
        if len(digests) != msg.get("participants") or len(digests) != len(msg.get("digests")):
            problem = f"the roster says {msg.get('participants')} participants but names {len(digests)}"

        def share(held: dict, item: dict) -> dict:
            size = buffer_shape(self.built.run_config)[1] if "version" in held else len(digests)
            if problem is None and len(digests) != size:  # a buffer's update: exactly its K parties
                raise SecAggError(
                    f"round {self.sa_round}: the roster names {len(digests)} participants, not the buffer's "
                    f"{size} (server_args.buffer_size): refusing to share"
                )
            if problem is not None:
                raise SecAggError(f"round {self.sa_round}: {problem}: refusing to share")
            session = held["session"]
            session.params = params
            return session.share(dict(keys_from_wire(k) for k in item["keys"]), digests)

        out = [
            {"sender": int(item["party"]), "receiver": int(receiver), "ct": ct.hex()}
            for item, shares in self._each(msg, msg.get("rosters"), "share its keys", share)
            for receiver, ct in shares.items()
        ]
        self.send(SHARES, 0, round=msg.get("round"), shares=out)

    @staticmethod
    def _digests(msg: Any) -> dict[int, bytes]:
        return {int(i["party"]): bytes.fromhex(i["digest"]) for i in msg.get("digests")}

    def on_sa_mask(self, msg: Any) -> None:
        """Each party's masked vector, and the senders whose shares did not open (named to the server)."""

        def masked(held: dict, task: dict) -> Any:
            inbox = {int(i["sender"]): bytes.fromhex(i["ct"]) for i in task["inbox"]}
            return self._masked(held, task["plan"], inbox), list(held["session"].accused)

        items = [
            {"party": int(task["party"]), "vector": vector, "accused": accused}
            for task, (vector, accused) in self._each(msg, msg.get("tasks"), "mask its vector", masked)
        ]
        self.send(MASKED, 0, round=msg.get("round"), items=items)

    def on_sa_unmask(self, msg: Any) -> None:
        """Each asked party's shares, once it has checked the round's whole lists (`PartySession.unmask`)."""
        survivors, dropped = list(msg.get("survivors")), list(msg.get("dropped"))

        def unmask(held: dict, request: dict) -> dict:
            shares = lambda: held["session"].unmask(survivors, dropped)  # noqa: E731 (it checks the lists)
            if "version" in held:  # a buffered run's held update: masked once (`_masked`)
                return shares()
            party, round_idx = int(request["party"]), int(msg.get("round"))
            if "counts" in held:
                key, what = counts_key(party, held["counts"]), f"party {party}'s test counts"
            else:
                settings = config_digest(self.built.config)
                key = update_key(settings, self.built.data_sha256, round_idx, party, held["received"])
                what = f"party {party}'s update of round {round_idx}"
            return reveal_once(self.silo.folder, key, what, survivors, shares)  # silo/unmasked.py

        asked = [{"party": int(p)} for p in msg.get("parties")]
        items = [
            {
                "party": int(request["party"]),
                "b": shares_to_wire(answer["b"]),
                "s": shares_to_wire(answer["s"]),
            }
            for request, answer in self._each(msg, asked, "unmask", unmask)
        ]
        self.send(UNMASKED, 0, round=msg.get("round"), items=items)

    def _masked(self, held: dict, raw: dict, inbox: dict) -> Any:
        """The party's masked vector, after checking the server's plan against this run's own
        privacy_args; a plan sized for a sum of `min_sum` parties raises the session's crowd to it.
        Test counts (`secure_eval`) take no plan: they are added as they are."""
        if "counts" in held:
            session = held["session"]
            return pack(session.mask(held["counts"], inbox), session.params.encoding.k)
        plan, config = Plan.from_dict(raw), self.built.run_config
        per_round, discounted = self._expected_terms(held)
        problem = plan_problem(
            plan, config.privacy_args, per_round, discounted, exact="version" in held
        ) or self._plan_fields_problem(plan)
        if problem is not None:
            raise PrivacyError(problem)
        session = held["session"]
        if plan.min_sum > session.params.min_group:
            session.params = dataclasses.replace(session.params, min_group=plan.min_sum)
        vector = party_vector(held["upload"], held["received"], plan)
        warn_out_of_range(vector.vector, session.params.encoding.clip, session.party)
        masked = pack(session.mask(vector.vector, inbox), session.params.encoding.k)
        if "version" in held:  # a held update is masked once: a second sum with it would reveal it
            self.sa_held.pop(session.party, None)
        return masked

    def _plan_fields_problem(self, plan: Plan) -> str | None:
        """What no server may choose for a party, from this worker's own config and model: the
        algorithm's sums and training metrics; a ratio of 1 wherever every party weighs the same (DP,
        `party_weights: uniform`, a buffered run's `buffer_weights: uniform`, LG-FedAvg's uniform
        mean): a tiny ratio for the others would leave one party's update alone in the sum; only the
        model's integer entries left out; nothing summed in the clear (unclipped, unnoised) but the
        model's entries that are not trained (BatchNorm's statistics) under DP with
        `dp_buffers: average`."""
        config = self.built.run_config
        spec = get_algorithm(config.train_args.algorithm)
        metrics = tuple(sorted({"loss", *spec.client.terms}))
        if dict(plan.summed) != dict(spec.server.summed) or tuple(plan.metrics) != metrics:
            return f"the plan's sums {plan.summed} or metrics {list(plan.metrics)} are not the algorithm's"
        options, s = config.privacy_args, config.server_args
        uniform = (
            options.dp
            or getattr(s, "party_weights", "samples") == "uniform"
            or (s.aggregation == "buffered" and s.buffer_weights == "uniform")
            or getattr(getattr(config, "algorithm_args", None), "uniform_average", False)  # LG-FedAvg
        )
        if uniform and plan.ratio != 1.0:
            return f"the plan's ratio {plan.ratio} is not 1 (every party weighs the same in this run)"
        model = self.built.runner.trainer.model
        state = model.state_dict()
        if set(plan.left_out) != {k for k, v in state.items() if not v.is_floating_point()}:
            return (
                f"the plan leaves {sorted(plan.left_out)[:5]} out of the sum, not the model's integer entries"
            )
        params = {name for name, param in model.named_parameters() if param.requires_grad}
        buffers = {k for k, v in state.items() if v.is_floating_point() and k not in params}
        allowed = buffers if options.dp and options.dp_buffers == "average" else set()
        if set(plan.clear) - allowed:
            return (
                f"the plan sums {sorted(set(plan.clear) - allowed)[:5]} in the clear, outside DP's clipping"
            )
        return None

    def _expected_terms(self, held: dict) -> tuple[int, float]:
        """(the parties a sum is sized for, the staleness discount the update takes) from this
        worker's own config: client_num_per_round and 1 in a synchronous round; a buffered run's K,
        and s(round - start version) of its staleness rule, an update past `max_staleness` refused."""
        config = self.built.run_config
        if "version" not in held:
            return config.train_args.client_num_per_round, 1.0
        s, tau = config.server_args, self.sa_round - held["version"]
        if s.max_staleness is not None and tau > s.max_staleness:
            raise PrivacyError(f"its update is {tau} rounds stale, past server_args.max_staleness")
        return buffer_shape(config)[1], discount(s.staleness, tau, s.staleness_exponent)

    def _refusing(self, party: int, step: str, run: Any, *args: Any) -> Any:
        """`run(*args)`, or None where the party refuses (a diverged upload, a request that would
        reveal a secret, a share that does not decrypt): it leaves the round at this step, and the
        silo's other parties go on."""
        try:
            return run(*args)
        except (PrivacyError, SecAggError) as err:
            log.error("rank %d: party %s does not %s this round: %s", self.rank, party, step, err)
            return None
