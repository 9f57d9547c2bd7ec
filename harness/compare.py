"""Regression gate: compare two runs' results metric by metric.

A gate that passes on garbage protects nothing: an empty, unreadable or incomplete runs.csv
(of a run directory: one that lacks configurations its spec.json lists, an interrupted run's,
or one a run still writes), a NaN or negative metric, a duplicate configuration or a NaN
tolerance is `UnusableResults` (the CLI exits 2), a configuration on one side only is a
failure (the CLI exits 1; one only in the new results may be allowed), and every metric has
its direction (times: lower is better, throughput: higher; restarts, lost iterations, failovers
and moved workers: lower) and a tolerance of its own if given.
Only the configurations on both sides have metrics compared; those on one side are counted
and named apart (a `Comparison`). A configuration on both sides must also have been run the
same way (`IDENTITY`: its policy, comm, controller, faulted links, delay, seed and iteration
count; and where both sides are run directories, its fault timeline and its calibration,
`RECORDED`, and its spec's other inputs, `SETUP`): one that differs is a failure, its
metrics measured something else. Under a controller that chooses its comm from what it
measures (`COMM_MEASURED`), the comm is an outcome, as a metric is: one that differs is
shown (`Comparison.outcomes`), not a failure.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from adaptra.control import DetectingController
from harness.resolved import coverage
from harness.results import (
    RESULTS_SCHEMA_VERSION,
    SPEC_VERSION,
    read_spec_record,
    run_dir_holder,
)
from injectors.fault_files import parse_faults
from pipeline.errors import ConfigError

__all__ = [
    "CALIBRATION",
    "COMM_MEASURED",
    "IDENTITY",
    "KEY",
    "METRICS",
    "RAN_BY",
    "RECORDED",
    "TIMELINE",
    "Change",
    "Comparison",
    "Mismatch",
    "UnusableResults",
    "compare_runs",
    "load_runs",
]

METRICS: dict[str, bool] = {
    "median_iteration_ms": False,
    "mean_iteration_ms": False,
    "median_wall_ms": False,
    "throughput_samples_per_s": True,
    "bubble_ratio": False,
    "restarts": False,
    "lost_iterations": False,
    "failovers": False,
    "moved_workers": False,
}
"""Compared metrics, and whether higher is better."""
KEY = ("backend", "model", "system", "scenario", "repeat")
"""What names a configuration (with its repeat)."""
IDENTITY = ("policy", "comm", "controller", "links", "delay_ms", "seed", "iterations")
"""How a configuration was run: equal on both sides."""
COMM_MEASURED = frozenset({DetectingController.name})
"""The controllers whose `comm` is an outcome, not how the run was set up: Adaptra's
detector delegates where it measures a slow link, so one noisy run may delegate and another
not (the oracle chooses from the fault timeline, which is `IDENTITY` already: its comm is)."""
TIMELINE = "faults_text sha256"
"""Not a runs.csv column: what a run directory's spec.json says its fault timeline held
(`faults_text`: the SHA-256's first 12 hex digits of the events it parses to, so that a
comment changes nothing), on the rows of its `trace:` scenario,
whose name is only the file's stem and whose `IDENTITY` cells (no links, no delay) are those
of any timeline. Compared as `IDENTITY` is where both sides have it: a runs.csv alone, or a
spec.json of spec version 1 (the timeline's path only), does not say what the timeline held."""
CALIBRATION = "calibration sha256"
"""Not a runs.csv column: the host costs a run directory's spec.json says its simulator ran
with (`calibration_costs`, the SHA-256's first 12 hex digits of their JSON; "none" without a
calibration), on every row: the same configuration under other costs measured something
else. Compared as `TIMELINE` is."""
RAN_BY = "ran by"
"""Not a runs.csv column: what a run directory's spec.json says ran its configurations, on
every row: `adaptra-bench run` (no `ran_by`), or a cluster job whose results `collect`
gathered (harness.collect): a configuration run on a cluster measured something else than
one run here. Compared as `TIMELINE` is."""
SETUP = "spec "
"""Not runs.csv columns: a run directory's spec.json adds, under names of this prefix, the
inputs a configuration's numbers depend on besides its `IDENTITY` (the fields of the profile
it runs as this version resolves it, a cost-model model's on its hardware, a megatron run's
with its model's bytes; and the run's warm-up iterations, recovery and, in a runtime, its
injection and transport timeout: `ExperimentSpec.setups`), e.g. `spec profile t_f`. Compared
where both sides have them (a spec.json of spec version 1 whose files this version cannot
read again has none)."""
RECORDED = (TIMELINE, CALIBRATION, RAN_BY)
"""What a run directory's spec.json adds to a configuration's identity, besides `SETUP`."""
_UNREAD = "faults_text unread"
"""Not a runs.csv column: on the rows that have `TIMELINE`, why this version cannot read the
timeline's text (saved by an older version that took what this one refuses: its digest is the
text's, which no timeline this version reads has)."""


class UnusableResults(ConfigError):
    """The inputs cannot be compared (not a regression: nothing was measured against)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Change:
    """One metric of a configuration on both sides."""

    configuration: str
    metric: str
    base: float
    new: float
    change_pct: float
    worse: bool
    """Beyond its tolerance in its bad direction."""
    better: bool = False
    """Beyond its tolerance in its good direction (a failure with `both_ways`)."""
    limit_pct: float = math.inf
    """Its tolerance, %."""


@dataclasses.dataclass(frozen=True, slots=True)
class Mismatch:
    """An `IDENTITY` column of a configuration that differs between the sides."""

    configuration: str
    column: str
    base: str
    new: str
    unreadable: str = ""
    """Where this version cannot read a side's fault timeline (`TIMELINE`, saved by an older
    version that took what this one refuses): which side's and why. The sides then cannot be
    matched (not known to be run another way): a failure all the same."""


@dataclasses.dataclass(frozen=True, slots=True)
class Comparison:
    """The metrics compared (configurations on both sides), the configurations run another
    way (`mismatches`), and the configurations on one side only, by name: `missing` from the
    new results (a regression) and `added` in them (a failure unless `allow_new`). With
    `both_ways`, a metric better than its tolerance fails too (a deterministic run's gate:
    its numbers move only where the code changed them)."""

    changes: list[Change]
    missing: list[str]
    added: list[str]
    allow_new: bool
    mismatches: list[Mismatch] = dataclasses.field(default_factory=list)
    both_ways: bool = False
    outcomes: list[Mismatch] = dataclasses.field(default_factory=list)
    """The comm of configurations whose controller chose it (`COMM_MEASURED`) where the
    sides differ: shown, not a failure."""

    @property
    def worse(self) -> list[Change]:
        return [c for c in self.changes if c.worse]

    @property
    def better(self) -> list[Change]:
        return [c for c in self.changes if c.better]

    @property
    def failed(self) -> bool:
        """A metric worse than its tolerance (or, `both_ways`, better), a configuration run
        another way, one missing, or one added (unless allowed)."""
        return bool(
            self.worse
            or (self.both_ways and self.better)
            or self.mismatches
            or self.missing
            or (self.added and not self.allow_new)
        )


def load_runs(path: Path) -> list[dict[str, Any]]:
    """runs.csv of a run directory, or a runs.csv file itself: every row with its key columns,
    its `IDENTITY` columns and every metric a finite number >= 0 (a column missing is damage:
    this schema version's runs.csv has them all, and one left out would not be compared); a
    run directory's run has ended and run every configuration its spec.json lists."""
    if path.is_dir():
        holder = run_dir_holder(path)
        if holder is not None:
            raise UnusableResults(
                f"{path} is still being written by a run (pid {holder}): compare it once that "
                "run has ended"
            )
    csv_path = path / "runs.csv" if path.is_dir() else path
    if not csv_path.is_file():
        if path.is_dir() and (path / "spec.json").is_file():  # stopped before its first result
            _check_finished(path, [], has_runs=False)  # says how to resume it
        raise UnusableResults(f"{path} is not a run directory: it has no runs.csv")
    try:
        with csv_path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            rows = list(reader)
            columns = list(reader.fieldnames or [])
    except (csv.Error, UnicodeDecodeError, OSError) as err:
        raise UnusableResults(f"{csv_path} is not a readable CSV file: {err}") from None
    missing = [c for c in (*KEY, *IDENTITY, *METRICS, "schema_version") if c not in columns]
    if missing and "schema_version" in columns:  # an older version's lacks later columns
        said = sorted({r["schema_version"] for r in rows if r.get("schema_version")})
        if said and said != [str(RESULTS_SCHEMA_VERSION)]:
            raise UnusableResults(_another_version(csv_path, said))
    if columns and missing:  # every runs.csv of this schema version has them all
        if all(metric in missing for metric in METRICS):
            missing = [*(c for c in missing if c not in METRICS), "every metric"]
        raise UnusableResults(
            f"{csv_path} is not a runs.csv (nor a run directory): it lacks {', '.join(missing)}"
        )
    if not rows:
        raise UnusableResults(f"{csv_path} holds no results (a header at most)")
    for number, row in enumerate(rows, start=2):  # line 1 is the header
        if None in row.values():
            raise UnusableResults(
                f"{csv_path} line {number} has fewer fields than columns: damaged or cut short?"
            )
    versions = sorted({str(r.get("schema_version", "")) for r in rows})
    if versions != [str(RESULTS_SCHEMA_VERSION)]:
        raise UnusableResults(_another_version(csv_path, versions))
    seen: set[tuple[str, ...]] = set()
    for number, row in enumerate(rows, start=2):  # line 1 is the header
        key = _key(row)
        if key in seen or None in row:
            problem = "repeats a configuration" if key in seen else "has more fields than columns"
            raise UnusableResults(f"{csv_path} line {number} {problem}")
        seen.add(key)
        for metric in METRICS:
            try:
                value = float(row[metric])
            except (TypeError, ValueError):
                value = math.nan
            if not (math.isfinite(value) and value >= 0):
                raise UnusableResults(
                    f"{csv_path} line {number}: {metric} is {row[metric]!r}, not a valid value "
                    "(a finite number >= 0)"
                )
    if path.is_dir() and (path / "spec.json").is_file():
        record = _check_finished(path, rows)
        spec = record["spec"]
        timeline, unread = _timeline_digest(spec)
        if timeline is not None:
            for row in rows:
                if str(row["scenario"]).startswith("trace:"):
                    row[TIMELINE] = timeline
                    if unread is not None:
                        row[_UNREAD] = unread
        costs = spec.get("calibration_costs")
        if isinstance(costs, dict) or spec.get("calibration") is None:
            digest = _digest(json.dumps(costs, sort_keys=True)) if costs else "none"
            for row in rows:
                row[CALIBRATION] = digest
        ran_by = record.get("ran_by")
        for row in rows:
            row[RAN_BY] = ran_by if isinstance(ran_by, str) else "adaptra-bench run"
        setups = _setups(record, path)
        for row in rows:
            for name, value in setups.get(str(row["model"]), {}).items():
                row[SETUP + name] = value
    return rows


def _another_version(csv_path: Path, versions: Sequence[str]) -> str:
    return (
        f"{csv_path} has results schema version {', '.join(versions)}; this version reads "
        f"{RESULTS_SCHEMA_VERSION} only (run it again)"
    )


def _setups(record: dict[str, Any], path: Path) -> dict[str, dict[str, Any]]:
    """`ExperimentSpec.setups` of run directory `path`'s spec.json record; none for one of
    spec version 1, which kept the paths of the files it read only; one of this version that
    this version cannot read is damaged."""
    from harness.spec import spec_from_record  # loads the engines

    try:
        return spec_from_record(record).setups()
    except (ConfigError, TypeError) as err:
        if record["spec_version"] < SPEC_VERSION:
            return {}
        raise UnusableResults(
            f"{path / 'spec.json'}: {err} (its runs.csv, given alone, is compared without the "
            "checks it allows)"
        ) from None


def _timeline_digest(spec: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """The digest of the fault timeline a spec record holds (`TIMELINE`): of the events its
    text parses to, their rows and lines left out (a comment or a blank line changes no
    measurement), or of the text where this version cannot parse it, then with the error
    (`_UNREAD`); None where it holds no text."""
    text, path = spec.get("faults_text"), spec.get("faults")
    if not isinstance(text, str) or not isinstance(path, str):
        return None, None
    try:
        events = parse_faults(text, path).events
    except ConfigError as err:
        return _digest(text), str(err)
    digest = _digest(repr(tuple(dataclasses.replace(event, row=0, line=0) for event in events)))
    return digest, None


def _digest(text: str) -> str:
    """The first 12 hex digits of `text`'s SHA-256."""
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _check_finished(
    run_dir: Path, rows: list[dict[str, Any]], has_runs: bool = True
) -> dict[str, Any]:
    """A run directory's runs.csv holds every configuration its spec.json lists: an
    interrupted run's does not, and what it has not run yet is no regression. Its spec.json's
    record (`read_spec_record`) where it does."""
    try:
        record = read_spec_record(run_dir)
        from harness.spec import (  # loads the engines
            finish_advice,
            resolved_from_record,
            spec_from_record,
        )

        done = coverage(resolved_from_record(record, run_dir / "spec.json"), rows)
        if done.complete:
            return record
        try:
            spec = spec_from_record(record)
        except ConfigError as err:  # a field of its spec refused: name the file
            raise ConfigError(f"{run_dir / 'spec.json'}: {err}") from err
        advice = finish_advice(record, spec, run_dir)
    except (ConfigError, TypeError) as err:  # spec.json damaged, or too old to resolve
        where = "" if isinstance(err, ConfigError) else f"{run_dir / 'spec.json'}: "
        alone = " (its runs.csv, given alone, is compared without this check)" if has_runs else ""
        raise UnusableResults(f"{where}{err}{alone}") from None
    raise UnusableResults(
        f"{run_dir} is an unfinished run ({done}): {advice} and compare it once finished"
    )


def _name(key: tuple[str, ...]) -> str:
    return " ".join(key[1:4]) + ("" if key[4] == "0" else f" #{key[4]}")


def _check_tolerance(metric: str, pct: float) -> None:
    if not (math.isfinite(pct) and pct >= 0):
        raise UnusableResults(f"the tolerance of {metric} must be finite and >= 0 %, not {pct}")


_SLACK = 1e-9
"""Relative to the tolerance: a change of exactly it (104 -> 109.2 at 5 %) computes as
5.000000000000002 %, which is within it. A tolerance of 0 has no slack: only equal passes."""
_ZERO_NOISE = 1e-12
"""A bubble ratio (1 - busy / span, clamped at 0) no more than this on both sides has not
changed: a sum's rounding, not a regression (of 0 or of 2.2e-16, any change is infinite or
100 %). Every other metric is compared as written."""


def _beyond(worse_by_pct: float, limit_pct: float) -> bool:
    """Worse than the tolerance, a change of the tolerance itself (as floats compute it) not."""
    return worse_by_pct > limit_pct and not math.isclose(worse_by_pct, limit_pct, rel_tol=_SLACK)


def compare_runs(
    base: Sequence[Mapping[str, Any]],
    new: Sequence[Mapping[str, Any]],
    tolerance_pct: float,
    *,
    metric_tolerances_pct: Mapping[str, float] | None = None,
    allow_new: bool = False,
    both_ways: bool = False,
) -> Comparison:
    """Every metric of every configuration on both sides (rows as `load_runs` gives them),
    worse (better) where beyond its tolerance (`metric_tolerances_pct`, else `tolerance_pct`)
    in its bad (good) direction; those run another way (`IDENTITY`, `RECORDED`); and the
    configurations only in `base` or only in `new`, by name. `both_ways`: a better metric
    fails as a worse one does (`Comparison`)."""
    tolerances = dict(metric_tolerances_pct or {})
    unknown = sorted(set(tolerances) - set(METRICS))
    if unknown:
        raise UnusableResults(
            f"no metric {', '.join(unknown)}; the compared metrics: {', '.join(METRICS)}"
        )
    _check_tolerance("every metric", tolerance_pct)
    for metric, pct in tolerances.items():
        _check_tolerance(metric, pct)
    base_by_key = {_key(r): r for r in base}
    new_by_key = {_key(r): r for r in new}
    changes, mismatches, outcomes = [], [], []
    other_backend = _on_another_backend(base_by_key.keys(), new_by_key.keys())
    for key, row in base_by_key.items():
        if key in other_backend:
            mismatches.append(Mismatch(_name(key), "backend", key[0], other_backend[key][0]))
        elif key in new_by_key:
            other = new_by_key[key]
            changes += _changes(key, row, other, tolerance_pct, tolerances)
            differing = [
                Mismatch(_name(key), column, str(row[column]), str(other.get(column)))
                for column in IDENTITY
                if column in row and not _same(row[column], other.get(column))
            ]
            measured = row.get("controller") in COMM_MEASURED
            mismatches += [m for m in differing if not (measured and m.column == "comm")]
            outcomes += [m for m in differing if measured and m.column == "comm"]
            mismatches += [
                Mismatch(
                    _name(key), column, row[column], other[column], _unread(column, row, other)
                )
                for column in RECORDED
                if column in row and column in other and row[column] != other[column]
            ]
            mismatches += _setup_mismatches(_name(key), row, other)
    backends = {key[0] for key in (*base_by_key, *new_by_key)}

    def listed(key: tuple[str, ...]) -> str:  # one name may be on several backends
        return f"{key[0]} {_name(key)}" if len(backends) > 1 else _name(key)

    return Comparison(
        changes=changes,
        missing=[listed(k) for k in base_by_key if k not in new_by_key and k not in other_backend],
        added=[
            listed(k)
            for k in new_by_key
            if k not in base_by_key and k not in other_backend.values()
        ],
        allow_new=allow_new,
        mismatches=mismatches,
        both_ways=both_ways,
        outcomes=outcomes,
    )


def _unread(column: str, base: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """`Mismatch.unreadable` of a configuration whose `column` differs: where it is the
    `TIMELINE`, which side's timeline this version cannot read, and why; else, or where it
    reads both, ""."""
    sides = [("BASE", base), ("NEW", new)] if column == TIMELINE else []
    return "; ".join(f"{side}'s: {row[_UNREAD]}" for side, row in sides if _UNREAD in row)


def _on_another_backend(
    base: Iterable[tuple[str, ...]], new: Iterable[tuple[str, ...]]
) -> dict[tuple[str, ...], tuple[str, ...]]:
    """The configurations of `base` that `new` has under its own name on another backend
    only (`KEY` leads with the backend, which `_name` leaves out): each with its new key.
    Run another way, not missing on one side and added on the other under one name."""
    base_keys, new_keys = set(base), set(new)
    only_new: dict[tuple[str, ...], tuple[str, ...]] = {}
    for key in sorted(new_keys - base_keys):  # the first backend by name, on every run
        only_new.setdefault(key[1:], key)
    return {
        key: only_new.pop(key[1:]) for key in sorted(base_keys - new_keys) if key[1:] in only_new
    }


def _setup_mismatches(name: str, base: Mapping[str, Any], new: Mapping[str, Any]) -> list[Mismatch]:
    """The `SETUP` columns of a configuration that differ (as values: 400 is 400.0), where
    both sides have some."""
    columns = [c for c in dict.fromkeys((*base, *new)) if c.startswith(SETUP)]
    if not any(c in base for c in columns) or not any(c in new for c in columns):
        return []

    def cell(row: Mapping[str, Any], column: str) -> str:
        value = row.get(column, "(none)")
        return value if isinstance(value, str) else json.dumps(value)

    return [
        Mismatch(name, column, cell(base, column), cell(new, column))
        for column in columns
        if column not in base or column not in new or base[column] != new[column]
    ]


def _same(base: Any, new: Any) -> bool:
    """Whether two cells say the same: equal text, or equal numbers ("10" and "10.0")."""
    if str(base) == str(new):
        return True
    try:
        return float(base) == float(new)
    except (TypeError, ValueError):
        return False


def _key(row: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(str(row[k]) for k in KEY)


def _changes(
    key: tuple[str, ...],
    before_row: Mapping[str, Any],
    after_row: Mapping[str, Any],
    tolerance_pct: float,
    tolerances: Mapping[str, float],
) -> list[Change]:
    """One configuration's metrics, base against new (one the base row lacks: none)."""
    changes = []
    for metric, higher_is_better in METRICS.items():
        if before_row.get(metric) in (None, ""):
            continue  # rows given without it (`load_runs` gives every metric)
        if after_row.get(metric) in (None, ""):
            raise UnusableResults(f"the new results have no {metric} for {_name(key)}")
        before, after = float(before_row[metric]), float(after_row[metric])
        rounding = metric == "bubble_ratio" and max(abs(before), abs(after)) <= _ZERO_NOISE
        if after == before or rounding:
            pct = 0.0
        elif before:
            pct = 100.0 * (after - before) / abs(before)
        else:  # of nothing, any change is infinite
            pct = math.copysign(math.inf, after)
        worse_by = -pct if higher_is_better else pct
        limit = tolerances.get(metric, tolerance_pct)
        changes.append(
            Change(
                _name(key),
                metric,
                before,
                after,
                pct,
                worse=_beyond(worse_by, limit),
                better=_beyond(-worse_by, limit),
                limit_pct=limit,
            )
        )
    return changes
