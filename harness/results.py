"""Result files: atomic writes, the run directory's CSVs and its provenance."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "ITERATIONS_COLUMNS",
    "RUNS_COLUMNS",
    "fault_free_wall_ms",
    "git_revision",
    "read_csv_rows",
    "write_atomic",
    "write_csv_atomic",
    "write_json_atomic",
]

RESULTS_SCHEMA_VERSION = 2
"""2: runs.csv and iterations.csv gained `controller`; runs.csv `restarts`,
`lost_iterations`, `restart_wall_ms` and `restart_model_ms`."""

RUNS_COLUMNS = (
    "run_id",
    "backend",
    "model",
    "policy",
    "comm",
    "system",
    "controller",
    "scenario",
    "links",
    "delay_ms",
    "repeat",
    "seed",
    "iterations",
    "mean_iteration_ms",
    "median_iteration_ms",
    "median_wall_ms",
    "throughput_samples_per_s",
    "bubble_ratio",
    "restarts",
    "lost_iterations",
    "restart_wall_ms",
    "restart_model_ms",
    "params_sha256",
    "schema_version",
)
ITERATIONS_COLUMNS = (
    "run_id",
    "backend",
    "model",
    "policy",
    "comm",
    "system",
    "controller",
    "scenario",
    "repeat",
    "iteration",
    "iteration_time_ms",
    "step_time_ms",
    "bubble_ratio",
    "loss",
)


def fault_free_wall_ms(runs: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], float]:
    """Each (model, system)'s median step in its fault-free scenario: the slowdown baseline."""
    return {
        (r["model"], r["system"]): float(r["median_wall_ms"])
        for r in runs
        if r["scenario"] == "fault-free"
    }


def write_atomic(path: Path, text: str) -> None:
    """Write through a temporary file and rename: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", newline="") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_csv_atomic(path: Path, columns: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_atomic(path, buffer.getvalue())


def read_csv_rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def write_json_atomic(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=1) + "\n")


def git_revision() -> str:
    """The checkout's commit, or "unknown" outside a git work tree."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=Path(__file__).resolve().parent,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"
