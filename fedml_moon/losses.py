"""Public home of the loss functions: `from fedml_moon.losses import model_contrastive_loss`."""

from fedml_moon.core.losses import (
    model_contrastive_loss,
    prototype_contrastive_loss,
    proximal_term,
    representation_l2_loss,
)

__all__ = ["model_contrastive_loss", "prototype_contrastive_loss", "proximal_term", "representation_l2_loss"]
