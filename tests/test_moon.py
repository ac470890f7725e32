"""MOON's party side: the pool, teachers, first-round and unseen-party behaviour, per-party state."""

import math

import pytest
import torch

from fedml_moon.algorithms.base import PartyRound
from fedml_moon.algorithms.baselines import FedAvgClient
from fedml_moon.algorithms.moon import MoonClient, MoonOptions, push_pool
from fedml_moon.core.aggregation import clone_state
from fedml_moon.core.state import PartyStore
from fedml_moon.engine.batched import train_party
from fedml_moon.engine.local import ModuleNet
from tests.support.tiny import tiny_batches, tiny_factory, train_args


def make_moon(**opts):
    return MoonClient(MoonOptions(**opts), train_args(), tiny_factory(), seed=0)


def states_equal(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_push_pool_is_fifo(k):
    pool = []
    for item in range(9):
        pool = push_pool(pool, item, k)
    assert pool == list(range(9))[-k:]


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_party_pool_holds_its_last_k_trained_models(k):
    client = make_moon(pool_size=k)
    model = tiny_factory()()
    state, trained = {}, []
    received = {"model": clone_state(model.state_dict())}
    for r in range(7):
        train_party(client, model, received, state, tiny_batches(seed=r), torch.device("cpu"), r, 0)
        trained.append(clone_state(model.state_dict()))
    assert len(state["pool"]) == min(k, 7)
    for got, want in zip(state["pool"], trained[-k:], strict=True):
        assert states_equal(got, want)


def test_round_zero_has_no_contrastive_term():
    client = make_moon()
    model = tiny_factory()()
    metrics, _ = train_party(
        client,
        model,
        {"model": clone_state(model.state_dict())},
        {},
        tiny_batches(),
        torch.device("cpu"),
        0,
        0,
    )
    assert metrics["l_con"] == 0.0


def test_unseen_party_with_global_prev_gives_log2():
    client = make_moon(unseen_party_prev="global", mu=0.0)
    model = tiny_factory()()
    metrics, _ = train_party(
        client,
        model,
        {"model": clone_state(model.state_dict())},
        {},
        tiny_batches(),
        torch.device("cpu"),
        3,
        4,
    )
    assert metrics["l_con"] == pytest.approx(math.log(2), abs=1e-6)


def test_unseen_party_own_init_is_reproducible_and_per_party():
    client = make_moon()
    a, b, c = client.initial_model(1), client.initial_model(1), client.initial_model(2)
    assert states_equal(a, b) and not states_equal(a, c)
    prev = client.previous_models({}, {"model": None}, round_idx=2, party_id=1)
    assert len(prev) == 1 and states_equal(prev[0], a)


def test_mu_zero_trains_exactly_like_fedavg():
    factory = tiny_factory()
    torch.manual_seed(1)
    start = clone_state(factory().state_dict())
    models = []
    for client in (make_moon(mu=0.0), FedAvgClient(None, train_args(), factory, seed=0)):
        model = factory()
        train_party(
            client, model, {"model": start}, {"pool": [start]}, tiny_batches(), torch.device("cpu"), 1, 0
        )
        models.append(model.state_dict())
    assert states_equal(*models)


def test_teachers_are_frozen_eval_and_get_no_gradient():
    """The teachers (the global model and the pool's) are the engine's now (`net.frozen`): eval-mode
    copies whose parameters take no gradient, and their outputs carry none back to the party's
    model; the context's state dicts stay untouched by backward."""
    client = make_moon(mu=5.0)
    model = tiny_factory()()
    start = clone_state(model.state_dict())
    trainable = tuple(n for n, p in model.named_parameters() if p.requires_grad)
    # a pool entry distinct from the global model's state: two teachers, as before
    r = PartyRound({"model": start}, {"pool": [clone_state(start)]}, 1, 0, trainable)
    ctx = client.context(r)
    model.load_state_dict(ctx.start)
    net = ModuleNet(model)
    outputs, frozen = [], net.frozen

    def recorded(state, x):
        outputs.append(frozen(state, x))
        return outputs[-1]

    net.frozen = recorded
    x, y = tiny_batches(1)[0]
    loss, terms = client.loss(net, x, y, {**ctx.shared, **ctx.party})
    loss.backward()
    teachers = [t for _, t in net._teachers.values()]
    assert len(teachers) == 2 and len(outputs) == 2
    for t in teachers:
        assert not t.training
        assert all(not p.requires_grad and p.grad is None for p in t.parameters())
    assert all(not out.z.requires_grad for out in outputs)
    for state in (ctx.shared["global"], *ctx.party["prev"]):
        assert all(not v.requires_grad and v.grad is None for v in state.values())
    assert all(p.grad is not None for p in model.parameters())
    assert terms["l_con"].item() == pytest.approx(math.log(2), abs=1e-5)  # z == z_glob == z_prev at start


def test_state_follows_party_under_sampling():
    client = make_moon(pool_size=2)
    store = PartyStore()
    model = tiny_factory()()
    received = {"model": clone_state(model.state_dict())}
    schedule = [[0, 2], [1, 2], [0, 1], [2]]
    trained = {p: [] for p in range(3)}
    for r, parties in enumerate(schedule):
        for p in parties:
            state = store.get(p)
            train_party(
                client, model, received, state, tiny_batches(seed=10 * r + p), torch.device("cpu"), r, p
            )
            store.put(p, state)
            trained[p].append(clone_state(model.state_dict()))
    for p in range(3):
        pool = store.get(p)["pool"]
        assert len(pool) == len(trained[p][-2:])
        assert all(states_equal(a, b) for a, b in zip(pool, trained[p][-2:], strict=True))


def _trained_pool(client, rounds_trained):
    """Train party 0 in the given rounds; returns its state and the model after each of those rounds."""
    model, state, after = tiny_factory()(), {}, {}
    received = {"model": clone_state(model.state_dict())}
    for r in rounds_trained:
        train_party(client, model, received, state, tiny_batches(seed=r), torch.device("cpu"), r, 0)
        after[r] = clone_state(model.state_dict())
    return state, after, received


def _same_list(got, want):
    return len(got) == len(want) and all(states_equal(g, w) for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize("pool_update", ["trained", "every-round"])
def test_pool_rules_agree_under_full_participation(pool_update):
    client = make_moon(pool_size=2, pool_update=pool_update)
    state, after, received = _trained_pool(client, [0, 1, 2])
    assert state["pool_rounds"] == [1, 2]
    assert _same_list(client.previous_models(state, received, 3, 0), [after[1], after[2]])


def test_every_round_pool_repeats_the_model_of_rounds_the_party_sat_out():
    """The authors' rule: after each round every party's current model enters the pool."""
    every = make_moon(pool_size=3, pool_update="every-round")
    state, after, received = _trained_pool(every, [1, 3])
    # round 5 looks at the ends of rounds 2, 3, 4: the party's model was after[1], after[3], after[3]
    assert _same_list(every.previous_models(state, received, 5, 0), [after[1], after[3], after[3]])
    # ours (the default) keeps only the models of rounds it trained
    ours = make_moon(pool_size=3)
    assert _same_list(ours.previous_models(state, received, 5, 0), [after[1], after[3]])
    # round 2 with k = 3: only two rounds lie behind; round 0 saw its initial model
    init = every.initial_model(0)
    assert _same_list(every.previous_models(state, received, 2, 0), [init, after[1]])


def test_every_round_pool_gives_k_negatives_to_an_unseen_party():
    """k equal negatives, all equal to the positive: l_con = log(k + 1) (log 2 with ours)."""
    for pool_update, expected in (("every-round", math.log(3)), ("trained", math.log(2))):
        client = make_moon(pool_size=2, pool_update=pool_update, unseen_party_prev="global", mu=0.0)
        model = tiny_factory()()
        received = {"model": clone_state(model.state_dict())}
        metrics, _ = train_party(client, model, received, {}, tiny_batches(), torch.device("cpu"), 4, 7)
        assert metrics["l_con"] == pytest.approx(expected, abs=1e-6), pool_update
    assert make_moon(pool_update="every-round").previous_models({}, {"model": None}, 0, 0) == []
