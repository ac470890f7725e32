"""The cost of secure aggregation (SecAgg, Bonawitz et al. CCS 2017; SecAgg+, Bell et al. CCS 2020) as
the number of parties grows: `fedml_moon.privacy.secagg` run in process, one round per size.

For each n, n parties with random float vectors of `--length` values run one round (complete graph by
default, SecAgg+ with `--neighbours k`); a fraction `--drop` of them (10% by default) drop after sharing
their keys, before masking, so the server rebuilds their s-seeds and removes their pairwise masks. The
threshold t is a majority of each party's neighbourhood + itself unless `--threshold` is given (it must
be more than half of it). A round whose dropouts split the survivors' subgraph of the round's random
graph (or leave fewer than 3) is refused, as the protocol refuses it, and printed as such. Printed
per n:
  - server_unmask_s: the server's unmasking time, collect_masked + unmask + decode (wall clock);
  - party_mask_s: one party's mask() (decrypting its shares, expanding and adding its masks), mean;
  - bytes sent by one party in each step (mean over the parties that took it; payload only, no framing):
    advertise (3 x 32-byte keys), share (its AES-GCM ciphertexts), masked (its packed vector),
    unmask (its shares, 24 bytes each: x in 8, y in 16);
  - max_err: the largest error of the decoded sum against the exact one, and the stated bound.
Torch runs on `--threads` threads (1 by default; the rest is single-threaded: AES, numpy, Python).
Last line: the growth rate of the server's unmasking time, the slope of log time against log n fitted
over the sizes given.

Run: .venv/bin/python benchmarks/secagg_unmask.py [--parties 10 50 100] [--length 100000]
     [--neighbours 0] [--drop 0.1] [--threshold T] [--threads 1]
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np
import torch

from fedml_moon.privacy.secagg import (
    PartySession,
    SecAggError,
    SecAggParams,
    ServerSession,
    neighbourhood_size,
    pack,
)

SHARE_BYTES = 24


def _threshold(n: int, k: int, given: int | None) -> int:
    if given is not None:
        return given
    return neighbourhood_size(n, k) // 2 + 1


def one_round(n: int, length: int, k: int, drop: float, threshold: int | None) -> dict:
    """One round with n parties; the timings, the bytes per party and step, and the error."""
    params = SecAggParams(threshold=_threshold(n, k, threshold), neighbours=k)
    parties = {u: PartySession(u, 0, params) for u in range(n)}
    server = ServerSession(0, params, length)
    gen = torch.Generator().manual_seed(n)
    inputs = {u: torch.randn(length, generator=gen) for u in range(n)}
    gone = set(random.Random(n).sample(range(n), round(drop * n)))

    keys = {u: p.advertise() for u, p in parties.items()}
    rosters, digests = server.collect_keys(keys)
    shares = {u: p.share(rosters[u], digests) for u, p in parties.items()}
    inboxes = server.route(shares)
    masked, mask_s = {}, []
    for u in sorted(set(inboxes) - gone):
        start = time.perf_counter()
        masked[u] = parties[u].mask(inputs[u], inboxes[u])
        mask_s.append(time.perf_counter() - start)
    wire = {u: pack(y, params.encoding.k) for u, y in masked.items()}

    start = time.perf_counter()
    try:
        survivors, _ = server.collect_masked(masked)
    except SecAggError as err:
        return {"n": n, "t": params.threshold, "dropped": len(gone), "refused": str(err)}
    ask = server.unmask_request()
    server_s = time.perf_counter() - start
    responses = {u: parties[u].unmask(*ask) for u in survivors}
    start = time.perf_counter()
    decoded = server.decode(server.unmask(responses))
    server_s += time.perf_counter() - start

    exact = sum(inputs[u].double().clamp(-8, 8) for u in survivors)
    return {
        "n": n,
        "t": params.threshold,
        "dropped": len(gone),
        "server_s": server_s,
        "mask_s": float(np.mean(mask_s)),
        **_bytes_sent(keys, shares, wire, responses),
        "err": float((decoded - exact).abs().max()),
        "bound": params.encoding.error_bound(len(survivors)),
    }


def _bytes_sent(keys: dict, shares: dict, wire: dict, responses: dict) -> dict[str, float]:
    """Mean payload bytes one party sends in each step."""
    return {
        "advertise": float(np.mean([sum(len(v) for v in d.values()) for d in keys.values()])),
        "share": float(np.mean([sum(len(c) for c in out.values()) for out in shares.values()])),
        "masked": float(np.mean([w.numel() * w.element_size() for w in wire.values()])),
        "unmask": float(np.mean([SHARE_BYTES * (len(r["b"]) + len(r["s"])) for r in responses.values()])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parties", type=int, nargs="+", default=[10, 50, 100])
    parser.add_argument("--length", type=int, default=100_000)
    parser.add_argument("--neighbours", type=int, default=0, help="SecAgg+ degree k; 0: complete graph")
    parser.add_argument("--drop", type=float, default=0.1, help="fraction dropped after sharing keys")
    parser.add_argument(
        "--threshold", type=int, default=None, help="t; default a majority of a neighbourhood"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    graph = "complete graph (SecAgg)" if args.neighbours == 0 else f"SecAgg+ with k={args.neighbours}"
    print(f"secagg unmask: length={args.length}, {graph}, drop={args.drop:.0%} after sharing, k_bits=32")
    print(
        f"{'parties':>7} {'t':>4} {'dropped':>7} {'server_unmask_s':>15} {'party_mask_s':>12} "
        f"{'B_advertise':>11} {'B_share':>8} {'B_masked':>9} {'B_unmask':>8}  max_err / bound"
    )
    rows = []
    for n in args.parties:
        try:
            r = one_round(n, args.length, args.neighbours, args.drop, args.threshold)
        except SecAggError as err:  # a threshold or size below the crowd rules
            r = {
                "n": n,
                "t": _threshold(n, args.neighbours, args.threshold),
                "dropped": 0,
                "refused": str(err),
            }
        if "refused" in r:
            print(f"{r['n']:>7} {r['t']:>4} {r['dropped']:>7}  refused: {r['refused']}")
            continue
        rows.append(r)
        print(
            f"{r['n']:>7} {r['t']:>4} {r['dropped']:>7} {r['server_s']:>15.3f} {r['mask_s']:>12.4f} "
            f"{r['advertise']:>11.0f} {r['share']:>8.0f} {r['masked']:>9.0f} {r['unmask']:>8.0f}  "
            f"{r['err']:.2e} / {r['bound']:.2e}"
        )
    if len(rows) >= 2:
        slope = np.polyfit(np.log([r["n"] for r in rows]), np.log([r["server_s"] for r in rows]), 1)[0]
        sizes = ", ".join(str(r["n"]) for r in rows)
        print(f"server unmasking time grows as n^{slope:.2f} (log-log slope over n = {sizes})")


if __name__ == "__main__":
    main()
