"""Gantt chart of a timeline as a PNG: one row per stage, F/B/W coloured as in the paper."""

from __future__ import annotations

from pathlib import Path

from pipeline.ops import OpKind
from pipeline.timeline import Timeline

__all__ = ["plot_gantt"]

_COLOURS = {OpKind.F: "#4c72b0", OpKind.B: "#55a868", OpKind.W: "#dd8452", OpKind.BW: "#8172b3"}


def plot_gantt(timeline: Timeline, path: str | Path, title: str = "") -> None:
    """Write the chart of replica 0; the microbatch index is printed in every box wide enough
    to hold it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    end_ms = max((r.end_ms for r in timeline.ops), default=1.0)
    fig, ax = plt.subplots(figsize=(12, 0.5 * timeline.num_stages + 1.2))
    min_label_ms = end_ms / 150
    ops = [op for op in timeline.ops if op.replica == 0]
    boxes: dict[tuple[int, OpKind], list[tuple[float, float]]] = {}
    for r in ops:
        boxes.setdefault((r.stage, r.kind), []).append((r.start_ms, r.end_ms - r.start_ms))
    for (stage, kind), spans in boxes.items():  # one collection per row and kind: fast
        ax.broken_barh(
            spans, (stage - 0.4, 0.8), facecolors=_COLOURS[kind], edgecolor="white", linewidth=0.5
        )
    for r in ops:
        width = r.end_ms - r.start_ms
        if width >= min_label_ms:
            ax.text(
                r.start_ms + width / 2,
                r.stage,
                str(r.microbatch),
                ha="center",
                va="center",
                fontsize=6,
                color="white",
            )
    ax.set_yticks(range(timeline.num_stages), [f"stage {i}" for i in range(timeline.num_stages)])
    ax.invert_yaxis()
    ax.set_xlim(0, end_ms)
    ax.set_xlabel("time (ms)")
    kinds = sorted({r.kind for r in timeline.ops}, key=list(OpKind).index)
    ax.legend(
        handles=[Patch(color=_COLOURS[k], label=k.value) for k in kinds],
        loc="upper right",
        ncols=len(kinds),
        fontsize=7,
    )
    if title:
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
