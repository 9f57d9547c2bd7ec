"""`compare`: the regression gate over two runs' results (harness.compare)."""

from __future__ import annotations

from pathlib import Path

import click

from harness.compare import Change, UnusableResults, compare_runs, load_runs
from pipeline.errors import ConfigError

__all__ = ["compare"]


class _Unusable(click.ClickException):
    exit_code = 2


def _metric_tolerance(
    _ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> dict[str, float]:
    tolerances = {}
    for value in values:
        metric, sep, pct = value.partition("=")
        try:
            tolerances[metric] = float(pct)
        except ValueError:
            sep = ""
        if not sep:
            raise click.BadParameter(f"{value!r} is not METRIC=PERCENT", param=param)
    return tolerances


@click.command()
@click.argument("base", type=click.Path(exists=True))
@click.argument("new", type=click.Path(exists=True))
@click.option(
    "--tolerance",
    type=float,
    default=0.0,
    show_default=True,
    help="Allowed worsening per metric, in percent (in its bad direction: times up, "
    "throughput down).",
)
@click.option(
    "--metric-tolerance",
    "metric_tolerances",
    multiple=True,
    callback=_metric_tolerance,
    metavar="METRIC=PERCENT",
    help="A metric's own tolerance (repeatable), e.g. median_wall_ms=20.",
)
@click.option(
    "--allow-new",
    is_flag=True,
    help="Configurations only in NEW pass (by default they fail, like missing ones).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "markdown"]),
    default="text",
    show_default=True,
    help="markdown: a table for a CI job summary.",
)
def compare(
    base: str,
    new: str,
    tolerance: float,
    metric_tolerances: dict[str, float],
    allow_new: bool,
    fmt: str,
) -> None:
    """Gate NEW against BASE (run directories or runs.csv files). Exit status: 0 no
    regression, 1 a regression (or a configuration on one side only), 2 inputs that cannot
    be compared (empty, unreadable, not a runs.csv, NaN values or tolerances)."""
    try:
        changes = compare_runs(
            load_runs(Path(base)),
            load_runs(Path(new)),
            tolerance,
            metric_tolerances_pct=metric_tolerances,
            allow_new=allow_new,
        )
    except UnusableResults as err:
        raise _Unusable(str(err)) from err
    worse = [c for c in changes if c.worse]
    for line in (_markdown if fmt == "markdown" else _text)(changes):
        click.echo(line)
    if worse:
        raise ConfigError(
            f"{len(worse)} of {len(changes)} metrics got worse than their tolerance "
            f"({tolerance:g} % unless given per metric; see the table above)"
        )
    per_metric = ", ".join(f"{m} {pct:g} %" for m, pct in sorted(metric_tolerances.items()))
    given = f" ({per_metric})" if per_metric else ""
    click.echo(f"no regression: {len(changes)} metrics within {tolerance:g} %{given}")


def _cells(change: Change) -> tuple[str, str, str, str]:
    base = "missing" if change.base is None else f"{change.base:.4g}"
    new = "missing" if change.new is None else f"{change.new:.4g}"
    pct = "" if change.change_pct is None else f"{change.change_pct:+.2f}%"
    return base, new, pct, "WORSE" if change.worse else ""


def _text(changes: list[Change]) -> list[str]:
    width = max((len(c.configuration) for c in changes), default=10)
    lines = [f"{'configuration':<{width}}  {'metric':<24} {'base':>12} {'new':>12} {'change':>9}"]
    for c in changes:
        base, new, pct, flag = _cells(c)
        lines.append(
            f"{c.configuration:<{width}}  {c.metric:<24} {base:>12} {new:>12} {pct:>9}"
            + (f"  {flag}" if flag else "")
        )
    return lines


def _markdown(changes: list[Change]) -> list[str]:
    lines = ["| configuration | metric | base | new | change | |", "|---|---|---|---|---|---|"]
    lines += [f"| {c.configuration} | {c.metric} | {' | '.join(_cells(c))} |" for c in changes]
    return lines
