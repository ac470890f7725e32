"""Loss functions against hand-computed values."""

import math

import pytest
import torch
import torch.nn.functional as F

from fedml_moon.losses import model_contrastive_loss, proximal_term, representation_l2_loss


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_equal_similarities_give_log_k_plus_one(k):
    z = torch.randn(4, 8)
    same = torch.randn(4, 8)
    prev = same.unsqueeze(0).repeat(k, 1, 1)
    loss = model_contrastive_loss(z, same, prev, temperature=0.5)
    assert loss.item() == pytest.approx(math.log(k + 1), abs=1e-6)


def test_k_zero_is_exactly_zero():
    z, zg = torch.randn(3, 5), torch.randn(3, 5)
    assert model_contrastive_loss(z, zg, [], 0.5).item() == 0.0


def test_hand_value_orthogonal_negative():
    z = torch.tensor([[1.0, 0.0]])
    z_glob = torch.tensor([[2.0, 0.0]])  # cosine 1
    z_prev = torch.tensor([[[0.0, 3.0]]])  # cosine 0
    expected = math.log(1 + math.exp(-1 / 0.5))  # -log(e^2 / (e^2 + e^0))
    assert model_contrastive_loss(z, z_glob, z_prev, 0.5).item() == pytest.approx(expected, rel=1e-6)


def test_list_and_tensor_forms_agree_and_batch_mean():
    z, zg = torch.randn(6, 4), torch.randn(6, 4)
    prev = [torch.randn(6, 4) for _ in range(3)]
    a = model_contrastive_loss(z, zg, prev, 0.7)
    b = model_contrastive_loss(z, zg, torch.stack(prev), 0.7)
    per_sample = [
        model_contrastive_loss(z[i : i + 1], zg[i : i + 1], [p[i : i + 1] for p in prev], 0.7)
        for i in range(6)
    ]
    assert a.item() == pytest.approx(b.item(), abs=1e-7)
    assert a.item() == pytest.approx(torch.stack(per_sample).mean().item(), abs=1e-6)


def test_gradient_flows_only_into_z():
    z = torch.randn(4, 3, requires_grad=True)
    zg = torch.randn(4, 3, requires_grad=True)
    zp = torch.randn(1, 4, 3, requires_grad=True)
    model_contrastive_loss(z, zg.detach(), zp.detach(), 0.5).backward()
    assert z.grad is not None and z.grad.abs().sum() > 0
    assert zg.grad is None and zp.grad is None


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_rejects_non_positive_temperature(bad):
    with pytest.raises(ValueError, match="temperature"):
        model_contrastive_loss(torch.ones(1, 2), torch.ones(1, 2), [], bad)


def test_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="z_prev"):
        model_contrastive_loss(torch.ones(2, 3), torch.ones(2, 3), torch.ones(1, 2, 4), 0.5)


def test_representation_l2_by_hand():
    z = torch.tensor([[3.0, 4.0], [0.0, 0.0]])
    zg = torch.zeros(2, 2)
    assert representation_l2_loss(z, zg).item() == pytest.approx(2.5)  # (5 + 0) / 2


def test_proximal_term_by_hand():
    p = [torch.tensor([1.0, 2.0]), torch.tensor([[3.0]])]
    g = [torch.tensor([0.0, 0.0]), torch.tensor([[1.0]])]
    assert proximal_term(p, g, mu=0.1).item() == pytest.approx(0.05 * (1 + 4 + 4))


def test_cross_entropy_form_matches_formula():
    torch.manual_seed(0)
    z, zg, zp = torch.randn(5, 6), torch.randn(5, 6), torch.randn(2, 5, 6)
    tau = 0.5
    pos = torch.exp(F.cosine_similarity(z, zg) / tau)
    neg = sum(torch.exp(F.cosine_similarity(z, zp[i]) / tau) for i in range(2))
    expected = (-torch.log(pos / (pos + neg))).mean()
    assert model_contrastive_loss(z, zg, zp, tau).item() == pytest.approx(expected.item(), rel=1e-5)
