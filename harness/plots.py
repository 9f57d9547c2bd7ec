"""Figures of results: seaborn, or plain matplotlib where it draws the same lines faster."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.results import fault_free_wall_ms
from pipeline.files import pyplot, save_figure

__all__ = [
    "plot_iteration_time_vs_delay",
    "plot_lines",
    "plot_slowdown",
    "plot_throughput_over_time",
    "same_line_labels",
    "throughput_rows",
]

_Point = tuple[int, float]
"""(iteration, samples/s)"""


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
    import pandas as pd
    import seaborn as sns

    plt = pyplot()
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
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def plot_iteration_time_vs_delay(runs: Sequence[Mapping[str, Any]], path: Path) -> bool:
    """Median time per step against the injected delay: a panel per model, a line per system
    and a line style per link set (runs.csv rows), each point the median over the repeats of
    their median steps; both axes from 0. False (and no file) when the runs have fewer than
    two distinct delays: there is no line to draw."""
    if len({float(r["delay_ms"]) for r in runs}) < 2:
        return False
    import pandas as pd
    import seaborn as sns

    plt = pyplot()
    frame = pd.DataFrame(
        [
            {
                "model": r["model"],
                "system": r["system"],
                "links": r["links"] or "none",
                "delay (ms)": float(r["delay_ms"]),
                "median step (ms)": float(r["median_wall_ms"]),
            }
            for r in runs
        ]
    )
    # A model's fault-free point belongs to each of its link sets' lines (`last` names another
    # link in a pipeline of other depth: one model's is not another's).
    free = frame[frame["delay (ms)"] == 0]
    faulty = frame[frame["delay (ms)"] > 0][["model", "links"]].drop_duplicates()
    frame = pd.concat(
        [frame]
        + [free[free["model"] == model].assign(links=links) for model, links in faulty.values]
    )
    frame = frame[frame["links"] != "none"]
    frame["system"] = frame["system"].map(same_line_labels(frame))
    grid = sns.relplot(
        data=frame,
        x="delay (ms)",
        y="median step (ms)",
        hue="system",
        style="links",
        col="model",
        col_wrap=min(4, frame["model"].nunique()),
        kind="line",
        markers=True,
        estimator="median",  # over the repeats, as the label and the report say
        errorbar=None,
        height=3.6,
        facet_kws={"sharey": False},
    )
    for ax in grid.axes.flat:
        # Delays and steps are never negative: both axes from 0, the top 8 % above the
        # highest point and the markers on the axes drawn whole.
        ax.set_xlim(left=0)
        ax.set_ylim(0, 1.08 * ax.dataLim.ymax if ax.dataLim.ymax > 0 else 1.0)
        for line in ax.lines:
            line.set_clip_on(False)
    save_figure(grid, path, dpi=110)
    plt.close(grid.figure)
    return True


def same_line_labels(frame: Any) -> dict[str, str]:
    """Each system's legend label: its name, and where another system's line is the same
    (every point equal, `_same_line`: Falcon's under a delay it cannot see is ZB's), which,
    and on which link sets (and models) where not on all of them: "zb (= falcon)", "zb (=
    falcon on dp0:0-1)". A line drawn exactly over another hides it."""
    medians = frame.groupby(["system", "model", "links", "delay (ms)"], sort=False)[
        "median step (ms)"
    ].median()
    lines: dict[str, dict[tuple[str, str], tuple[Any, ...]]] = {}
    for (system, model, links, delay_ms), ms in medians.items():
        lines.setdefault(system, {}).setdefault((model, links), ())
        lines[system][model, links] += ((delay_ms, ms),)
    several_models = frame["model"].nunique() > 1
    labels = {}
    for system, panels in lines.items():
        same = []
        for other, theirs in lines.items():
            equal = [
                p
                for p, line in panels.items()
                if other != system and _same_line(theirs.get(p, ()), line)
            ]
            if equal and len(equal) == len(panels):
                same.append(other)
            elif equal:
                where = ", ".join(f"{m} {k}" if several_models else k for m, k in equal)
                same.append(f"{other} on {where}")
        labels[system] = f"{system} (= {'; '.join(same)})" if same else system
    return labels


