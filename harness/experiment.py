"""Experiments: every configuration of a spec (harness.spec) run into a results directory,
resumable, every file written atomically (the directory's files: docs/design.md, "Results")."""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.loop import iteration_name
from harness.policies import SYSTEMS, Planner
from harness.result_rows import configuration_rows
from harness.results import (
    ITERATIONS_COLUMNS,
    RESULTS_SCHEMA_VERSION,
    RUNS_COLUMNS,
    SPEC_VERSION,
    append_csv_atomic,
    git_revision,
    read_csv_rows,
    read_iterations,
    read_spec_record,
    run_dir_held,
    write_csv_atomic,
    write_json_atomic,
)
from harness.runner import RuntimeEngines, run_configuration, run_warnings
from harness.saved import (
    ConfigurationKey,
    ConfigurationRecorder,
    drawn_iterations,
    drop_stale,
    messages_writer,
    write_timeline,
)
from harness.spec import (
    Configuration,
    ExperimentSpec,
    Scenario,
    Target,
    controller_for,
    without_folders,
)
from pipeline.cost_model import CALIBRATED, Calibration, model_cost, resolve_model
from pipeline.errors import ConfigError
from pipeline.faults import NO_FAULTS
from pipeline.files import leftover_temporaries
from pipeline.timeline import Timeline

__all__ = ["fault_free_step_ms", "new_run_dir", "run_experiment"]

logger = logging.getLogger(__name__)


def new_run_dir(out: Path, name: str) -> Path:
    """A new run directory in `out`, made here: `name`-<UTC date-time>, with -2, -3, ... after
    it where a run that started in the same second has that one (two runs never share)."""
    stamp = f"{name}-{dt.datetime.now(dt.UTC).strftime('%Y%m%d-%H%M%S')}"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as err:  # as `run_dir_held` says it
        raise ConfigError(
            f"{out} cannot hold run directories: a file is in the way (there or above)"
        ) from err
    k = 1
    while True:
        run_dir = out / (stamp if k == 1 else f"{stamp}-{k}")
        try:
            run_dir.mkdir()
        except FileExistsError:
            k += 1
            continue
        return run_dir


def fault_free_step_ms(
    model: str | dict[str, Any], system: str, calibration: Calibration = CALIBRATED
) -> float:
    """One fault-free step (pipeline, all-reduce, optimizer) of a cost-model model."""
    cost = model_cost(resolve_model(model), calibration=calibration)
    target = Target(cost.model.name, cost.profile, cost)
    result = run_configuration(controller_for(system, target, Scenario()), num_iterations=1)
    return result.median_wall_ms


def run_experiment(
    spec: ExperimentSpec,
    run_dir: Path,
    progress: Callable[[str], None] = logger.info,
) -> Path:
    """Run every configuration not already in `run_dir` (resume), writing files atomically;
    the run holds `run_dir` (a second run of it refuses). A run that ends before it wrote
    anything leaves no folder behind where `run_dir` was absent or empty (but for a `.lock`)
    before it."""
    fresh = not run_dir.is_dir() or {p.name for p in run_dir.iterdir()} <= {".lock"}
    if not fresh and not (run_dir / "spec.json").exists():  # before the hold's `.lock`
        _check_not_another_folder(run_dir)
        _check_no_results(run_dir)  # (again in the hold: it may have changed meanwhile)
    with run_dir_held(run_dir):
        try:
            spec.check_processes_here()  # before spec.json: not after the other configurations
            return _run_experiment(spec, run_dir, progress)
        except BaseException:
            if fresh:
                _remove_if_unstarted(run_dir)
            raise


def _remove_if_unstarted(run_dir: Path) -> None:
    """`run_dir` removed where it holds nothing but its `.lock` (a run that ended before its
    first file), with the lock still held: a run waiting for it makes the folder again
    (`run_dir_held`)."""
    try:
        if [p.name for p in run_dir.iterdir()] == [".lock"]:
            (run_dir / ".lock").unlink()
            run_dir.rmdir()
    except OSError:  # not ours to remove after all: the folder stays
        pass


