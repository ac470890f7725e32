"""Pictures and tables of how a partition spreads the classes over the parties."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

MAX_ANNOTATED_CELLS = 2500
TABLE_PARTIES = 100  # a partition of more parties is summarised in the log (the table: partition.json)
HEATMAP_PARTIES = 200  # a partition of more parties is drawn as histograms, not a heat map


def figure(size: tuple[float, float]) -> Any:
    """A matplotlib Figure on the Agg canvas (no display needed, no pyplot). matplotlib is imported
    here, where a process draws (its partition; a run's accuracy curve as it ends): a cross-silo
    server does not import it before its last round."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size)
    FigureCanvasAgg(fig)
    return fig


def _annotate(ax, counts: np.ndarray) -> None:
    """Write every count of the [classes, parties] grid in its cell, dark on light and light on dark."""
    n_classes, n_parties = counts.shape
    size = max(3.0, min(9.0, 180.0 / max(n_classes, n_parties)))
    threshold = counts.max() / 2.0
    for c in range(n_classes):
        for p in range(n_parties):
            colour = "white" if counts[c, p] > threshold else "black"
            ax.text(p, c, str(int(counts[c, p])), ha="center", va="center", fontsize=size, color=colour)


def save_partition_heatmap(
    counts: np.ndarray,
    path: Path,
    title: str,
    parties: Sequence[str] = (),
    classes: Sequence[str] = (),
) -> Path:
    """Save a heat map of ``counts`` [n_parties, num_classes] (party on x, class on y, as MOON's Fig. 5).

    Each cell shows its count (for up to ``MAX_ANNOTATED_CELLS`` cells); a colour bar gives the scale.
    The axes name the ``parties`` and ``classes`` when they are given and every tick fits (up to
    20 of each); else their indices. Rendered with the Agg canvas, so no display is needed. Returns
    ``path``.
    """
    grid = np.asarray(counts).T
    n_classes, n_parties = grid.shape
    fig = figure((max(4.0, 0.5 * n_parties + 2.0), max(3.0, 0.4 * n_classes + 1.5)))
    ax = fig.add_subplot(1, 1, 1)
    image = ax.imshow(grid, cmap="Blues", aspect="auto", interpolation="nearest")
    fig.colorbar(image, ax=ax)
    if grid.size <= MAX_ANNOTATED_CELLS:
        _annotate(ax, grid)
    ax.set_xlabel("party" if len(parties) == n_parties <= 20 else "party ID")
    ax.set_ylabel("class" if len(classes) == n_classes <= 20 else "class ID")
    ax.set_title(title, fontsize=9)
    ax.set_xticks(np.arange(n_parties)[:: max(1, n_parties // 20)])
    ax.set_yticks(np.arange(n_classes)[:: max(1, n_classes // 20)])
    if len(parties) == n_parties <= 20:
        ax.set_xticklabels(parties, rotation=30, ha="right")
    if len(classes) == n_classes <= 20:
        ax.set_yticklabels(classes)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    logger.info("saved partition heat map to %s", path)
    return path


def save_partition_summary(counts: np.ndarray, path: Path, title: str) -> Path:
    """Save two histograms of ``counts`` [n_parties, num_classes] for a partition of too many parties
    for a heat map: the parties' training sizes, and how many classes each party holds. Returns
    ``path``."""
    counts = np.asarray(counts)
    sizes, held = counts.sum(1), (counts > 0).sum(1)
    fig = figure((9.0, 3.5))
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    left.hist(sizes, bins=min(50, max(1, int(sizes.max() - sizes.min()) + 1)), color="tab:blue")
    left.set_xlabel("training samples of a party")
    left.set_ylabel("parties")
    edges = np.arange(0.5, counts.shape[1] + 1.5)
    right.hist(held, bins=edges, color="tab:blue")
    right.set_xlabel("classes a party holds")
    right.set_ylabel("parties")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


def summarise_partition(counts: np.ndarray) -> str:
    """A few lines on ``counts`` [n_parties, num_classes] for a partition too large for a table: the
    parties' training sizes and classes held (minimum, quartiles, maximum) and the samples per class."""
    counts = np.asarray(counts, dtype=np.int64)
    lines = []
    for name, values in (("training samples", counts.sum(1)), ("classes held", (counts > 0).sum(1))):
        q = np.percentile(values, [0, 25, 50, 75, 100], method="nearest")
        lines.append(f"{name} per party: min {q[0]}, quartiles {q[1]} / {q[2]} / {q[3]}, max {q[4]}")
    lines.append("samples per class: " + " ".join(f"c{c} {v}" for c, v in enumerate(counts.sum(0))))
    lines.append(f"all: {counts.sum()} samples over {counts.shape[0]} parties")
    return "\n".join(lines)


def format_partition_table(counts: np.ndarray) -> str:
    """Plain-text table of ``counts`` [n_parties, num_classes]: per-class counts and total per party.

    The last line sums over all parties.
    """
    counts = np.asarray(counts, dtype=np.int64)
    n_parties, n_classes = counts.shape
    header = ["party"] + [f"c{c}" for c in range(n_classes)] + ["total"]
    rows = [[str(p)] + [str(v) for v in counts[p]] + [str(counts[p].sum())] for p in range(n_parties)]
    rows.append(["all"] + [str(v) for v in counts.sum(0)] + [str(counts.sum())])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [" ".join(cell.rjust(w) for cell, w in zip(r, widths, strict=True)) for r in [header, *rows]]
    return "\n".join(lines)
