"""Regression gate: compare two runs' results metric by metric."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.results import RESULTS_SCHEMA_VERSION, read_csv_rows
from pipeline.errors import ConfigError

__all__ = ["METRICS", "Change", "compare_runs", "load_runs"]

METRICS: dict[str, bool] = {
    "median_iteration_ms": False,
    "mean_iteration_ms": False,
    "median_wall_ms": False,
    "throughput_samples_per_s": True,
    "bubble_ratio": False,
}
"""Compared metrics, and whether higher is better."""
_KEY = ("backend", "model", "system", "scenario", "repeat")


@dataclasses.dataclass(frozen=True, slots=True)
class Change:
    configuration: str
    metric: str
    base: float | None
    new: float | None
    change_pct: float | None
    worse: bool


def load_runs(path: Path) -> list[dict[str, Any]]:
    """runs.csv of a run directory, or a runs.csv file itself."""
    csv_path = path / "runs.csv" if path.is_dir() else path
    if not csv_path.exists():
        raise ConfigError(f"no results at {csv_path}")
    rows = read_csv_rows(csv_path)
    versions = sorted({str(r.get("schema_version", "")) for r in rows})
    if versions and versions != [str(RESULTS_SCHEMA_VERSION)]:
        raise ConfigError(
            f"{csv_path} has results schema version {', '.join(versions)}; this version reads "
            f"{RESULTS_SCHEMA_VERSION} only (run it again)"
        )
    return rows


def compare_runs(
    base: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]], tolerance_pct: float
) -> list[Change]:
    """Every metric of every configuration in `base`; worse means beyond the tolerance in the
    bad direction, or missing from `new`."""
    if tolerance_pct < 0:
        raise ConfigError(f"the tolerance must be >= 0 %, got {tolerance_pct:g}")
    new_by_key = {tuple(str(r[k]) for k in _KEY): r for r in new}
    changes = []
    for row in base:
        key = tuple(str(row[k]) for k in _KEY)
        name = " ".join(key[1:4]) + ("" if key[4] == "0" else f" #{key[4]}")
        other = new_by_key.get(key)
        for metric, higher_is_better in METRICS.items():
            if row.get(metric) in (None, ""):
                continue  # a baseline older than the metric
            before = float(row[metric])
            if other is None:
                changes.append(Change(name, metric, before, None, None, True))
                continue
            after = float(other[metric])
            pct = (
                0.0
                if after == before
                else (100.0 * (after - before) / abs(before) if before else float("inf"))
            )
            worse_by = -pct if higher_is_better else pct
            changes.append(Change(name, metric, before, after, pct, worse_by > tolerance_pct))
    return changes
