"""Result files: the run directory's CSVs, its spec record and its provenance."""

from __future__ import annotations

import contextlib
import csv
import fcntl
import json
import math
import os
import statistics
import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.resolved import configuration_name
from pipeline.errors import ConfigError
from pipeline.files import atomic_writer, read_json, write_atomic

__all__ = [
    "ITERATIONS_COLUMNS",
    "MESSAGES_COLUMNS",
    "RESULTS_SCHEMA_VERSION",
    "RUNS_COLUMNS",
    "SPEC_VERSION",
    "append_csv_atomic",
    "fault_free_wall_ms",
    "git_revision",
    "read_csv_rows",
    "read_iterations",
    "read_spec_record",
    "run_dir_held",
    "run_dir_holder",
    "write_csv_atomic",
    "write_json_atomic",
]

RESULTS_SCHEMA_VERSION = 9
"""9: `num_delegates`, the delegates per link direction and side that messages went through:
iterations.csv's per iteration run (0: none delegated), runs.csv's the most of any. 8:
`moved_workers`, the workers a rank swap moved to another position: iterations.csv's per
iteration run (at its start), runs.csv's over the configuration's. 7: `failovers`, the
delegates' moves to another NIC: iterations.csv's per iteration run, runs.csv's over the
configuration's. 6: iterations.csv's `microbatches`: the global batch's split over the DP
replicas where a rebalance made it uneven ("12+4"; empty: equal). 5: iterations.csv says what
the controller believed and ran: `detected_ms` (a JSON object by link: `0-1`, `pp0:0-1`,
`dp1:0-1`) and `link_comms` (one by PP link),
`policy` the iteration's (adaptra: "adaptra"; files written before 2026-12-05 also "adaptra-
initial"). 4: the saved timelines are of timeline schema 4 (messages' wire start, copy in and
carrier: pipeline.timeline). 3: a run directory keeps what its engines measured: messages.csv
and timelines/ (the drawn iterations' full timelines, from which the report draws its Gantt
charts; docs/design.md, "Results"). 2: runs.csv and iterations.csv gained `controller`;
runs.csv `restarts`, `lost_iterations`, `restart_wall_ms` and `restart_model_ms`."""

SPEC_VERSION = 2
"""spec.json's `spec_version`, the form of its spec (its `schema_version` is the results'):
2: the spec keeps what it read from the files it names, the fault timeline's text
(`faults_text`) and the calibration's costs (`calibration_costs`). 1 (no `spec_version`):
their paths only; still read (a report reads the files again; a resume with either is
refused, as what the files held then is unknown)."""

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
    "failovers",
    "moved_workers",
    "num_delegates",
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
    "detected_ms",
    "link_comms",
    "microbatches",
    "failovers",
    "moved_workers",
    "num_delegates",
)
MESSAGES_COLUMNS = (
    "model",
    "system",
    "scenario",
    "repeat",
    "iteration",
    "link",
    "direction",
    "replica",
    "num_messages",
    "num_bytes",
    "first_send_start_ms",
    "last_send_end_ms",
    "last_arrival_ms",
    "send_ms",
    "fault_ms",
    "waited_ms",
)
"""One row per link direction (and replica) of every measured iteration (harness.saved writes
them): its messages' count and bytes, the first send's start, the last send's end and the last
arrival (ms from the iteration's start), and sums over its messages of the send time, the
injected `fault_ms` and the consumers' wait (arrival - needed where positive); rounded to 1 us.
The whole timelines of the drawn iterations are in timelines/."""


