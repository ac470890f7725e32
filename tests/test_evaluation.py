"""Evaluation helpers and W&B settings, by hand."""

import torch

from fedml_moon.core.evaluation import evaluate, evaluate_ensemble
from fedml_moon.core.models import ModelOutput
from fedml_moon.records.tracking import resolve_mode, scrub


class Fixed(torch.nn.Module):
    """Predicts the same logits for every input; the logits are its only parameter."""

    def __init__(self):
        super().__init__()
        self.logits = torch.nn.Parameter(torch.zeros(3))

    def forward(self, x):
        out = self.logits.expand(len(x), 3)
        return ModelOutput(out, out, out)


def test_ensemble_averages_softmax_not_votes():
    y = torch.tensor([0, 0, 1, 1])
    loader = [(torch.zeros(4, 1), y)]
    model = Fixed()
    a = {"logits": torch.tensor([2.0, 0.0, 0.0])}  # confident class 0
    b = {"logits": torch.tensor([0.0, 0.5, 0.0])}  # weakly class 1
    acc, loss = evaluate_ensemble(model, [a, b], loader, torch.device("cpu"))
    assert acc == 0.5  # the average softmax still prefers class 0
    pa, pb = torch.softmax(a["logits"], 0), torch.softmax(b["logits"], 0)
    p = (pa + pb) / 2
    expected = -(2 * torch.log(p[0]) + 2 * torch.log(p[1])) / 4
    assert abs(loss - expected.item()) < 1e-6


def test_ensemble_of_one_equals_the_model():
    loader = [(torch.zeros(5, 1), torch.tensor([0, 1, 2, 1, 1]))]
    model = Fixed()
    state = {"logits": torch.tensor([0.1, 0.9, 0.3])}
    model.load_state_dict(state)
    single = evaluate(model, loader, torch.device("cpu"))
    ens = evaluate_ensemble(model, [state], loader, torch.device("cpu"))
    assert single[0] == ens[0] == 0.6 and abs(single[1] - ens[1]) < 1e-6


def test_scrub_drops_credentials_at_any_depth():
    cfg = {"tracking_args": {"wandb_project": "p", "api_key": "x", "wandb_token": "y"}, "Secret": 1, "mu": 5}
    assert scrub(cfg) == {"tracking_args": {"wandb_project": "p"}, "mu": 5}


def test_wandb_mode_auto_offline_without_login_and_env_wins(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert resolve_mode("auto") == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "k")
    assert resolve_mode("auto") == "online"
    (tmp_path / ".netrc").write_text("machine api.wandb.ai login user password k\n")
    monkeypatch.delenv("WANDB_API_KEY")
    (tmp_path / ".netrc").chmod(0o600)
    assert resolve_mode("auto") == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert resolve_mode("online") == "disabled"
