"""Seaborn figures of a run directory's results."""

from __future__ import annotations

from pathlib import Path

__all__ = ["plot_iteration_time_vs_delay"]


def plot_iteration_time_vs_delay(runs_csv: Path, path: Path, title: str = "") -> None:
    """Median iteration time against the injected delay, one line per system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns

    runs = pd.read_csv(runs_csv)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    sns.lineplot(
        data=runs,
        x="delay_ms",
        y="median_iteration_ms",
        hue="system",
        style="system",
        markers=True,
        dashes=False,
        errorbar=None,
        ax=ax,
    )
    ax.set_xlabel("injected delay per message (ms)")
    ax.set_ylabel("median iteration time (ms)")
    ax.set_ylim(bottom=0)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
