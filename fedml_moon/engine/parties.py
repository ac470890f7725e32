"""The parties one process trains and evaluates: every party in the standalone loop, a worker's or
silo's own in the distributed modes. It drives the FedML adapter's trainer (`PluginClientTrainer`)
through FedML's ClientTrainer calls, so it needs no `fedml` import itself."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from fedml_moon.algorithms.base import Payload
from fedml_moon.core.checkpoint import Pieces
from fedml_moon.data.loader import FedMLDataset
from fedml_moon.errors import ConfigError

if TYPE_CHECKING:
    from fedml_moon.adapters.trainer import PluginClientTrainer

log = logging.getLogger(__name__)


class PartyRunner:
    """The parties one process trains and evaluates, through FedML's ClientTrainer calls: the
    standalone loop holds every party, a distributed worker or silo only its own."""

    def __init__(
        self,
        trainer: PluginClientTrainer,
        dataset: FedMLDataset,
        device: torch.device,
        args: Any,
        parallel: int = 1,
    ) -> None:
        self.num_local = dataset.train_data_local_num_dict
        self.train_local, self.test_local = dataset.train_data_local_dict, dataset.test_data_local_dict
        self.trainer, self.device, self.args = trainer, device, args
        self.parallel = parallel  # train_args.parties_in_parallel, resolved
        self._said_batched = False
        self.trained: set[int] = set()  # parties whose state or random stream moved: what checkpoints hold

    def train_many(self, tasks: list[tuple[int, Payload]], round_idx: int) -> list[tuple[float, Payload]]:
        """Local rounds of (party, download) tasks, `parallel` parties at a time; in task order. A chunk
        that runs out of device memory is trained again in halves (and `parallel` stays halved)."""
        prefetch = getattr(self.trainer.store, "prefetch", None)
        if prefetch is not None:  # a disk store reads the next parties' states while one trains
            prefetch([int(p) for p, _ in tasks])
        if self.parallel <= 1 or len(tasks) <= 1:
            return [self.train(party, download, round_idx) for party, download in tasks]
        out: list[tuple[float, Payload]] = []
        while len(out) < len(tasks):
            chunk = tasks[len(out) : len(out) + self.parallel]
            uploads = self._train_chunk(chunk, round_idx)
            if uploads is not None:
                out += [(float(self.num_local[p]), u) for (p, _), u in zip(chunk, uploads, strict=True)]
        return out

    def _train_chunk(self, chunk: list[tuple[int, Payload]], round_idx: int) -> list[Payload] | None:
        """The chunk's uploads, trained together; None after an out-of-memory error, with the chunk's
        random streams put back (nothing reached the party store: states are stored after training)."""
        loaders = [self.train_local[p] for p, _ in chunk]
        generators = [g for g in (getattr(loader, "generator", None) for loader in loaders) if g is not None]
        streams = [g.get_state() for g in generators]
        try:
            uploads = self.trainer.train_many(loaders, [d for _, d in chunk], self.device, round_idx)
        except torch.OutOfMemoryError:
            if len(chunk) == 1:
                raise
            for generator, stream in zip(generators, streams, strict=True):
                generator.set_state(stream)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            self.parallel = len(chunk) // 2
            log.warning(
                "round %d: parties %s ran out of memory on %s trained together; training %d at a time "
                "from now on (train_args.parties_in_parallel)",
                round_idx,
                [p for p, _ in chunk],
                self.device,
                self.parallel,
            )
            return None
        self.trained.update(int(p) for p, _ in chunk)
        if not self._said_batched and len(chunk) > 1:
            log.info("round %d: %d parties trained together (batched)", round_idx, len(chunk))
            self._said_batched = True
        return uploads

    def train(self, party: int, download: Payload, round_idx: int) -> tuple[float, Payload]:
        """One party's local round; returns (number of samples, upload)."""
        trainer, data = self.trainer, self.train_local[party]
        self.args.round_idx = round_idx
        trainer.set_model_params(download)
        trainer.update_dataset(data, self.test_local[party], self.num_local[party])
        trainer.on_before_local_training(data, self.device, self.args)
        trainer.train(data, self.device, self.args)
        trainer.on_after_local_training(data, self.device, self.args)
        self.trained.add(int(party))
        return float(self.num_local[party]), trainer.get_model_params()

    def state(self, parties: list[int]) -> dict[int, dict]:
        """Each party's stored state and its loader's random stream, for checkpoints."""
        store = self.trainer.store
        return {p: {"state": store.get(p), "rng": self.train_local[p].generator.get_state()} for p in parties}

    def state_pieces(self, parties: list[int]) -> Pieces:
        """`state()` of those of `parties` that have trained (or were restored) as a checkpoint part
        written one party at a time (a disk store's parties are then never all in memory). A party
        that never trained has its initial state, which a resumed run makes again: a checkpoint's
        size grows with the parties sampled so far, not with the parties that exist."""
        kept = [p for p in parties if int(p) in self.trained]
        return Pieces({str(p): lambda p=p: self.state([p])[p] for p in kept})

    def load_state(self, states: Mapping[Any, dict]) -> None:
        """Restore `state()`: the store holds exactly the checkpoint's states, and a party that is not
        in the checkpoint (it trained after it, in this process or in one that was killed and left
        its state in a disk store) is back at its start, no state and its first random stream, as
        it was when the checkpoint was written (`{}`: every party back at its start)."""
        saved_parties = {int(p) for p in states}
        forget = getattr(self.train_local, "forget", None)
        for party in sorted(self.trained - saved_parties):
            if forget is not None:
                forget(party)
        # a disk store may hold states a killed process wrote after the checkpoint: gone too
        for party in sorted((self.trained | set(self.trainer.store.parties())) - saved_parties):
            self.trainer.store.drop(party)
        self.trained = set(saved_parties)
        for party, saved in states.items():
            party = int(party)
            if saved["state"]:
                self.trainer.store.put(party, dict(saved["state"]))
            else:
                self.trainer.store.drop(party)
            generator = self.train_local[party].generator
            try:
                generator.set_state(saved["rng"])
            except RuntimeError:
                raise ConfigError(
                    f"device_args: party {party}'s data stream in this checkpoint was drawn on another kind "
                    f"of device than this run's {generator.device.type} (a GPU run draws on the GPU); resume "
                    "on the kind of device the run was checkpointed on (device_args.using_gpu)"
                ) from None

    def evaluate(self, party: int, download: Payload) -> Payload:
        """The party's report on an evaluation round (see PluginClientTrainer.evaluate_party)."""
        return self.trainer.evaluate_party(party, self.test_local[party], download, self.device)
