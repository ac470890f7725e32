"""t-SNE pictures of a run's representations (the MOON paper's Figure 2): the encoder output h of test
images under the final global model and under a party's final local model, coloured by class.

The global model is the model file the run's summary.json names (`model_file`: final_model.pt, or
model_at_<status>.pt for a run that did not complete, drawn with a warning); a party's model is
party_models/party_<id>.pt, which a run writes with `train_args.save_party_models: true` (each party's
latest upload). Both load with `weights_only=True`. The test images come from the run's own config
(dataset, normalisation, max_test_samples), so a picture is drawn from what the run saw.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch

from fedml_moon.config import config_from_dict
from fedml_moon.config_schema import ConfigError
from fedml_moon.core.models import build_model
from fedml_moon.data.federated import load_data
from fedml_moon.data.loader import build_fedml_dataset

log = logging.getLogger(__name__)


def _state(path: Path, what: str, hint: str) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise ConfigError(f"{path}: no {what}; {hint}")
    return torch.load(path, map_location="cpu", weights_only=True)


@torch.no_grad()
def representations(model: torch.nn.Module, loader, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """The encoder outputs h [N, d] and labels [N] of the first `limit` images of `loader`."""
    model.eval()
    feats, labels, seen = [], [], 0
    for x, y in loader:
        feats.append(model(x).h.float())
        labels.append(y)
        seen += len(y)
        if seen >= limit:
            break
    return torch.cat(feats)[:limit].numpy(), torch.cat(labels)[:limit].numpy()


def embed(features: np.ndarray, seed: int) -> np.ndarray:
    """2-d t-SNE of `features` (scikit-learn; perplexity 30, or less for few points)."""
    from sklearn.manifold import TSNE

    perplexity = min(30.0, max(2.0, (len(features) - 1) / 3))
    return TSNE(2, perplexity=perplexity, init="pca", random_state=seed).fit_transform(features)


def tsne(run_dir: Path, party: int | None, samples: int = 2000, out: Path | None = None) -> Path:
    """Draws tsne.png (global model; and party `party`'s model beside it) into `run_dir` or `out`."""
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise ConfigError(f"{run_dir}: not a run folder (no summary.json)")
    summary = json.loads(summary_path.read_text())
    cfg = config_from_dict(summary["config"])
    model_file = summary.get("model_file", "final_model.pt")
    if summary.get("status", "completed") != "completed":
        log.warning("%s: the run ended %s; its model then (%s)", run_dir, summary["status"], model_file)
    seed, m = cfg.common_args.random_seed, cfg.model_args
    data = load_data(cfg.data_args, seed)
    loader = build_fedml_dataset(data, [np.arange(len(data.y_train))], None, 64, seed).test_data_global
    models = {
        "global model": _state(run_dir / model_file, "model", "the model file summary.json names is gone")
    }
    if party is not None:
        hint = "run with train_args.save_party_models: true (and that party sampled at least once)"
        models[f"party {party}'s local model"] = _state(
            run_dir / "party_models" / f"party_{party}.pt", "model of that party", hint
        )
    panels = []
    for title, state in models.items():
        model = build_model(
            m.model, data.input_shape, data.num_classes, m.use_projection_head, m.out_dim, m.output_activation
        )
        try:
            model.load_state_dict(state)
        except RuntimeError as err:
            raise ConfigError(
                f"{title} in {run_dir} is not a whole model of the run's config: {str(err)[:200]}"
            ) from None
        feats, labels = representations(model, loader, samples)
        panels.append((title, embed(feats, seed), labels))
    path = out or run_dir / "tsne.png"
    _draw(panels, path, f"{cfg.train_args.algorithm} on {cfg.data_args.dataset}")
    log.info("t-SNE of %d test images: %s", len(panels[0][2]), path)
    return path


def _draw(panels: list[tuple[str, np.ndarray, np.ndarray]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 5), squeeze=False)
    for ax, (name, points, labels) in zip(axes[0], panels, strict=True):
        ax.scatter(points[:, 0], points[:, 1], c=labels, cmap="tab10", s=4)
        ax.set(title=name, xticks=[], yticks=[])
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
