"""The distributed server's state, in one place: a record per rank (`Site`), the round's (`RoundState`),
a secure sum's (`SecureState`) and a buffered run's (`BufferState`), held by one `ServerState` that
the manager hands to each of its phases. No phase keeps a fact of the run in a field of its own that
another phase reads: what two phases share is here.

A rank's record lives as long as the server process. What each of a site's messages changes in it;
nothing else changes a record, and no sequence of messages resets the rank's limits: `welcomed_at`
(a WELCOME at most once a second), `resent` (a phase's work sent again at most once), `announced`
(its "is ready" line logged once, later ones bounded with the refusals), nor `took_part`, `refused`
and `heard_at`:

- HELLO (from a worker of this run whose own settings agree): `gone` cleared; if it is welcomed (at
  most once a second), `welcomed_at`, `process` and `seen`; a new process in the run is `restarted`.
- READY (its claims taken): `ready` set, `data_refused` cleared; a `restarted` rank (cleared then) gets
  its work of the phase again, once per (round, phase) (`resent`): at its READY, when it has built its
  parties from its data, so a restart that refuses its data spends nothing.
- REFUSE before the run started: `seen`, `ready` and `process` cleared, `data_refused` set (it is
  waited for as one that never said HELLO, and welcomed again within the WELCOME's rate). In the
  run: `gone` set.
- BYE or ERROR in the run: `gone` set (a BYE only while the rank owes the phase's answer, or holds
  tasks of a buffered run).
- Any message handled: `heard_at`; any message refused (by the protocol or a phase): `refused`.

The phase's facts of a rank (`work`, `owed`) are set when the server sends it the phase's work
(`ServerManager.assign`, `ServerManager.enter`) and replaced at the next phase; `owed` is what its
large frames' allowance is made of (transport/budget.py: what it owes and a spare), one more when
its work is sent again. `took_part` counts the rounds aggregated with its parties' answers.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Site:
    """One rank's facts (the module docstring says what changes each)."""

    rank: int
    seen: bool = False  # said HELLO to this server process and was welcomed: it takes part
    ready: bool = False  # said READY: its parties' claims are taken
    process: str | None = None  # the worker process that said HELLO last (a restarted one has another)
    welcomed_at: float | None = None  # when it was last sent WELCOME (monotonic)
    rejoin_asked_at: float | None = None  # when it was last asked to say HELLO (REJOIN)
    gone: bool = False  # said BYE, ERROR or REFUSE in the run: missing until it says HELLO again
    data_refused: str | None = None  # why it refused its own data before the run started, until READY
    heard_at: float | None = None  # when a message of it was last handled here (monotonic)
    work: tuple[str, dict] | None = None  # its work of the current phase: (message type, fields)
    owed: int = 0  # the messages it owes in this phase (its large frames' allowance: transport/budget.py)
    resent: set[tuple[int, str]] = field(default_factory=set)  # (round, phase) whose work went out again
    restarted: bool = False  # a new process said HELLO in the run: its work goes out again at its READY
    announced: bool = False  # its "is ready" line was logged
    took_part: int = 0  # rounds aggregated with its parties' answers
    refused: int = 0  # its messages refused


class Sites(dict[int, Site]):
    """rank -> its `Site`, for this run's workers."""

    @classmethod
    def of(cls, ranks: Iterable[int]) -> Sites:
        return cls({rank: Site(rank) for rank in ranks})

    def seen(self) -> set[int]:
        return {rank for rank, site in self.items() if site.seen}

    def gone(self) -> set[int]:
        return {rank for rank, site in self.items() if site.gone}

    def ready(self) -> set[int]:
        return {rank for rank, site in self.items() if site.ready}

    def refused_data(self, rank: int, why: str, started: bool) -> None:
        """A REFUSE: before the run, the rank is as if it never said HELLO; in the run, it is gone.
        Its limits stay (module docstring)."""
        site = self[rank]
        if started:
            site.gone = True
            return
        site.seen = site.ready = False
        site.process = None
        site.data_refused = why


class HeardAt(MutableMapping):
    """rank -> when a message of it was last handled (`Site.heard_at`), as the manager's base class
    keeps its peers' liveness (`distributed.managers`): the ranks never heard are not in it."""

    def __init__(self, sites: Sites) -> None:
        self.sites = sites

    def __getitem__(self, rank: int) -> float:
        site = self.sites.get(rank)
        if site is None or site.heard_at is None:
            raise KeyError(rank)
        return site.heard_at

    def __setitem__(self, rank: int, when: float) -> None:
        self.sites[rank].heard_at = when

    def __delitem__(self, rank: int) -> None:
        self[rank]  # noqa: B018 (a KeyError for a rank never heard)
        self.sites[rank].heard_at = None

    def __iter__(self) -> Iterator[int]:
        return iter([rank for rank, site in self.sites.items() if site.heard_at is not None])

    def __len__(self) -> int:
        return sum(1 for site in self.sites.values() if site.heard_at is not None)


