"""`compare`: the regression gate over two runs' results (harness.compare)."""

from __future__ import annotations

from pathlib import Path

import click

from harness.compare import (
    Change,
    Comparison,
    Mismatch,
    UnusableResults,
    compare_runs,
    load_runs,
)
from harness.names import markdown_cell
from pipeline.errors import ConfigError

__all__ = ["compare"]


class _Unusable(click.ClickException):
    exit_code = 2


def _metric_tolerance(
    _ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> dict[str, float]:
    tolerances: dict[str, float] = {}
    for value in values:
        metric, sep, pct = value.partition("=")
        try:
            percent = float(pct)
        except ValueError:
            sep = ""
        if not sep:
            raise click.BadParameter(f"{value!r} is not METRIC=PERCENT", param=param)
        if metric in tolerances:  # which one holds would depend on their order
            raise click.BadParameter(f"{metric} is given more than once", param=param)
        tolerances[metric] = percent
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
    help="A metric's own tolerance (repeatable, once per metric), e.g. median_wall_ms=20.",
)
@click.option(
    "--allow-new",
    is_flag=True,
    help="Configurations only in NEW pass, not compared (by default they fail; one missing "
    "from NEW is always a regression).",
)
@click.option(
    "--both-ways",
    is_flag=True,
    help="A metric better than its tolerance fails too (a deterministic run's gate: with "
    "--tolerance 0 only equal values pass).",
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
    both_ways: bool,
    fmt: str,
) -> None:
    """Gate NEW against BASE (run directories or runs.csv files): the metrics of the
    configurations in both, then those in one only. Exit status: 0 no regression, 1 a
    regression (a metric worse than its tolerance, or with --both-ways better than it too;
    a configuration run another way: its backend,
    policy, comm (unless its controller chose it: Adaptra's detector), controller, links,
    delay, seed or iterations, or, where both are run
    directories, fault timeline, calibration or another input of its spec: its profile, model,
    hardware, injection, warm-up iterations or recovery; one whose saved fault timeline this
    version does not read cannot be matched; or one of BASE missing from NEW) or a
    configuration only in NEW (unless --allow-new), 2 inputs that cannot be compared
    (empty, unreadable, not a runs.csv, NaN or negative values or tolerances, another schema
    version, a repeated configuration, a run directory of an unfinished run or one a run
    still writes)."""
    try:
        result = compare_runs(
            load_runs(Path(base)),
            load_runs(Path(new)),
            tolerance,
            metric_tolerances_pct=metric_tolerances,
            allow_new=allow_new,
            both_ways=both_ways,
        )
    except UnusableResults as err:
        raise _Unusable(str(err)) from err
    table = _markdown if fmt == "markdown" else _text
    for line in [*table(result.changes), *_one_side(result, bullet=fmt == "markdown")]:
        click.echo(line)
    if result.failed:
        raise ConfigError("; ".join(_failures(result, tolerance)))
    per_metric = ", ".join(f"{m} {pct:g} %" for m, pct in sorted(metric_tolerances.items()))
    given = f" ({per_metric})" if per_metric else ""
    added = (
        f"; {_configurations(len(result.added))} only in NEW, not compared (--allow-new)"
        if result.added
        else ""
    )
    num = len(result.changes)
    if result.better and not both_ways:  # "within" read as none moved more, under those that did
        said = (
            f"none of {num} metrics worse than {tolerance:g} %{given} ({len(result.better)} "
            "better by more: flagged BETTER above)"
        )
    else:
        said = f"{num} metrics within {tolerance:g} %{' either way' if both_ways else ''}{given}"
    click.echo(f"no regression: {said}{added}")


def _configurations(count: int) -> str:
    return f"{count} configuration{'' if count == 1 else 's'}"


