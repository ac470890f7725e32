"""One round of SecAgg / SecAgg+ with its parties and server in the test's own process
(`fedml_moon.privacy.secagg`), stepped through its four rounds, and the bound its decoded sum keeps."""

from __future__ import annotations

import torch

from fedml_moon.privacy.secagg import PartySession, SecAggParams, ServerSession

LENGTH = 1000
"""A round's vector length unless the test says otherwise."""


class Round:
    """A small driver: n parties and the server of one round, stepped through the four rounds; what the
    server received is kept (`masked_inputs`, `answers`) for the tests that play a curious server."""

    def __init__(self, n: int, params: SecAggParams, length: int = LENGTH, round_idx: int = 0) -> None:
        self.params, self.length, self.round_idx = params, length, round_idx
        self.parties = {u: PartySession(u, round_idx, params) for u in range(n)}
        self.server = ServerSession(round_idx, params, length)
        g = torch.Generator().manual_seed(round_idx)
        self.inputs = {u: torch.randn(length, generator=g, dtype=torch.float64) * 3 for u in range(n)}
        self.digests: dict[int, bytes] = {}
        self.masked_inputs: dict[int, torch.Tensor] = {}
        self.answers: dict[int, dict] = {}

    def keys(self) -> dict[int, dict]:
        rosters, self.digests = self.server.collect_keys({u: p.advertise() for u, p in self.parties.items()})
        return rosters

    def share(self, skip=()) -> dict[int, dict[int, bytes]]:
        rosters = self.keys()
        return {u: p.share(rosters[u], self.digests) for u, p in self.parties.items() if u not in skip}

    def inboxes(self, skip_share=()) -> dict[int, dict[int, bytes]]:
        return self.server.route(self.share(skip_share))

    def masked(self, skip_share=(), skip_mask=(), inboxes=None) -> dict[int, torch.Tensor]:
        inboxes = self.inboxes(skip_share) if inboxes is None else inboxes
        self.masked_inputs = {
            u: self.parties[u].mask(self.inputs[u], inbox)
            for u, inbox in inboxes.items()
            if u not in skip_mask
        }
        return self.masked_inputs

    def collect(self, skip_share=(), skip_mask=(), inboxes=None) -> tuple[list[int], list[int]]:
        masked = self.masked(skip_share, skip_mask, inboxes)
        accused = {u: self.parties[u].accused for u in masked}
        self.server.collect_masked(masked, accused)
        return self.server.unmask_request()

    def responses(self, skip_share=(), skip_mask=(), silent=(), inboxes=None) -> dict[int, dict]:
        survivors, dropped = self.collect(skip_share, skip_mask, inboxes)
        self.answers = {u: self.parties[u].unmask(survivors, dropped) for u in survivors if u not in silent}
        return self.answers

    def run(self, skip_share=(), skip_mask=(), silent=()) -> torch.Tensor:
        total = self.server.unmask(self.responses(skip_share, skip_mask, silent))
        return self.server.decode(total)

    def exact(self) -> torch.Tensor:
        enc = self.params.encoding
        return sum(self.inputs[u].clamp(-enc.clip, enc.clip) for u in self.server.survivors)


def assert_within_bound(r: Round, decoded: torch.Tensor) -> None:
    """The decoded sum is the sum of the clipped inputs to within n / (2 scale) per element."""
    n, enc = len(r.server.survivors), r.params.encoding
    assert decoded.dtype == torch.float64
    assert enc.error_bound(n) == n / (2 * 2**enc.bits / (2 * enc.clip))
    assert float((decoded - r.exact()).abs().max()) <= enc.error_bound(n)