_NUMBER_COLUMNS = frozenset(
    {
        "delay_ms", "repeat", "seed", "iterations", "mean_iteration_ms", "median_iteration_ms",
        "median_wall_ms", "throughput_samples_per_s", "bubble_ratio", "restarts",
        "lost_iterations", "restart_wall_ms", "restart_model_ms", "iteration",
        "iteration_time_ms", "step_time_ms", "loss", "replica", "num_messages",
        "num_bytes", "first_send_start_ms", "last_send_end_ms", "last_arrival_ms", "send_ms",
        "fault_ms", "waited_ms", "failovers", "moved_workers", "num_delegates",
    }
)  # fmt: skip
"""The result tables' columns that hold a number. In those `read_csv_rows` reads (runs.csv,
iterations.csv): a finite one >= 0 (the harness writes no other), except `_ANY_NUMBER`'s; a
whole one in `_COUNT_COLUMNS`, one > 0 in `_POSITIVE`."""
_COUNT_COLUMNS = frozenset(
    {
        "repeat", "seed", "iterations", "restarts", "lost_iterations", "iteration", "replica",
        "num_messages", "num_bytes", "failovers", "moved_workers", "num_delegates",
    }
)  # fmt: skip
"""Number columns that hold counts and indices: whole numbers."""
_ANY_NUMBER = frozenset({"loss"})
"""Number columns that may hold any number, nan and inf too: the loss a training computed
(a diverged one's is nan or inf)."""
_POSITIVE = frozenset({"iteration_time_ms"})
"""Number columns that are above 0 in every file the harness writes (an iteration takes
time: a profile's ops are not all 0 ms, and `collect` refuses one that took none): the
throughput over a fault timeline divides by it."""
_MAY_BE_EMPTY = frozenset({"loss"})
"""Number columns that may hold nothing: iterations.csv's loss (a run without a model has
none). Any other empty number cell is damage: a report or a resume must not build on it."""


def _number_problem(column: str, text: str) -> str | None:
    """Why `text` cannot be a number column's cell (None where it can): what the harness
    never writes there. Damage, not a measurement: a report or a resume must not build on
    it (an inf count crashed both; a nan time dropped a system from the report's headline)."""
    if not text:
        return None if column in _MAY_BE_EMPTY else "empty, not a number"
    try:
        value = float(text)
    except ValueError:
        return f"{text!r}, not a number"
    if column in _ANY_NUMBER:
        return None
    if not (math.isfinite(value) and value >= 0):
        return f"{text!r}, not a finite number >= 0"
    if column in _POSITIVE and not value > 0:
        return f"{text!r}, not a number > 0"
    if column in _COUNT_COLUMNS and not value.is_integer():
        return f"{text!r}, not a whole number"
    return None


def fault_free_wall_ms(runs: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], float]:
    """Each (model, system)'s median step in its fault-free scenario, the median over its
    repeats: the slowdown baseline (none where it is 0 ms: nothing is slower by a factor)."""
    steps: dict[tuple[str, str], list[float]] = {}
    for r in runs:
        if r["scenario"] == "fault-free":
            steps.setdefault((r["model"], r["system"]), []).append(float(r["median_wall_ms"]))
    medians = {key: statistics.median(values) for key, values in steps.items()}
    return {key: ms for key, ms in medians.items() if ms > 0}


_PROBE_WAIT_S = 1.0
"""How long a hold waits for a lock that may be `run_dir_holder`'s probe (held for
microseconds) before it refuses."""


@contextlib.contextmanager
def run_dir_held(
    run_dir: Path,
    *,
    advice: str = "wait for it to end or pick another --run-id",
    shared: bool = False,
) -> Iterator[None]:
    """This process's hold on a run directory (an flock on its `.lock`, released however the
    process ends): a second run of the same directory, or a report of it, refuses instead of
    racing it, with `advice` after saying who holds it. `shared`: a reader's (a report's),
    which other readers may hold too (and `compare`'s probe passes) and no run. A lock held
    by someone else is tried again for `_PROBE_WAIT_S` first: it may be `run_dir_holder`'s
    probe. A lock its holder removed as it let go (a run that wrote nothing removes its
    folder: harness.experiment) is not held: the folder and the lock are made again."""
    deadline = time.monotonic() + _PROBE_WAIT_S
    while True:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError) as err:
            raise ConfigError(
                f"{run_dir} cannot be a run directory: a file is in the way (there or above)"
            ) from err
        try:
            fd = os.open(run_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # the folder removed by its holder as it let go?
            if time.monotonic() < deadline:
                continue
            raise
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            if time.monotonic() < deadline:
                time.sleep(0.01)
                continue
            raise ConfigError(
                f"{run_dir} is in use by another run or report (pid {holder}); {advice}"
            ) from None
        if os.fstat(fd).st_nlink:
            break
        os.close(fd)  # removed by the holder it waited for
    try:
        os.ftruncate(fd, 0)  # the latest holder's pid: the one a refusal names
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def run_dir_holder(run_dir: Path) -> str | None:
    """The pid of the run that holds `run_dir` now (`run_dir_held`), or None where none does;
    for a reader that must not wait for it, nor create or write the `.lock` (compare)."""
    try:
        fd = os.open(run_dir / ".lock", os.O_RDONLY)
    except OSError:  # none (never held), or not ours to read: not known to be held
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
    finally:
        os.close(fd)  # releases the shared lock, if it was taken
    return None


def write_csv_atomic(path: Path, columns: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> None:
    with atomic_writer(path) as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def append_csv_atomic(
    path: Path, columns: Sequence[str], rows: Iterable[Mapping[str, Any]]
) -> None:
    """`rows` after the rows `path` holds (a header first where there is no file), written
    atomically as `write_csv_atomic` writes: the old rows are copied (in the kernel where it
    can), not written again row by row, so a run's Nth configuration costs it no more CSV
    rows than its own (rewriting every row made a run quadratic in its configurations: 1,600
    took 187 s, the last 400 of them 65 s). `path` must end with a line end (as written here:
    harness.experiment writes a resumed run's files anew first)."""
    with atomic_writer(path, append=True) as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns), lineterminator="\n")
        if not handle.tell():
            writer.writeheader()
        writer.writerows(rows)