def _run_experiment(spec: ExperimentSpec, run_dir: Path, progress: Callable[[str], None]) -> Path:
    from harness.report import write_report  # plotting libraries load slowly

    spec_path = run_dir / "spec.json"
    revision = git_revision()
    configs = spec.configurations()
    spec_record: dict[str, Any] = {
        "schema_version": RESULTS_SCHEMA_VERSION,
        "spec_version": SPEC_VERSION,
        "run_id": run_dir.name,
        "git_revision": revision,
        "resumed_git_revisions": [],
        "spec": spec.to_dict(),
        "resolved": spec.resolve(configs).to_dict(),
    }
    if spec_path.exists():
        previous = read_spec_record(run_dir)
        if "ran_by" in previous:  # harness.collect's: no run here can add to it
            raise ConfigError(
                f"{run_dir} holds what {previous['ran_by']} ran (collected): pick a new run id"
            )
        _check_same_experiment(run_dir, previous, spec_record)
        spec_record.update(_revisions(previous, revision))
        spec_record["run_id"] = _first_run_id(run_dir, previous, progress)
    else:
        _check_no_results(run_dir)
    run_id = spec_record["run_id"]
    keys = [config.key for config in configs]
    runs: list[dict[str, Any]] = read_csv_rows(run_dir / "runs.csv", RUNS_COLUMNS)
    _check_rows_are_this_run(run_dir, runs, run_id, set(keys))
    done = {_row_key(r) for r in runs}
    # runs.csv is written last (after messages.csv, the timeline and iterations.csv): what
    # another file holds of a configuration it lacks is stale.
    saved = read_iterations(run_dir, runs)  # each configuration in runs.csv has its rows
    iterations = [r for r in saved if _row_key(r) in done]
    host_warning = spec.host_costs().other_host_warning()
    # By configuration, and all of them, in order, once each, for report.md. A configuration's
    # repeats share its warnings, made once (100,000 configurations' took 15 s, unannounced).
    shared: dict[tuple[str, str, str], list[str]] = {}
    warnings: dict[ConfigurationKey, list[str]] = {}
    for config, key in zip(configs, keys, strict=True):
        if key[:3] not in shared:
            shared[key[:3]] = _warnings(config, spec)
        warnings[key] = shared[key[:3]]
    every = [host_warning] if host_warning else []
    spec_record["warnings"] = list(
        dict.fromkeys(every + [w for ws in warnings.values() for w in ws])
    )
    write_json_atomic(spec_path, spec_record)
    drop_stale(run_dir, done, (key for key in keys if key not in done))
    # A resume writes runs.csv and iterations.csv anew once (the rows of configurations that
    # runs.csv lacks dropped), then each configuration appends its own rows to them.
    for name, columns, rows in (
        ("iterations.csv", ITERATIONS_COLUMNS, iterations),
        ("runs.csv", RUNS_COLUMNS, runs),
    ):
        if (run_dir / name).exists():
            write_csv_atomic(run_dir / name, columns, rows)
    planner = spec.planner  # the spec's check made the first plans
    weights = [
        _expected_cost(spec, config, planner) if key not in done else 0.0
        for config, key in zip(configs, keys, strict=True)
    ]
    pace = _Pace(sum(weights))
    if host_warning is not None:
        progress(host_warning)
    undone = (w for key in keys if key not in done for w in warnings[key])
    for warning in dict.fromkeys(undone):
        progress(warning)
    with RuntimeEngines() as engines:  # one pool per shape, shared by the configurations
        for count, (config, key) in enumerate(zip(configs, keys, strict=True), start=1):
            target, system, scenario, _ = config
            if key in done:
                continue
            changes = scenario.faults.change_iterations() if scenario.faults else ()
            with messages_writer(run_dir) as messages:
                drawn = drawn_iterations(spec.num_iterations, changes)
                recorder = ConfigurationRecorder(messages, key, drawn, spec.num_warmup_iterations)
                heard = _Heartbeat(
                    recorder,
                    progress,
                    f"[{count}/{len(configs)}] {target.label} {system} {scenario.name}",
                    spec.num_warmup_iterations,
                    spec.num_iterations,
                )
                controller = controller_for(
                    system,
                    target,
                    scenario,
                    planner,
                    spec.num_warmup_iterations,
                    spec.recovery(),
                    link_terms=spec.link_terms(),
                )
                result = run_configuration(
                    controller,
                    backend=spec.backend,
                    num_iterations=spec.num_iterations,
                    num_warmup_iterations=spec.num_warmup_iterations,
                    faults=scenario.faults or NO_FAULTS,
                    keep_timeline=False,
                    injection=spec.injection,
                    model=target.label if spec.backend == "megatron" else None,
                    host=spec.host_costs(),
                    engines=engines,
                    recovery=spec.recovery(),
                    on_iteration=heard,
                    delegated=SYSTEMS[system][1] == "delegated",
                    seed=spec.seed,
                )
            write_timeline(run_dir, key, recorder.timeline(), result.rerun_iterations)
            run_row, iteration_rows = configuration_rows(run_id, spec, config, result)
            runs.append(run_row)
            append_csv_atomic(run_dir / "iterations.csv", ITERATIONS_COLUMNS, iteration_rows)
            append_csv_atomic(run_dir / "runs.csv", RUNS_COLUMNS, [run_row])
            elapsed_s, left_s = pace.done(weights[count - 1])
            reused = result.reused_iterations
            progress(
                f"[{count}/{len(configs)}] {target.label} {system} {scenario.name}: "
                f"{result.median_wall_ms:.1f} ms median"
                + (f", {result.restarts} restart(s)" if result.restarts else "")
                + (f", {reused} identical iteration{'s' * (reused != 1)} reused" if reused else "")
                + f" ({elapsed_s:.0f} s elapsed, ~{left_s:.0f} s left)"
            )
            for cause in result.restart_causes:
                progress(f"  restarted after {cause}")
    write_report(spec, run_dir, runs)
    return run_dir


