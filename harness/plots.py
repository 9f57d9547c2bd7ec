"""Seaborn figures of results."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["plot_iteration_time_vs_delay", "plot_lines"]


def plot_lines(
    rows: Sequence[Mapping[str, Any]],
    path: Path,
    *,
    x: str,
    y: str,
    hue: str,
    xlabel: str,
    ylabel: str,
    title: str = "",
) -> None:
    """One line per `hue` value, markers on the points, y axis from 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    sns.lineplot(
        data=pd.DataFrame(list(rows)),
        x=x,
        y=y,
        hue=hue,
        style=hue,
        markers=True,
        dashes=False,
        errorbar=None,
        ax=ax,
    )
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_iteration_time_vs_delay(
    runs: Sequence[Mapping[str, Any]], path: Path, title: str = ""
) -> None:
    """Median iteration time against the injected delay, one line per system (runs.csv rows)."""
    rows = [
        {
            **r,
            "delay_ms": float(r["delay_ms"]),
            "median_iteration_ms": float(r["median_iteration_ms"]),
        }
        for r in runs
    ]
    plot_lines(
        rows,
        path,
        x="delay_ms",
        y="median_iteration_ms",
        hue="system",
        xlabel="injected delay per message (ms)",
        ylabel="median iteration time (ms)",
        title=title,
    )
