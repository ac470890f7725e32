"""LG-FedAvg invariants: global layers identical across parties after a round, local layers not;
a never-sampled party's local layers untouched; only global layers travel."""

import pytest
import torch

from fedml_moon.algorithms.lg import LGClient, LGOptions, LGServer
from fedml_moon.config.schema import ConfigError, ServerArgs
from fedml_moon.core.aggregation import clone_state, payload_numel
from fedml_moon.core.split import merge_states
from fedml_moon.core.state import PartyStore
from fedml_moon.engine.batched import train_party
from tests.support.tiny import tiny_batches, tiny_factory, train_args

OPTS = LGOptions(split_preset="head")  # head.* and classifier.* global, encoder.* local
CPU = torch.device("cpu")


def run_rounds(schedule, opts=OPTS):
    torch.manual_seed(0)
    client = LGClient(opts, train_args(), tiny_factory(), seed=0)
    server = LGServer(opts, ServerArgs(), train_args())
    state = server.setup(clone_state(tiny_factory()().state_dict()))
    store = PartyStore()
    for r, parties in enumerate(schedule):
        uploads = []
        for p in parties:
            party_state = store.get(p)
            model = tiny_factory()()
            _, upload = train_party(
                client,
                model,
                server.download(state, p),
                party_state,
                tiny_batches(seed=r * 10 + p),
                CPU,
                r,
                p,
            )
            store.put(p, party_state)
            uploads.append((24.0, upload))
        state = server.aggregate(state, uploads)
    return client, server, state, store


def test_global_identical_local_distinct_and_unsampled_untouched():
    client, server, state, store = run_rounds([[0, 1, 2], [0, 1]])
    full = {"model": state}
    models = {p: client.eval_state(full, store.get(p)) for p in range(4)}
    for key in server.global_keys:
        assert all(torch.equal(models[p][key], state[key]) for p in range(4))
    for key in server.local_keys:
        assert not torch.equal(models[0][key], models[1][key])
        assert torch.equal(models[3][key], state[key])  # never sampled: the initial local layers
    assert "local" not in store.get(3)


def test_party_not_sampled_in_a_round_keeps_its_local_layers():
    _, _, _, store_one = run_rounds([[0, 1, 2]])
    _, _, _, store_two = run_rounds([[0, 1, 2], [0, 1]])
    for key, value in store_one.get(2)["local"].items():
        assert torch.equal(store_two.get(2)["local"][key], value)


def test_only_global_layers_travel_after_the_first_contact():
    client, server, state, _ = run_rounds([[0]])
    again = server.download(state, 0)
    assert set(again["model"]) == set(server.global_keys) and "local_init" not in again
    first = server.download(state, 5)
    assert set(first["local_init"]) == set(server.local_keys)
    model = tiny_factory()()
    _, up = train_party(client, model, again, {"local": first["local_init"]}, tiny_batches(), CPU, 1, 0)
    assert set(up["model"]) == set(server.global_keys)
    assert payload_numel(up) < sum(t.numel() for t in state.values())


def test_warmup_rounds_are_fedavg_with_the_full_model():
    opts = LGOptions(split_preset="head", warmup_rounds=1)
    _, server, state, store = run_rounds([[0, 1]], opts)
    assert server.phase == "lg" and "local" not in store.get(0)
    server.round_idx = 0
    assert set(server.download(state, 0)["model"]) == set(state)


def test_uniform_average_of_global_layers():
    opts = LGOptions(split_preset="head", uniform_average=True)
    server = LGServer(opts, ServerArgs(), train_args())
    state = server.setup(clone_state(tiny_factory()().state_dict()))
    ups = []
    for value, n in ((1.0, 10.0), (3.0, 30.0)):
        ups.append((n, {"model": {k: torch.full_like(state[k], value) for k in server.global_keys}}))
    new = server.aggregate(state, ups)
    assert all(torch.allclose(new[k], torch.full_like(new[k], 2.0)) for k in server.global_keys)
    assert all(torch.equal(new[k], state[k]) for k in server.local_keys)


def test_split_must_be_given_once_and_be_valid():
    with pytest.raises(ConfigError, match="give exactly one of split_preset"):
        LGOptions().check()
    with pytest.raises(ConfigError, match="give exactly one"):
        LGOptions(split_preset="head", global_layers_from_top=2).check()
    server = LGServer(LGOptions(global_prefixes=["encoder.nope"]), ServerArgs(), train_args())
    with pytest.raises(ConfigError, match="encoder.nope"):
        server.setup(clone_state(tiny_factory()().state_dict()))


def test_warmup_checkpoint_is_loaded_and_checked(tmp_path):
    state = clone_state(tiny_factory()().state_dict())
    good = tmp_path / "good.pt"
    torch.save({k: torch.zeros_like(v) for k, v in state.items()}, good)
    server = LGServer(LGOptions(split_preset="head", warmup_checkpoint=str(good)), ServerArgs(), train_args())
    loaded = server.setup(state)
    assert all(float(v.abs().sum()) == 0.0 for v in loaded.values())
    bad = tmp_path / "bad.pt"
    torch.save({"other.weight": torch.zeros(1)}, bad)
    server = LGServer(LGOptions(split_preset="head", warmup_checkpoint=str(bad)), ServerArgs(), train_args())
    with pytest.raises(ConfigError, match="keys do not match"):
        server.setup(state)
    merged = merge_states(loaded, {})
    assert set(merged) == set(state)
