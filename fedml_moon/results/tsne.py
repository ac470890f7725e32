"""t-SNE pictures of runs' representations (the MOON paper's Figure 2): the encoder output h of test
images under a run's final global model and under a party's final local model, coloured by class; with
several runs, one row per run (the MOON paper sets MOON's row against FedAvg's).

The global model is the model file the run's summary.json names (`model_file`: final_model.pt, or
model_at_<status>.pt for a run that did not complete, drawn with a warning); a party's model is
party_models/party_<id>.pt, which a run writes with `train_args.save_party_models: true` (each party's
latest upload). Both load with `weights_only=True`. The test images come from each run's own config
(dataset, normalisation, max_test_samples), so a picture is drawn from what the run saw. Every panel
is embedded with the same seed: the first run's `common_args.random_seed`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedml_moon.config.load import Config, config_from_dict
from fedml_moon.config.schema import ConfigError
from fedml_moon.core.models import build_model
from fedml_moon.data.federated import load_data
from fedml_moon.data.loader import build_fedml_dataset
from fedml_moon.run_folder import FINAL_MODEL, RunFolder, read_json

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Panel:
    """One embedded model: its title, the 2-d points [N, 2] and their class labels [N]."""

    title: str
    points: np.ndarray
    labels: np.ndarray


@dataclass(frozen=True)
class Row:
    """One run's panels (global model, then party K's), labelled by the run's folder."""

    run_dir: Path
    algorithm: str
    dataset: str
    panels: list[Panel]


def _state(path: Path, what: str, hint: str) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise ConfigError(f"{path}: no {what}; {hint}")
    return torch.load(path, map_location="cpu", weights_only=True)


@torch.no_grad()
def representations(
    model: torch.nn.Module, loader: Iterable[tuple[torch.Tensor, torch.Tensor]], limit: int
) -> tuple[np.ndarray, np.ndarray]:
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


def _run_config(run_dir: Path) -> tuple[Config, str]:
    """The run's config and the model file its summary names (a warning if it did not complete)."""
    summary_path = RunFolder(run_dir).summary
    if not summary_path.is_file():
        raise ConfigError(f"{run_dir}: not a run folder (no summary.json)")
    summary = read_json(summary_path)
    model_file = summary.get("model_file", FINAL_MODEL)
    if summary.get("status", "completed") != "completed":
        log.warning("%s: the run ended %s; its model then (%s)", run_dir, summary["status"], model_file)
    return config_from_dict(summary["config"]), model_file


def _states(run_dir: Path, model_file: str, party: int | None) -> dict[str, dict[str, torch.Tensor]]:
    """The run's models to draw, by panel name: the global model, and party `party`'s."""
    models = {
        "global model": _state(run_dir / model_file, "model", "the model file summary.json names is gone")
    }
    if party is not None:
        hint = "run with train_args.save_party_models: true (and that party sampled at least once)"
        models[f"party {party}'s local model"] = _state(
            RunFolder(run_dir).party_model(party), "model of that party", hint
        )
    return models


def run_row(
    run_dir: Path, party: int | None, samples: int, seed: int | None = None, read: tuple | None = None
) -> Row:
    """One run's panels, embedded with `seed` (default: the run's own random seed); `read`: the run's
    `_run_config`, when the caller has it already."""
    cfg, model_file = read or _run_config(run_dir)
    own_seed, m, algorithm = cfg.common_args.random_seed, cfg.model_args, cfg.train_args.algorithm
    seed = own_seed if seed is None else seed
    data = load_data(cfg.data_args, own_seed)
    loader = build_fedml_dataset(data, [np.arange(len(data.y_train))], None, 64, own_seed).test_data_global
    panels = []
    for name, state in _states(run_dir, model_file, party).items():
        model = build_model(
            m.model, data.input_shape, data.num_classes, m.use_projection_head, m.out_dim, m.output_activation
        )
        try:
            model.load_state_dict(state)
        except RuntimeError as err:
            raise ConfigError(
                f"{name} in {run_dir} is not a whole model of the run's config: {str(err)[:200]}"
            ) from None
        feats, labels = representations(model, loader, samples)
        panels.append(Panel(f"{algorithm}: {name}", embed(feats, seed), labels))
    return Row(run_dir, algorithm, cfg.data_args.dataset, panels)


def rows(run_dirs: list[Path], party: int | None, samples: int = 2000) -> list[Row]:
    """Every run's row, all embedded with the first run's random seed."""
    if not run_dirs:
        raise ConfigError("tsne: name at least one run folder")
    read = [_run_config(run_dir) for run_dir in run_dirs]  # each summary once (and its warning)
    seed = read[0][0].common_args.random_seed
    return [run_row(d, party, samples, seed, r) for d, r in zip(run_dirs, read, strict=True)]


def figure(drawn: list[Row]) -> Figure:
    """The picture: one row of panels per run, each panel titled with the algorithm and the model."""
    from matplotlib.figure import Figure

    n_cols = max(len(row.panels) for row in drawn)
    fig = Figure(figsize=(5 * n_cols, 5 * len(drawn)))
    axes = fig.subplots(len(drawn), n_cols, squeeze=False)
    for ax_row, row in zip(axes, drawn, strict=True):
        for ax, panel in zip(ax_row, row.panels, strict=False):
            ax.scatter(panel.points[:, 0], panel.points[:, 1], c=_colours(panel.labels), s=4)
            ax.set(title=panel.title, xticks=[], yticks=[])
        for ax in ax_row[len(row.panels) :]:
            ax.set_axis_off()
        if len(drawn) > 1:
            ax_row[0].set_ylabel(row.run_dir.name, fontsize=8)
    datasets = ", ".join(dict.fromkeys(row.dataset for row in drawn))
    fig.suptitle(f"{' vs '.join(row.algorithm for row in drawn)} on {datasets}")
    classes = sorted({int(c) for row in drawn for p in row.panels for c in p.labels})
    if len(classes) <= 10:  # one colour per class: a key (tab10 repeats beyond ten)
        handles = [_marker(_colours(np.array([c]))[0], f"class {c}") for c in classes]
        fig.legend(handles=handles, loc="lower center", ncols=len(classes), fontsize=8, frameon=False)
        fig.tight_layout(rect=(0, 0.04 / len(drawn), 1, 1))
    else:
        fig.tight_layout()
    return fig


def _colours(labels: np.ndarray) -> np.ndarray:
    """RGBA [N, 4]: class c in tab10's colour c (mod 10), the same in every panel."""
    from matplotlib import colormaps

    return colormaps["tab10"](labels % 10)


def _marker(colour: np.ndarray, label: str) -> Line2D:
    """A legend key: one dot of `colour`."""
    from matplotlib.lines import Line2D

    return Line2D([], [], marker="o", linestyle="", color=colour, markersize=5, label=label)


def tsne(
    run_dirs: Path | list[Path], party: int | None, samples: int = 2000, out: Path | None = None
) -> Path:
    """Draws the runs' t-SNE picture into `out` (default: the first run folder's tsne.png)."""
    run_dirs = [run_dirs] if isinstance(run_dirs, Path) else list(run_dirs)
    drawn = rows(run_dirs, party, samples)
    path = out or RunFolder(run_dirs[0]).tsne
    figure(drawn).savefig(path, dpi=100)
    log.info("t-SNE of %d test images per panel: %s", len(drawn[0].panels[0].labels), path)
    return path