@dataclass(frozen=True)
class RunSettings:
    """What the server's run is, fixed at its start: where each party is (`placement`: party -> rank),
    its workers' ranks, the settings it hands every worker (`config`: `deploy.shared_config`), its
    comm_args, how long a phase waits (`deadline_s`), its checkpoints (`checkpoint_every`, the whole
    config they record), the first round of this server process and the round its workers resume
    from, whether its sums are secure (`privacy_args.secure_aggregation`), and the run's identity
    (`run`, named in every WELCOME: `distributed/run_identity.py`)."""

    placement: dict[int, int]
    workers: list[int]
    config: dict
    comm: Any
    checkpoint_every: int = 0
    full_config: dict = field(default_factory=dict)
    start: int = 0
    secure: bool = False
    run: str | None = None

    @property
    def deadline_s(self) -> float:
        return self.comm.round_timeout_s or self.comm.timeout_s

    @property
    def resume_from(self) -> int | None:
        return self.start - 1 if self.start > 0 else None


@dataclass
class RoundState:
    """The round in progress: its phase, the ranks it waits for, what came in, what was done."""

    start: int = 0  # the first round of this server process (a resumed run's next round)
    round_idx: int = -1
    phase: str = "hello"
    pending: set[int] = field(default_factory=set)  # the ranks the phase waits for
    phase_started: float = field(default_factory=time.monotonic)
    last_wait_log: float = field(default_factory=time.monotonic)
    results: dict[int, Any] = field(default_factory=dict)  # party -> (weight, upload)
    reports: dict[int, Any] = field(default_factory=dict)  # party -> its evaluation report
    new_reports: dict[int, Any] = field(default_factory=dict)  # the new test's (federated, personalised)
    evaluating: set[int] = field(default_factory=set)  # the parties that report in this evaluated round
    ordered: list = field(default_factory=list)  # the round's uploads as aggregated
    missing: list[int] = field(default_factory=list)  # the round's parties left out
    offered: dict[int, dict] = field(default_factory=dict)  # party -> its claim, before the run fixes them
    aggregated: int = -1  # the last round aggregated: never twice
    recorded: int = -1  # the last round recorded: never twice
    last_checkpoint: int | None = None
    doing: str = "starting"  # what the round's progress is doing now, for a failure's message


@dataclass
class SecureState:
    """A secure sum in progress (distributed/server/secure.py): what its parties sent at each step.
    `job` is what the sum is of (a round's uploads, a buffer's, the parties' test counts)."""

    job: Any = None
    keys: dict[int, dict] = field(default_factory=dict)
    shares: dict[int, dict[int, bytes]] = field(default_factory=dict)
    masked: dict[int, Any] = field(default_factory=dict)
    accused: dict[int, list[int]] = field(default_factory=dict)
    answers: dict[int, dict] = field(default_factory=dict)
    session: Any = None  # privacy.secagg.ServerSession
    rosters: dict[int, dict] = field(default_factory=dict)
    holds: dict[int, set[int]] = field(default_factory=dict)  # rank -> its parties in this step
    plan: Any = None  # the layout's plan (privacy.party.Plan)
    entries: list = field(default_factory=list)  # the summed layout (privacy.party.plan_layout)


@dataclass
class Cut:
    """A buffered run's checkpoint being taken: its round, the server's state at the cut and its tasks
    in flight (by party: the very task, not its version: a fast party may get a second task of one
    version), the silos that still owe their CHECKPOINTED, and the updates that arrived from a silo
    before it answered (per message, in arrival order: [party, upload])."""

    round: int
    state: dict[str, Any]
    jobs: dict[int, Any]
    awaiting: set[int]
    started: float = field(default_factory=time.monotonic)
    held: list[list[list[Any]]] = field(default_factory=list)
    asked_again: set[int] = field(default_factory=set)  # ranks sent its CHECKPOINT again (once each)


@dataclass
class BufferState:
    """A buffered run's (distributed/server/buffered.py): the tasks outstanding at each silo, what was
    sent again, the instant being taken on the clock, the checkpoint being taken."""

    tasks: dict[int, dict[int, int]] = field(default_factory=dict)  # rank -> {party: start version}
    resent_versions: set[tuple[int, int]] = field(default_factory=set)  # (rank, version) sent again once
    instant: list[int] | None = None  # on the clock: the parties of the instant being taken
    taking: bool = False  # take_arrived is running: a round closed within it goes on there
    extra: dict[str, Any] = field(default_factory=dict)  # the applied buffer's record fields
    cut: Cut | None = None
    cut_due: bool = False


@dataclass
class ServerState:
    """Everything the server knows of its run; the manager hands it to every phase."""

    sites: Sites
    round: RoundState
    secure: SecureState = field(default_factory=SecureState)
    buffer: BufferState = field(default_factory=BufferState)
