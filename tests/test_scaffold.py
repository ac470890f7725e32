"""SCAFFOLD: control-variate bookkeeping, the bias correction on a quadratic toy problem, payloads."""

import pytest
import torch
from torch import nn

from fedml_moon.algorithms.base import Context, PartyRound, ServerAlgorithm
from fedml_moon.algorithms.baselines import FedAvgClient
from fedml_moon.algorithms.scaffold import ScaffoldClient, ScaffoldOptions, ScaffoldServer
from fedml_moon.config.schema import ConfigError, ServerArgs
from fedml_moon.core.aggregation import clone_state, payload_nbytes
from fedml_moon.engine.batched import train_party
from tests.support.tiny import tiny_batches, tiny_factory, train_args

CPU = torch.device("cpu")
A = (1.0, 3.0, 6.0)  # f_i(w) = a_i / 2 (w - b_i)^2, heterogeneous curvature
B = (2.0, -1.0, 0.5)
W_STAR = sum(a * b for a, b in zip(A, B, strict=True)) / sum(A)  # argmin of sum_i f_i
LR, K = 0.1, 5


class Toy(nn.Module):
    """One trainable scalar, plus a frozen parameter and a buffer that control variates must skip."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1, dtype=torch.float64))
        self.frozen = nn.Parameter(torch.ones(2, dtype=torch.float64), requires_grad=False)
        self.register_buffer("count", torch.zeros(3, dtype=torch.float64))


class Quadratic:
    """Replaces the CE loss by the party's f_i: party p's context carries (a_p, b_p) = (A[p], B[p])."""

    def context(self, r: PartyRound) -> Context:
        ctx = super().context(r)
        ctx.party["coef"] = torch.tensor([A[r.party], B[r.party]], dtype=torch.float64)
        return ctx

    def loss(self, net, x, y, ctx):
        a, b = ctx["coef"]
        loss = 0.5 * a * (net.params["w"] - b).pow(2).sum()
        return loss, {}


class QuadScaffold(Quadratic, ScaffoldClient):
    pass


class QuadFedAvg(Quadratic, FedAvgClient):
    pass


def toy_args(**kw):
    base = dict(learning_rate=LR, momentum=0.0, weight_decay=0.0, client_num_in_total=3)
    base.update(kw)
    return train_args(**base)


def dummy_loader(steps=K):
    """`steps` full-batch gradient steps per epoch: the loss ignores the data."""
    return [(torch.zeros(1), torch.zeros(1))] * steps


def simulate(client, server, schedule, check=None, state=None, parties=None):
    """Rounds of the quadratic problem, equal weights; returns (global state, per-party states)."""
    state = clone_state(Toy().state_dict()) if state is None else state
    parties = {p: {} for p in range(3)} if parties is None else parties
    for r, sampled in enumerate(schedule):
        before = {p: parties[p].get("c") for p in parties}
        uploads = []
        for p in sampled:
            _, upload = train_party(
                client, Toy(), server.download(state, p), parties[p], dummy_loader(), CPU, r, p
            )
            uploads.append((1.0, upload))
        state = server.aggregate(state, uploads)
        for p in set(parties) - set(sampled):
            assert parties[p].get("c") is before[p]  # not sampled: c_i untouched
        if check is not None:
            check(server, parties)
    return state, parties


def scaffold_pair(correction="after-step", server_lr=1.0, c_update="paper", **kw):
    opts = ScaffoldOptions(correction=correction, c_update=c_update)
    args = toy_args(**kw)
    return QuadScaffold(opts, args, Toy, seed=0), ScaffoldServer(opts, ServerArgs(server_lr=server_lr), args)


def assert_c_is_mean_of_c_i(server, parties):
    c_i = [s["c"]["w"] if "c" in s else torch.zeros(1, dtype=torch.float64) for s in parties.values()]
    torch.testing.assert_close(server.c["w"], sum(c_i) / 3, rtol=0, atol=1e-12)


def test_server_c_is_mean_of_party_c_under_full_participation():
    simulate(*scaffold_pair(), [[0, 1, 2]] * 6, check=assert_c_is_mean_of_c_i)


def test_server_c_is_mean_of_party_c_under_partial_participation():
    schedule = [[1], [0, 2], [2], [0, 1], [1, 2], [0], [2, 0]]
    _, parties = simulate(*scaffold_pair(), schedule, check=assert_c_is_mean_of_c_i)
    assert all("c" in s for s in parties.values())


def test_scaffold_removes_the_client_drift_fedavg_keeps():
    rounds = [[0, 1, 2]] * 60
    state, _ = simulate(*scaffold_pair(), rounds)
    assert abs(state["w"].item() - W_STAR) < 1e-4
    fedavg_server = ServerAlgorithm(None, ServerArgs(), toy_args())
    fed_state, _ = simulate(QuadFedAvg(None, toy_args(), Toy, seed=0), fedavg_server, rounds)
    assert abs(fed_state["w"].item() - W_STAR) > 1e-3  # FedAvg's fixed point is biased
    assert state["count"].equal(torch.zeros(3, dtype=torch.float64))  # buffers are only averaged


def hand_path(p, w, corr):
    """Plain SGD on f_p from w with the constant correction c - c_i; returns (end point, gradients)."""
    grads = []
    for _ in range(K):
        grads.append(A[p] * (w - B[p]))
        w -= LR * (grads[-1] + corr)
    return w, grads


def test_c_i_is_mean_gradient_along_the_local_path():
    """Option II with plain SGD: c_i+ = c_i - c + (c - c_i + mean_k g_k) = mean_k g_k, every round."""
    client, server = scaffold_pair()
    state, parties = simulate(client, server, [[0, 1, 2]])
    ends = []
    for p in range(3):  # round 1: c = c_i = 0, no correction
        _, grads = hand_path(p, 0.0, 0.0)
        assert parties[p]["c"]["w"].item() == pytest.approx(sum(grads) / K, abs=1e-12)
    w1, c1 = state["w"].item(), server.c["w"].item()
    c_i1 = [parties[p]["c"]["w"].item() for p in range(3)]
    state, parties = simulate(client, server, [[0, 1, 2]], state=state, parties=parties)
    for p in range(3):  # round 2: corrected path from w^1
        end, grads = hand_path(p, w1, c1 - c_i1[p])
        assert parties[p]["c"]["w"].item() == pytest.approx(sum(grads) / K, abs=1e-12)
        ends.append(end)
    assert state["w"].item() == pytest.approx(sum(ends) / 3, abs=1e-12)


def test_payload_fields_keys_and_size():
    client, server = scaffold_pair()
    assert server.download(clone_state(Toy().state_dict()))["c"] == {}  # zeros before any aggregation
    model, state = Toy(), {}
    start = clone_state(model.state_dict())
    _, upload = train_party(client, model, server.download(start), state, dummy_loader(), CPU, 0, 2)
    assert set(upload) == {"model", "delta_c", "party_id"} and upload["party_id"] == 2
    assert set(upload["delta_c"]) == {"w"} and set(state["c"]) == {"w"}  # not "frozen", not "count"
    server.aggregate(start, [(1.0, upload)])
    down = server.download(start, 0)
    assert set(down) == {"model", "c"} and set(down["c"]) == {"w"}
    torch.testing.assert_close(down["c"]["w"], upload["delta_c"]["w"] / 3)

    factory = tiny_factory()
    mlp_client = ScaffoldClient(ScaffoldOptions(), train_args(), factory, seed=0)
    torch.manual_seed(0)
    model = factory()
    model.classifier.bias.requires_grad_(False)
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    start = {"model": clone_state(model.state_dict())}
    ups = []
    for client in (mlp_client, FedAvgClient(None, train_args(), factory, seed=0)):
        ups.append(train_party(client, model, start, {}, tiny_batches(2), CPU, 0, 0)[1])
    assert set(ups[0]["delta_c"]) == names and "classifier.bias" not in names
    fedavg_bytes = payload_nbytes(ups[1])
    assert payload_nbytes(ups[0]) == 2 * fedavg_bytes - 3 * 4  # twice FedAvg's, less the frozen bias


def test_gradient_and_after_step_agree_without_momentum_or_weight_decay():
    finals = {}
    for correction in ("gradient", "after-step"):
        state, parties = simulate(*scaffold_pair(correction), [[0, 1, 2], [0, 2], [1, 2, 0]])
        finals[correction] = (state["w"], [parties[p]["c"]["w"] for p in range(3)])
    torch.testing.assert_close(finals["gradient"], finals["after-step"], rtol=0, atol=1e-12)
    moved = [
        simulate(*scaffold_pair(c, momentum=0.9), [[0, 1, 2]] * 2)[0]["w"] for c in ("gradient", "after-step")
    ]
    assert abs((moved[0] - moved[1]).item()) > 1e-6  # with momentum the choice matters


def test_server_lr_is_eta_g_and_scales_the_averaged_step():
    client, server = scaffold_pair(server_lr=0.5)
    _, plain = scaffold_pair()
    start = clone_state(Toy().state_dict())
    uploads = []
    for p in range(3):
        uploads.append(
            (1.0, train_party(client, Toy(), server.download(start), {}, dummy_loader(), CPU, 0, p)[1])
        )
    avg = plain.aggregate(start, uploads)
    half = server.aggregate(start, uploads)
    torch.testing.assert_close(half["w"], 0.5 * avg["w"])  # start is w = 0
    torch.testing.assert_close(half["frozen"], avg["frozen"])
    torch.testing.assert_close(server.c["w"], plain.c["w"])


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("correction", "before-step", "choose one of after-step, gradient"),
        ("c_update", "sum", "choose one of paper, mean"),
    ],
)
def test_options_validation(field, value, message):
    ScaffoldOptions().check()
    with pytest.raises(ConfigError, match=f"algorithm_args.{field}: {message}"):
        ScaffoldOptions(**{field: value}).check()


def test_c_update_mean_is_the_authors_variant():
    """With 1 of 3 parties sampled, "mean" moves c by delta c_i, "paper" by delta c_i / 3."""
    start = clone_state(Toy().state_dict())
    moved = {}
    for mode in ("paper", "mean"):
        client, server = scaffold_pair(c_update=mode)
        _, upload = train_party(client, Toy(), server.download(start), {}, dummy_loader(), CPU, 0, 0)
        server.aggregate(start, [(1.0, upload)])
        moved[mode] = server.c["w"]
    torch.testing.assert_close(moved["mean"], 3 * moved["paper"])
