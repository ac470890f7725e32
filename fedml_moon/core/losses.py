"""Local loss terms. Pure functions of tensors; no model, no state.

Every function returns a scalar averaged over the batch unless its docstring says otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def _stack_prev(z_prev: torch.Tensor | Sequence[torch.Tensor], z: torch.Tensor) -> torch.Tensor:
    """Return the previous-model projections as one tensor of shape [k, B, D] (k may be 0)."""
    if isinstance(z_prev, torch.Tensor):
        if z_prev.dim() != 3:
            raise ValueError(f"z_prev must have shape [k, B, D]; got {tuple(z_prev.shape)}")
        return z_prev
    if len(z_prev) == 0:
        return z.new_zeros((0, *z.shape))
    return torch.stack(list(z_prev), dim=0)


def model_contrastive_loss(
    z: torch.Tensor,
    z_glob: torch.Tensor,
    z_prev: torch.Tensor | Sequence[torch.Tensor],
    temperature: float,
) -> torch.Tensor:
    """MOON's model-contrastive loss l_con (MOON paper Eq. 3; Eq. 7 for k negatives).

    Args:
        z: [B, D] projections of the local model being trained.
        z_glob: [B, D] projections of the round's global model (positive pair).
        z_prev: [k, B, D], or a list of k tensors [B, D]: projections of the party's k previous
            local models (negative pairs). k = 0 (first round) leaves only the positive logit,
            so the loss is exactly 0, as in the authors' code.
        temperature: tau > 0.

    Returns:
        Scalar: mean over the batch of -log(e^{s+/tau} / (e^{s+/tau} + sum_i e^{s-_i/tau})),
        computed as cross-entropy over the logits [s+, s-_1..s-_k] / tau with target 0.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0; got {temperature}")
    if z.shape != z_glob.shape or z.dim() != 2:
        raise ValueError(f"z and z_glob must both be [B, D]; got {tuple(z.shape)}, {tuple(z_glob.shape)}")
    prev = _stack_prev(z_prev, z)
    if prev.shape[1:] != z.shape:
        raise ValueError(f"z_prev must be [k, {z.shape[0]}, {z.shape[1]}]; got {tuple(prev.shape)}")
    positive = F.cosine_similarity(z, z_glob, dim=-1).unsqueeze(1)  # [B, 1]
    negatives = F.cosine_similarity(z.unsqueeze(0), prev, dim=-1).transpose(0, 1)  # [B, k]
    logits = torch.cat([positive, negatives], dim=1) / temperature
    target = torch.zeros(z.shape[0], dtype=torch.long, device=z.device)
    return F.cross_entropy(logits, target)


L2_SAME = 1e-5  # relative distance at or below which z and z_glob count as equal (float32 rounding)


def representation_l2_loss(z: torch.Tensor, z_glob: torch.Tensor) -> torch.Tensor:
    """The l2 representation term of MOON's Table 5 ablation: ||z - z_glob||_2 (MOON paper Eq. 6).

    ||.|| has no gradient at 0, where every unit vector is a subgradient. A sample whose distance is
    at most L2_SAME * max(1, ||z_glob||) counts as distance 0 with gradient 0 (the least-norm
    subgradient): at the first step of a round z equals z_glob, exactly when computed one way and
    up to rounding when computed another (vmapped), and rounding must not pick the direction.

    Args:
        z: [B, D] local projections; z_glob: [B, D] global-model projections.

    Returns:
        Scalar: batch mean of the per-sample Euclidean distance.
    """
    if z.shape != z_glob.shape:
        raise ValueError(
            f"z and z_glob must have the same shape; got {tuple(z.shape)}, {tuple(z_glob.shape)}"
        )
    diff = z - z_glob
    scale = torch.linalg.vector_norm(z_glob.detach(), ord=2, dim=-1, keepdim=True).clamp(min=1.0)
    same = torch.linalg.vector_norm(diff.detach(), ord=2, dim=-1, keepdim=True) <= L2_SAME * scale
    return torch.linalg.vector_norm(torch.where(same, torch.zeros_like(diff), diff), ord=2, dim=-1).mean()


def proximal_term(
    params: Sequence[torch.Tensor], global_params: Sequence[torch.Tensor], mu: float
) -> torch.Tensor:
    """FedProx's proximal term mu/2 * ||w - w^t||^2 over trainable parameters (FedProx, Eq. 2).

    Args:
        params: the local model's trainable parameters (any shapes).
        global_params: the round's global parameters, same shapes and order, no gradient.
        mu: proximal weight >= 0.

    Returns:
        Scalar: mu / 2 times the squared l2 distance, summed over all parameters.
    """
    if len(params) != len(global_params):
        raise ValueError("params and global_params must have the same length")
    total = params[0].new_zeros(())
    for p, g in zip(params, global_params, strict=True):
        total = total + (p - g).pow(2).sum()
    return 0.5 * mu * total


def prototype_contrastive_loss(
    z: torch.Tensor,
    labels: torch.Tensor,
    prototypes: torch.Tensor,
    present: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """FedSSC's global class-wise contrastive loss l_glob (FedSSC paper, Eq. 3).

    For a sample of class y: -log(e^{sim(z, P_y)/tau} / sum_{k present} e^{sim(z, P_k)/tau}).

    Args:
        z: [B, D] projections of the local model being trained.
        labels: [B] int64 class labels.
        prototypes: [C, D] server-shared class prototypes (rows of absent classes are ignored).
        present: [C] bool mask of classes that have a prototype; absent classes are left out of the
            denominator.
        temperature: tau > 0.

    Returns:
        Scalar: the sum of the per-sample losses divided by B (the batch mean). Samples whose class
        has no prototype contribute 0; with no prototype at all the loss is exactly 0.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0; got {temperature}")
    if prototypes.dim() != 2 or prototypes.shape[1] != z.shape[1] or present.shape != prototypes.shape[:1]:
        raise ValueError(
            f"need prototypes [C, {z.shape[1]}] and present [C]; "
            f"got {tuple(prototypes.shape)}, {tuple(present.shape)}"
        )
    present = present.to(torch.bool)
    contributing = present[labels]
    # no data-dependent branch or shape (one party or many under vmap): an absent class gets a huge
    # negative logit, whose exp() is exactly 0 as -inf's would be
    sims = F.cosine_similarity(z.unsqueeze(1), prototypes.unsqueeze(0), dim=-1) / temperature  # [B, C]
    sims = sims.masked_fill(~present.unsqueeze(0), -1e30)
    per_sample = F.cross_entropy(sims, labels, reduction="none")
    return torch.where(contributing, per_sample, torch.zeros_like(per_sample)).sum() / z.shape[0]