def read_csv_rows(path: Path, columns: Sequence[str]) -> list[dict[str, Any]]:
    """The rows of a result CSV this version wrote (none if there is no file): its header must
    be `columns`, every row must have each of them and no more, each number column a finite
    number >= 0, a whole one for a count or an index (only a loss may be empty, nan or inf:
    `_number_problem`), every `schema_version` must be this version's, and runs.csv
    must have one row per configuration (model, system, scenario, repeat). Anything
    else (a truncated, edited or older file) is refused: a resumed run or a report must not
    build on it."""
    if not path.exists():
        return []
    try:
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            header = tuple(reader.fieldnames or ())
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise ConfigError(f"cannot read {path}: {err}") from err
    if header != tuple(columns):
        raise ConfigError(f"{path} does not have the columns this version writes: damaged?")
    for number, row in enumerate(rows, start=2):  # line 1 is the header
        if None in row or None in row.values():
            raise ConfigError(f"{path} line {number} does not have {len(columns)} fields: damaged?")
        for column in sorted(_NUMBER_COLUMNS.intersection(row), key=header.index):
            problem = _number_problem(column, row[column])
            if problem is not None:
                raise ConfigError(f"{path} line {number}: {column} is {problem}: damaged?")
        version = row.get("schema_version", str(RESULTS_SCHEMA_VERSION))
        if version != str(RESULTS_SCHEMA_VERSION):
            raise ConfigError(
                f"{path} line {number} is of schema version {version!r}; this version reads "
                f"{RESULTS_SCHEMA_VERSION} only"
            )
    if tuple(columns) == RUNS_COLUMNS:  # a row per configuration: a second would count twice
        first: dict[tuple[str, str, str, str], int] = {}
        for number, row in enumerate(rows, start=2):
            line = first.setdefault(_configuration(row), number)
            if line != number:
                raise ConfigError(
                    f"{path} line {number} repeats line {line}'s configuration, "
                    f"{_configuration_name(row)}: damaged?"
                )
    return rows


