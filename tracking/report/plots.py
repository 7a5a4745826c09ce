"""Matplotlib figures of the analyses (PNG bytes), in seed 002's style: RWR heatmaps with cells
sorted by accuracy (best first), rows = the losing cell i, columns = the winning cell j."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")  # headless: figures are written to files / MLflow, never shown

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

SHARE_COLORS = {
    "correct": "#4c9a2a", "lucky_guess": "#a5d46a", "retrieval_failure": "#d9534f",
    "extraction_error": "#f0ad4e", "hallucination_error": "#8e44ad", "abstention": "#9e9e9e",
}


def _short(cell: str, width: int = 44) -> str:
    return cell if len(cell) <= width else cell[: width - 1] + "…"


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def rwr_heatmaps(panels: list[tuple[str, pd.DataFrame, pd.Series | None]], title: str | None = None) -> bytes:
    """One RWR heatmap panel per (panel title, matrix, accuracy) in one figure: an experiment's
    (reader, model) groups side by side, each compared only within itself (tracking/analysis/inconsistency.py)."""
    k_max = max(len(m) for _, m, _ in panels)
    size = max(3.5, 0.55 * k_max + 2)
    ncols = min(len(panels), 2)
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=((size + 1) * ncols, size * nrows + (0.4 if title else 0)),
                             squeeze=False, layout="constrained")  # keeps colorbars and rotated labels apart
    for ax, (sub, matrix, accuracy) in zip(axes.flat, panels, strict=False):
        # a lone panel carries the figure's title too (no suptitle above a single panel)
        _rwr_panel(fig, ax, matrix, f"{title}\n{sub}" if title and len(panels) == 1 else sub, accuracy)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    if title and len(panels) > 1:
        fig.suptitle(title, fontsize=11)
    return _png(fig)


def _rwr_panel(fig, ax, matrix: pd.DataFrame, title: str, accuracy: pd.Series | None) -> None:
    k = len(matrix)
    im = ax.imshow(matrix.to_numpy() * 100, cmap="Blues", vmin=0, vmax=100)
    labels = [_short(c) + (f" ({100 * accuracy[c]:.1f})" if accuracy is not None else "") for c in matrix.index]
    ax.set_xticks(range(k), [_short(c) for c in matrix.columns], rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(k), labels, fontsize=8)
    ax.set_xlabel("j (answers right)")
    ax.set_ylabel("i (fails)" + (" — accuracy %" if accuracy is not None else ""))
    if k <= 20:
        for i in range(k):
            for j in range(k):
                v = matrix.iat[i, j] * 100
                ax.text(j, i, "" if i == j else f"{v:.0f}", ha="center", va="center", fontsize=7,
                        color="white" if v > 60 else "black")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="RWR(i→j) %")
    ax.set_title(title, fontsize=10)


def error_share_bars(shares: pd.DataFrame, order: list[str]) -> bytes:
    """Stacked bars of error-class shares per cell, with 95% bootstrap CIs as error bars."""
    classes = list(SHARE_COLORS)
    k = len(order)
    fig, ax = plt.subplots(figsize=(max(5, 0.8 * k + 3), 4.5))
    bottom = np.zeros(k)
    for cls in classes:
        s = shares[shares["error_type"] == cls].set_index("cell").reindex(order)
        vals = s["share"].fillna(0).to_numpy() * 100
        err = np.vstack([vals - s["lo"].fillna(0).to_numpy() * 100, s["hi"].fillna(0).to_numpy() * 100 - vals])
        ax.bar(range(k), vals, bottom=bottom, color=SHARE_COLORS[cls], label=cls.replace("_", " "))
        ax.errorbar(np.arange(k), bottom + vals, yerr=np.clip(err, 0, None), fmt="none", ecolor="black",
                    elinewidth=0.7, capsize=2)
        bottom += vals
    ax.set_xticks(range(k), [_short(c) for c in order], rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("% of questions (95% bootstrap CI)")
    ax.set_ylim(0, 105)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set_title("Error decomposition per cell (seed 002; abstentions as their own class)", fontsize=10)
    return _png(fig)


def eor_weights(weights: pd.DataFrame, threshold: float = 0.1) -> bytes:
    """Seed 002's EoR weights, one panel per EoR cell: β per retriever (a retriever whose β falls under `threshold`
    is dropped from the ensemble, tracking/analysis/eor.py) and w per similarity metric. `weights` is eor_weights.parquet:
    eor_cell, param (w | beta), name, value."""
    cells = list(dict.fromkeys(weights["eor_cell"]))
    widest = max(len(weights[(weights["eor_cell"] == c) & (weights["param"] == "beta")]) for c in cells)
    fig, axes = plt.subplots(len(cells), 2, figsize=(max(6, 0.6 * widest + 4), 3.2 * len(cells)), squeeze=False,
                             layout="constrained", gridspec_kw={"width_ratios": [max(widest, 1), 2]})
    for (ax_beta, ax_w), cell in zip(axes, cells, strict=True):
        rows = weights[weights["eor_cell"] == cell]
        beta, w = rows[rows["param"] == "beta"], rows[rows["param"] == "w"]
        colors = ["#4c72b0" if v >= threshold else "#c0c0c0" for v in beta["value"]]
        ax_beta.bar(range(len(beta)), beta["value"], color=colors)
        ax_beta.axhline(threshold, color="#d9534f", linewidth=0.8, linestyle="--", label=f"dropped below β = {threshold}")
        ax_beta.set_xticks(range(len(beta)), [_short(n, 30) for n in beta["name"]], rotation=45, ha="right", fontsize=8)
        ax_beta.set_ylabel("β (retriever weight)")
        ax_beta.set_title(_short(cell, 70), fontsize=9)
        ax_beta.legend(fontsize=7)
        ax_w.bar(range(len(w)), w["value"], color="#55a868")
        ax_w.set_xticks(range(len(w)), list(w["name"]), rotation=45, ha="right", fontsize=8)
        ax_w.set_ylabel("w (similarity weight)")
    fig.suptitle("EoR learned weights (seed 002)", fontsize=10)
    return _png(fig)


def accuracy_across(table: pd.DataFrame, experiments: list[str], metric: str = "em") -> bytes:
    """Seed 002's corpus-level figure: one line per experiment (dataset) over the cells, sorted by the first
    experiment's accuracy (tracking/analysis/across.py)."""
    cells = list(table["cell"])
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(cells) + 3), 4.5), layout="constrained")
    for name in experiments:
        ax.plot(range(len(cells)), table[name], marker="o", label=name)
    ax.set_xticks(range(len(cells)), [_short(c, 40) for c in cells], rotation=60, ha="right", fontsize=8)
    ax.set_ylabel(f"accuracy % ({metric})")
    ax.set_xlabel(f"cells, sorted by accuracy on {experiments[0]}")
    ax.legend(fontsize=8)
    ax.grid(axis="y", linewidth=0.3)
    ax.set_title("Accuracy of each cell across experiments (seed 002, corpus-level)", fontsize=10)
    return _png(fig)