def _failures(result: Comparison, tolerance: float) -> list[str]:
    """What failed the gate, each in a few words (one error line)."""
    failures = []
    if result.worse:
        failures.append(
            f"{len(result.worse)} of {len(result.changes)} metrics got worse than their "
            f"tolerance ({tolerance:g} % unless given per metric; see the table above)"
        )
    if result.both_ways and result.better:
        failures.append(
            f"{len(result.better)} of {len(result.changes)} metrics got better than their "
            f"tolerance, which --both-ways fails too ({tolerance:g} % unless given per metric; "
            "flagged BETTER above)"
        )
    unmatched = {m.configuration for m in result.mismatches if m.unreadable}
    if unmatched:
        failures.append(
            f"{_configurations(len(unmatched))} cannot be matched: a fault timeline saved by an "
            "older version does not read with this one (listed above)"
        )
    another_way = {m.configuration for m in result.mismatches if not m.unreadable}
    if another_way:
        runs = len(another_way)
        failures.append(
            f"{_configurations(runs)} run another way in NEW (backend, policy, comm, "
            "controller, links, delay, fault timeline, seed, iterations, what ran it or its "
            "spec's other inputs; listed above): "
            "not the same measurement"
        )
    if result.missing:
        failures.append(
            f"regression: {_configurations(len(result.missing))} of BASE missing from NEW "
            "(listed above)"
        )
    if result.added and not result.allow_new:
        failures.append(
            f"{_configurations(len(result.added))} only in NEW, not compared (listed above; "
            "--allow-new lets them pass)"
        )
    return failures


def _one_side(result: Comparison, *, bullet: bool) -> list[str]:
    """A line per configuration run another way or on one side only, after the table."""
    start = "- " if bullet else ""
    lines = [start + _mismatch_line(m) for m in result.mismatches]
    lines += [
        f"{start}ran over another comm, as its controller chose (an outcome, not a failure): "
        f"{m.configuration}: {m.base!r} -> {m.new!r}"
        for m in result.outcomes
    ]
    lines += [f"{start}missing from NEW (a regression): {name}" for name in result.missing]
    allowed = " (allowed by --allow-new)" if result.allow_new else ""
    lines += [f"{start}only in NEW, not compared{allowed}: {name}" for name in result.added]
    return ["", *lines] if lines else []


def _mismatch_line(m: Mismatch) -> str:
    """A configuration run another way, or one whose fault timelines cannot be matched."""
    if m.unreadable:
        return (
            f"cannot be matched: {m.configuration}: the fault timeline saved in spec.json does "
            f"not read with this version, so whether both ran the same is unknown ({m.unreadable})"
        )
    return f"run another way in NEW: {m.configuration}: {m.column} {m.base!r} -> {m.new!r}"


def _cells(change: Change) -> tuple[str, str, str, str]:
    base, new = _numbers(change.base, change.new)
    flagged = change.worse or change.better
    pct = f"{change.change_pct:+.2f}%"
    if change.change_pct and float(pct[:-1]) == 0:  # under 0.005 %: its first digits
        pct = f"{change.change_pct:+.2g}%"
    for digits in range(3, 17):  # a change of the tolerance passes: one flagged is beyond it
        if not flagged or abs(float(pct[:-1])) != change.limit_pct:
            break
        pct = f"{change.change_pct:+.{digits}f}%"
    return base, new, pct, "WORSE" if change.worse else "BETTER" if change.better else ""


def _numbers(base: float, new: float) -> tuple[str, str]:
    """4 significant digits, or as many more as tell two different numbers apart (a change
    flagged WORSE never prints as two equal numbers)."""
    for digits in range(4, 18):  # 17 digits tell any two doubles apart
        shown = f"{base:.{digits}g}", f"{new:.{digits}g}"
        if base == new or shown[0] != shown[1]:
            return shown
    return repr(base), repr(new)


def _text(changes: list[Change]) -> list[str]:
    width = max((len(c.configuration) for c in changes), default=len("configuration"))
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
    lines += [
        f"| {markdown_cell(c.configuration)} | {c.metric} | {' | '.join(_cells(c))} |"
        for c in changes
    ]
    return lines