def _warnings(config: Configuration, spec: ExperimentSpec) -> list[str]:
    """`run_warnings` for a configuration, naming its model and scenario."""
    target, system, scenario, _ = config
    warnings = run_warnings(
        system,
        scenario.apply(target.profile),
        scenario.faults or NO_FAULTS,
        num_warmup_iterations=spec.num_warmup_iterations,
        backend=spec.backend,
        host=spec.host_costs(),
        injection=spec.injection,
    )
    return [f"{target.label} {scenario.name}: {warning}" for warning in warnings]


def _check_same_experiment(run_dir: Path, previous: dict[str, Any], record: dict[str, Any]) -> None:
    """A resume runs the experiment `run_dir` holds (`previous`, its spec.json), no other:
    every field of the spec, the fault timeline's text and the calibration's costs included
    (a file edited since is another experiment), and what it resolved to where it kept that
    (`resolved`: a preset whose batch changed since is another experiment too). The files'
    folders are not (a checkout moved, or the spec and its files copied elsewhere): where
    spec.json keeps what they held, their names only."""
    before, now = previous["spec"], json.loads(json.dumps(record["spec"]))
    if previous["spec_version"] >= 2:
        before, now = without_folders(before), without_folders(now)
    changed = sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k))
    if "resolved" in previous and previous["resolved"] != record["resolved"]:
        changed.append("resolved")  # the cost model changed its models' batch or names
    if not changed:
        return
    if previous["spec_version"] < 2 and set(changed) <= {"faults_text", "calibration_costs"}:
        raise ConfigError(
            f"{run_dir} was written by an older version that kept only the paths of its fault "
            "timeline and calibration, not what they held: it cannot be resumed; pick a new "
            "run id"
        )
    raise ConfigError(
        f"{run_dir} holds a different experiment ({', '.join(changed)} changed); pick a new run id"
    )


_RESULTS = ("runs.csv", "iterations.csv", "messages.csv", "timelines")
"""What a run writes after spec.json: a directory holding any of them but no spec.json holds
no run of this experiment (copied or left there by something else)."""


def _check_not_another_folder(run_dir: Path) -> None:
    """A ConfigError if `run_dir`, without a spec.json, holds anything but its lock, a
    killed write's temporary file and results (`_check_no_results` refuses those): not a run
    directory (a run writes spec.json first), but a folder of other files (--run-id naming
    one of the user's), among which the run would write its own (report.md and the plots
    over any of those names), as `collect` refuses."""
    ours = {".lock", *_RESULTS}.union(p.name for p in leftover_temporaries(run_dir))
    others = sorted(p.name for p in run_dir.iterdir() if p.name not in ours)
    if others:
        more = f" and {len(others) - 1} more" if len(others) > 1 else ""
        raise ConfigError(
            f"{run_dir} holds {others[0]!r}{more} but no spec.json: not a run directory (a run "
            "writes spec.json first); pick a new run id, or an empty folder"
        )


def _check_no_results(run_dir: Path) -> None:
    """A ConfigError if `run_dir`, without a spec.json, holds results (`_RESULTS`): a run
    writes spec.json before its first result, so they are not its own to resume."""
    found = [name for name in _RESULTS if (run_dir / name).exists()]
    if found:
        raise ConfigError(
            f"{run_dir} has {', '.join(found)} but no spec.json: not a run directory of this "
            "experiment (a run writes spec.json first); pick a new run id"
        )