def read_iterations(run_dir: Path, runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """iterations.csv's rows (`read_csv_rows`), which must hold each configuration of `runs`
    (runs.csv's rows) exactly: a row per measured iteration run, the lost ones run again
    after a restart too (`iterations` + `lost_iterations`), each measured iteration at least
    once. A missing file, or one with more or fewer rows of a configuration, or one lacking an
    iteration or repeating one no restart ran again, is damage: a report or a resume must not
    build on it.
    Rows of configurations that runs.csv lacks are not checked (a resume drops them)."""
    path = run_dir / "iterations.csv"
    if runs and not path.exists():
        more = f" and {len(runs) - 1} more" if len(runs) > 1 else ""
        raise ConfigError(
            f"{path} is missing, but runs.csv has {_configuration_name(runs[0])}{more}: damaged?"
        )
    rows = read_csv_rows(path, ITERATIONS_COLUMNS)
    lines: dict[tuple[str, str, str, str], list[tuple[int, int]]] = {}
    for number, row in enumerate(rows, start=2):  # (line, iteration) by configuration
        lines.setdefault(_configuration(row), []).append((number, int(float(row["iteration"]))))
    for run in runs:
        iterations, lost = int(float(run["iterations"])), int(float(run["lost_iterations"]))
        found = lines.get(_configuration(run), [])
        if len(found) != iterations + lost:
            again = f" ({lost} of them again after a restart)" if lost else ""
            raise ConfigError(
                f"{path} has {len(found)} rows of {_configuration_name(run)}, but runs.csv says "
                f"it ran {iterations + lost} iterations{again}: damaged?"
            )
        _check_each_iteration(path, run, found)
    return rows


def _check_each_iteration(path: Path, run: Mapping[str, Any], found: list[tuple[int, int]]) -> None:
    """A configuration's rows of iterations.csv, (line, iteration), hold each of its measured
    iterations 0..N-1 (runs.csv's `iterations`) and repeat one only if a restart lost some."""
    iterations, lost = int(float(run["iterations"])), int(float(run["lost_iterations"]))
    name = _configuration_name(run)
    seen: dict[int, int] = {}  # each iteration's first line
    for number, iteration in found:
        if iteration not in range(iterations):
            raise ConfigError(
                f"{path} line {number}: iteration {iteration} of {name}, which runs.csv says ran "
                f"iterations 0 to {iterations - 1}: damaged?"
            )
        if iteration in seen and not lost:
            raise ConfigError(
                f"{path} line {number} repeats iteration {iteration} of {name} (line "
                f"{seen[iteration]}), which runs.csv says no restart ran again: damaged?"
            )
        seen.setdefault(iteration, number)
    missing = next((k for k in range(iterations) if k not in seen), None)
    if missing is not None:
        raise ConfigError(f"{path} has no row of iteration {missing} of {name}: damaged?")


def _configuration(row: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """What names a configuration in every result table: model, system, scenario, repeat."""
    return (str(row["model"]), str(row["system"]), str(row["scenario"]), str(row["repeat"]))


def _configuration_name(row: Mapping[str, Any]) -> str:
    return configuration_name(_configuration(row))


def read_spec_record(run_dir: Path) -> dict[str, Any]:
    """The run directory's spec.json (its spec, schema version, spec version, run id and git
    revision, the revisions a resume ran at, and the warnings the run gave); one of another
    schema version or a later spec version is refused. The record returned always has its
    `spec_version` (1 where the file has none), `resumed_git_revisions` and `warnings`
    (none where the file has none)."""
    path = run_dir / "spec.json"
    record = read_json(path, "run record")  # as any input: nesting, a key twice, huge numbers
    if not isinstance(record, dict) or not isinstance(record.get("spec"), dict):
        raise ConfigError(f"{path} is not a spec record (an object with a `spec`)")
    if record.get("schema_version") != RESULTS_SCHEMA_VERSION:
        raise ConfigError(
            f"{run_dir} holds results of schema version {record.get('schema_version')!r}; "
            f"this version reads {RESULTS_SCHEMA_VERSION} only: pick a new run id"
        )
    resumed = record.setdefault("resumed_git_revisions", [])
    if not isinstance(resumed, list) or not all(isinstance(r, str) for r in resumed):
        raise ConfigError(f"{path}: resumed_git_revisions is not a list of revisions: damaged?")
    warnings = record.setdefault("warnings", [])
    if not isinstance(warnings, list) or not all(isinstance(w, str) for w in warnings):
        raise ConfigError(f"{path}: warnings is not a list of lines: damaged?")
    version = record.setdefault("spec_version", 1)
    if version not in range(1, SPEC_VERSION + 1) or isinstance(version, bool):
        raise ConfigError(
            f"{path} has spec version {version!r}; this version reads 1 to {SPEC_VERSION}"
        )
    return record


def write_json_atomic(path: Path, data: Any, *, compact: bool = False) -> None:
    """Indented for people, or `compact` (no spaces) for big files such as timelines."""
    text = json.dumps(data, separators=(",", ":")) if compact else json.dumps(data, indent=1)
    write_atomic(path, text + "\n")


_PACKAGE_DIR = Path(__file__).resolve().parent


def git_revision(directory: Path = _PACKAGE_DIR) -> str:
    """The commit of the checkout `directory` is in (this package's by default), with
    "-dirty" where its tracked files differ from it (as `git describe --dirty` marks it: the
    results come from code no commit holds), or "unknown" outside a git work tree."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], capture_output=True, text=True, timeout=10, cwd=directory, check=True
        ).stdout.strip()

    try:
        revision = git("rev-parse", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if not revision:
        return "unknown"
    return f"{revision}-dirty" if changed else revision
