"""A silo welcomed by a server: it keeps its folder to the run the WELCOME names (another run's files
moved aside: `distributed/run_identity.py`), builds its data and parties from the run's config the
WELCOME hands it (the first time; its own data checked against what it read earlier in the run), says
READY with its parties' claims to each new server session, and follows that session: one that
resumes from round r restores the silo's checkpoint of round r, one that starts the run anew starts
its parties afresh. A site whose own data cannot be read refuses them (REFUSE, the kind of problem
only) and stops."""

from __future__ import annotations

import logging
import time
from typing import Any

from fedml.core.distributed.communication.message import Message

from fedml_moon.config.files import DIGEST_KEYS, digest_problem, setting_of
from fedml_moon.distributed.managers import READY, REFUSE, config_differences, config_digest
from fedml_moon.distributed.run_identity import enter_run
from fedml_moon.distributed.silo.refusal import DATA_ERRORS, check_digest, described, kind_of
from fedml_moon.engine.resume import check_config, restore
from fedml_moon.errors import ConfigError

log = logging.getLogger(__name__)


class Welcome:
    """A member of the silo's manager (`silo`): what a WELCOME does (module docstring)."""

    def __init__(self, silo: Any) -> None:
        self.silo, self.state = silo, silo.state

    def on_welcome(self, msg: Message) -> None:
        """Build the parties from the server's config (the first time), then follow the server's session:
        a new session that resumes from round r restores this worker's checkpoint of round r."""
        config, digest, session = msg.get("config"), msg.get("config_sha256"), msg.get("session")
        if not isinstance(config, dict) or config_digest(config) != digest:
            raise ValueError("the server's WELCOME carries a config that does not match its SHA-256")
        if msg.get("run") is not None and enter_run(self.silo.folder, msg.get("run"), self.silo.rank):
            self.state.data_recorded = False  # another run's files moved aside: this run binds its data anew
        if self.state.built is None:
            try:
                self.build_from(config)
            except DATA_ERRORS as err:
                self.refuse_data(err)
                return
        elif digest != self.state.digest:
            differs = config_differences(self.state.built.config, config)
            raise ValueError(f"the server's config changed since this worker joined: {', '.join(differs)}")
        self.state.welcomed, self.state.waiting_since = True, time.monotonic()
        if session == self.state.session:
            return  # a repeated WELCOME of the same server
        if self.state.session is not None:
            log.info("rank %d: a new server session (%s) welcomed it", self.silo.rank, session)
        self.state.session = session
        self.send_ready()  # a server process learns what its parties hold once
        resume_from = msg.get("resume_from")
        if resume_from is not None:
            self.restore(int(resume_from))
        elif self.state.trained_since_welcome:  # the server started the run anew: so do its parties
            log.warning(
                "rank %d: the server started the run again from round 0; its parties start afresh",
                self.silo.rank,
            )
            self.silo.runner.load_state({})  # every party back at its start: no state, its first streams
        self.state.trained_since_welcome = False

    def refuse_data(self, err: Exception) -> None:
        """Refuse its own data: the whole reason in its own log, the kind of problem to the server
        (nothing of its paths: `silo/refusal.py`), then stop with status `refused` (exit code 2)."""
        kind, key = kind_of(err)
        self.state.reason = f"it refuses its data: {err}"
        log.error(
            "rank %d refuses its data: %s (the server is told: %s; it waits for this site up to its "
            "comm_args.timeout_s: fix the data and start the site again)",
            self.silo.rank,
            err,
            described(kind, key),
        )
        try:
            self.silo.send(REFUSE, 0, kind=kind, key=key)
        except Exception as send_err:
            log.info("rank %d could not tell the server: %s", self.silo.rank, send_err)
        self.silo.stop("refused")

    def send_ready(self) -> None:
        """Tell the server what each of its parties holds (its claims), once its data are built."""
        claims = [{"party": p, "claim": c} for p, c in sorted(self.state.built.claims.items())]
        self.silo.send(READY, 0, claims=claims)

    def build_from(self, config: dict) -> None:
        self.state.built = self.silo.build(config)
        if self.state.built.data_sha256:  # the same data as in this run's earlier starts, or refused
            check_digest(self.silo.folder, self.state.built.data_sha256, self.silo.local.overwrite)
        self.state.digest = config_digest(self.state.built.config)
        if self.state.digest != config_digest(config):
            differs = config_differences(config, self.state.built.config)
            files = [k for k in differs if k in DIGEST_KEYS]  # its own file under a setting's path
            if files:
                mine, theirs = self.state.built.config.get(files[0]), config.get(files[0])
                path = self.state.built.config.get(setting_of(files[0]))
                raise ConfigError(digest_problem(files[0], mine, theirs, path))
            differ = ", ".join(differs)
            raise ValueError(f"this worker could not take the server's config: {differ} differ")
        log.info(
            "rank %d holds parties %s (config sha256 %s)",
            self.silo.rank,
            self.silo.parties,
            self.state.digest[:12],
        )

    def restore(self, round_idx: int) -> None:
        """Its parties from its checkpoint of `round_idx`, written with the run's shared settings."""
        built = self.state.built
        assert built is not None

        def check(saved: dict) -> None:
            check_config(saved, built.run_config, self.silo.folder, only=built.config)

        restore(self.silo.folder, round_idx, built.holding(), check)
        log.info("rank %d resumed its parties from the checkpoint of round %s", self.silo.rank, round_idx)