def _check_rows_are_this_run(
    run_dir: Path, runs: list[dict[str, Any]], run_id: str, keys: set[ConfigurationKey]
) -> None:
    """A ConfigError if a row of runs.csv is of another run (its run_id) or of a
    configuration the spec lacks (`keys`): a resume would count it as done and report it."""
    path = run_dir / "runs.csv"
    for number, row in enumerate(runs, start=2):  # line 1 is the header
        name = f"{row['model']} {row['system']} {row['scenario']} (repeat {row['repeat']})"
        if row["run_id"] != run_id:
            raise ConfigError(
                f"{path} line {number} ({name}) is of run {row['run_id']!r}, not this run's "
                f"{run_id!r}: damaged?"
            )
        if _row_key(row) not in keys:
            raise ConfigError(
                f"{path} line {number} ({name}) is not a configuration of the experiment: damaged?"
            )


def _first_run_id(run_dir: Path, previous: dict[str, Any], progress: Callable[[str], None]) -> str:
    """A resumed run keeps the run id of its first run (spec.json's), as its rows have it,
    also in a directory copied or renamed since: its files never mix two ids."""
    run_id = previous.get("run_id", run_dir.name)
    if not isinstance(run_id, str) or not run_id:
        raise ConfigError(f"{run_dir / 'spec.json'}: run_id {run_id!r} is not a run id: damaged?")
    if run_id != run_dir.name:
        progress(f"{run_dir} holds run {run_id} (copied or renamed): its rows keep that run id")
    return run_id


def _revisions(previous: dict[str, Any], now: str) -> dict[str, Any]:
    """A resumed run keeps the first run's git revision, and adds its own to the revisions it
    was resumed at (each once, in the order first seen) where it is another."""
    first, later = previous.get("git_revision", "unknown"), previous["resumed_git_revisions"]
    return {
        "git_revision": first,
        "resumed_git_revisions": later + ([now] if now not in (first, *later) else []),
    }


HEARTBEAT_S = 30.0
"""How often a configuration still running says how far it is, at most."""


class _Heartbeat:
    """Each iteration to `recorder`, and a progress line at most every `HEARTBEAT_S` while
    the configuration (`label`) runs: a runtime's may run for minutes between the lines
    that end configurations."""

    def __init__(
        self,
        recorder: ConfigurationRecorder,
        progress: Callable[[str], None],
        label: str,
        num_warmup_iterations: int,
        num_iterations: int,
    ) -> None:
        self._recorder, self._progress, self._label = recorder, progress, label
        self._num_warmup, self._num_iterations = num_warmup_iterations, num_iterations
        self._started = self._said = time.monotonic()

    def __call__(
        self, iteration: int, timeline: Timeline, measured: bool, same_as: int | None = None
    ) -> None:
        self._recorder(iteration, timeline, measured, same_as)
        now = time.monotonic()
        if now - self._said < HEARTBEAT_S:
            return
        self._said = now
        which = iteration_name(iteration, self._num_warmup, self._num_iterations)
        self._progress(f"  {self._label}: {which} done ({now - self._started:.0f} s)")


class _Pace:
    """Time left in an experiment: the configurations' expected costs still to run, at the
    pace of those run so far. The first one run also starts the worker pool (seconds, where a
    configuration may take a second), so it sets the pace only until a second one is done."""

    def __init__(self, total: float) -> None:
        self.started = self.after_first = time.monotonic()
        self.left, self.since_first, self.num_done = total, 0.0, 0

    def done(self, cost: float) -> tuple[float, float]:
        """Elapsed and estimated remaining seconds, once a configuration of `cost` ended."""
        now = time.monotonic()
        self.left -= cost
        self.num_done += 1
        if self.num_done == 1:
            self.after_first, first_cost = now, cost
            pace = (now - self.started) / first_cost if first_cost > 0 else 0.0
        else:
            self.since_first += cost
            pace = (now - self.after_first) / self.since_first if self.since_first > 0 else 0.0
        return now - self.started, pace * max(self.left, 0.0)


def _expected_cost(spec: ExperimentSpec, config: Configuration, planner: Planner) -> float:
    """How long a configuration should take relative to the others, for the time-left
    estimate: 1 each in sim (they all take milliseconds); in the runtimes, the simulator's
    step of its first iteration (its plan, made by the shared `planner`, is reused when the
    configuration runs), times its iterations. Configurations differ by several times (a
    slow link under 1F1B against the fault-free run), so counting them would misjudge."""
    if spec.backend == "sim":
        return 1.0
    target, system, scenario, _ = config
    first = run_configuration(
        controller_for(system, target, scenario, planner),
        num_iterations=1,
        faults=scenario.faults or NO_FAULTS,
        keep_timeline=False,
    )
    return first.median_wall_ms * (spec.num_iterations + spec.num_warmup_iterations)


def _row_key(row: dict[str, Any]) -> ConfigurationKey:
    return (row["model"], row["system"], row["scenario"], row["repeat"])