def _same_line(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """Two lines' (delay, step) points are the same as drawn: the same delays, each step
    equal but for a float sum's last bits (290.8000000000002 ms and 290.79999999999995
    ms hide each other)."""
    return len(a) == len(b) and all(
        x_a == x_b and math.isclose(y_a, y_b, rel_tol=1e-9)
        for (x_a, y_a), (x_b, y_b) in zip(a, b, strict=True)
    )


_MAX_SCENARIO_LABELS = 60
"""The most scenarios a slowdown chart's panel labels (more: every k-th, its bars as narrow)."""


def plot_slowdown(runs: Sequence[Mapping[str, Any]], path: Path) -> bool:
    """Fig. 15/16 style bars: each system's step time over its own fault-free step time.
    False (and no file) when the runs have no fault-free baseline."""
    import pandas as pd
    import seaborn as sns

    base = fault_free_wall_ms(runs)
    rows = [
        {
            "model": r["model"],
            "system": r["system"],
            "scenario": r["scenario"],
            "slowdown": float(r["median_wall_ms"]) / base[r["model"], r["system"]],
        }
        for r in runs
        if r["scenario"] != "fault-free" and (r["model"], r["system"]) in base
    ]
    if not rows:
        return False
    plt = pyplot()
    frame = pd.DataFrame(rows)
    num_scenarios = frame.groupby("model")["scenario"].nunique().max()
    grid = sns.catplot(
        data=frame,
        x="scenario",
        y="slowdown",
        hue="system",
        col="model",
        col_wrap=min(4, frame["model"].nunique()),
        kind="bar",
        estimator="median",  # over the repeats, as the report's fault-free step is
        errorbar=None,  # a bootstrap would be drawn anew (unseeded) each time
        height=3.6,
        # room for each scenario's label, up to _MAX_SCENARIO_LABELS' (1,000 scenarios drew
        # a chart 79,208 px wide in a minute)
        aspect=max(1.0, 0.2 * min(num_scenarios, _MAX_SCENARIO_LABELS)),
        sharex=False,
    )
    for ax in grid.axes.flat:
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.tick_params(axis="x", labelrotation=30 if num_scenarios <= 6 else 90)
        labels = ax.get_xticklabels()
        every = math.ceil(len(labels) / _MAX_SCENARIO_LABELS)
        for k, label in enumerate(labels):
            label.set_visible(k % every == 0)
    save_figure(grid, path, dpi=110)
    plt.close(grid.figure)
    return True


def _several_models(iterations: Sequence[Mapping[str, Any]]) -> bool:
    return len({r["model"] for r in iterations}) > 1


def throughput_rows(
    iterations: Sequence[Mapping[str, Any]], samples_per_iteration: Mapping[str, int]
) -> list[dict[str, Any]]:
    """Each iteration's samples/s (`samples_per_iteration` by model), its repeat and its line:
    the system, or "model, system" where there are several models."""
    several = _several_models(iterations)
    return [
        {
            "iteration": int(r["iteration"]),
            "repeat": str(r["repeat"]),
            "line": f"{r['model']}, {r['system']}" if several else r["system"],
            "samples/s": samples_per_iteration[r["model"]]
            * 1000.0
            / (float(r["iteration_time_ms"]) + float(r["step_time_ms"])),
        }
        for r in iterations
    ]


def plot_throughput_over_time(
    iterations: Sequence[Mapping[str, Any]], samples_per_iteration: Mapping[str, int], path: Path
) -> None:
    """Fig. 21 style: samples/s per iteration over a fault timeline, a line per system (per
    model and system where there are several models: `throughput_rows`), the median over the
    repeats; an iteration run twice (lost to a restart) as it was run again, the run that
    counted. Plain matplotlib: seaborn and pandas took most of this plot's time."""
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(9, 3.8))
    for line, points in _median_by_iteration(throughput_rows(iterations, samples_per_iteration)):
        # a line of one point (one measured iteration) is a marker: a line alone draws nothing
        marker = "o" if len(points) == 1 else ""
        ax.plot(
            [x for x, _ in points], [y for _, y in points], linewidth=1, marker=marker, label=line
        )
    ax.set_xlabel("iteration")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # 0.25 is no iteration
    ax.set_ylabel("samples/s")
    if ax.lines:
        ax.legend(title="model, system" if _several_models(iterations) else "system")
    # From 0, the top 8 % above the highest point (as the delay plot's): a line that never
    # dropped sat on the axes' top edge, hidden by it.
    top = max((max(line.get_ydata(), default=0.0) for line in ax.lines), default=0.0)
    ax.set_ylim(0, 1.08 * top if top > 0 else 1.0)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


def _median_by_iteration(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[_Point]]]:
    """`throughput_rows` as lines in order of appearance, each its (iteration, samples/s)
    points in iteration order: per iteration the median over the repeats of each repeat's
    last run of it (rows come in the order they ran)."""
    counted: dict[str, dict[int, dict[str, float]]] = {}
    for r in rows:
        by_repeat = counted.setdefault(r["line"], {}).setdefault(r["iteration"], {})
        by_repeat[r["repeat"]] = r["samples/s"]
    return [
        (line, [(x, statistics.median(runs.values())) for x, runs in sorted(by_x.items())])
        for line, by_x in counted.items()
    ]
