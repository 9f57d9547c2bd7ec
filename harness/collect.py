"""A cluster job's results (`launch --spec`: harness.slurm, its folder's launch.json) as a run
directory: each step's timeline.json (and a megatron step's losses and parameter digest)
measured as `run` measures its iterations, into the files `run` writes (runs.csv,
iterations.csv, messages.csv, timelines/, spec.json, report.md), so that `report` and
`compare` read a cluster's numbers as they read a run's."""

from __future__ import annotations

import dataclasses
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.cluster_job import JOB_FILE, ClusterJob, ClusterStep
from harness.experiment import new_run_dir
from harness.loop import IterationDecision, RunResult
from harness.resolved import ConfigurationKey, configuration_name
from harness.result_rows import configuration_rows
from harness.results import (
    ITERATIONS_COLUMNS,
    RESULTS_SCHEMA_VERSION,
    RUNS_COLUMNS,
    SPEC_VERSION,
    run_dir_held,
    write_csv_atomic,
    write_json_atomic,
)
from harness.saved import ConfigurationRecorder, drawn_iterations, messages_writer, write_timeline
from harness.spec import Configuration, ExperimentSpec, spec_from_record
from pipeline.checks import is_number
from pipeline.errors import ConfigError
from pipeline.files import parse_json_file
from pipeline.metrics import compute_metrics
from pipeline.profile import Profile
from pipeline.simulator import CommMode
from pipeline.timeline import Timeline
from pipeline.torchrun_launch import (
    DIGEST_FILE,
    LAUNCH_ID,
    LAUNCH_ID_FILE,
    LOSSES_FILE,
    TIMELINE_FILE,
)

__all__ = ["CLUSTER", "Collected", "collect_job"]

CLUSTER = "a cluster job (launch --spec)"
"""How a collected run directory's runs ran (spec.json's `ran_by`; `run`'s: absent)."""

_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclasses.dataclass(frozen=True, slots=True)
class Collected:
    run_dir: Path
    num_collected: int
    not_run: tuple[str, ...]
    """The steps without results, a line each: the configuration and why."""
    num_skipped: int
    """Configurations the launch skipped (the cluster path cannot run them)."""


@dataclasses.dataclass(frozen=True, slots=True)
class _StepRun:
    config: Configuration
    result: RunResult
    timeline_path: Path
    """Read again as the run directory is written: a job's timelines are not all held."""


def collect_job(
    job_dir: Path,
    out: Path,
    run_id: str | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> Collected:
    """`job_dir`'s steps that ran into a new run directory in `out`: `run_id`, or the spec's
    name and the time (`new_run_dir`). One that holds anything is refused; all is read and
    checked before it is made, and what it holds is removed again if writing fails. A step
    without a timeline.json (the job stopped before it, or is still running: a launch removes
    its steps' earlier results, harness.slurm) is left out and named; a step's files that are
    not what its workers write (cut short, another run's, damaged) are refused."""
    job = ClusterJob.read(job_dir)
    try:
        spec = spec_from_record({"spec": job.spec, "spec_version": SPEC_VERSION})
        configs = {config.key: config for config in spec.configurations()}
    except (ConfigError, TypeError) as err:
        raise ConfigError(f"{job_dir / JOB_FILE}: its spec: {err}") from err
    ran: dict[ConfigurationKey, _StepRun] = {}
    not_run: list[str] = []
    left_out: list[ConfigurationKey] = []
    for step in job.steps:
        config = configs.get(step.configuration)
        if config is None:
            raise ConfigError(
                f"{job_dir / JOB_FILE}: step {step.folder!r} runs "
                f"{configuration_name(step.configuration)}, which its spec lacks: damaged?"
            )
        timeline_path = job_dir / step.folder / TIMELINE_FILE
        if not timeline_path.is_file():
            not_run.append(f"{configuration_name(step.configuration)}: no {timeline_path}")
            left_out.append(step.configuration)
            continue
        _check_launch(job_dir, job.launch_id, job_dir / step.folder)
        profile = config.target.profile
        iterations = _measured_iterations(timeline_path, spec.num_iterations, profile)
        result = _step_result(job_dir / step.folder, step, spec, iterations)
        ran[step.configuration] = _StepRun(config, result, timeline_path)
    if not ran:
        raise ConfigError(
            f"no step of {job_dir} has results yet ({len(not_run)} without: "
            f"{not_run[0]}{', ...' if len(not_run) > 1 else ''}); run its "
            f"{job_dir / 'run.sbatch'} first"
        )
    run_dir = new_run_dir(out, spec.name) if run_id is None else out / run_id
    if run_dir.is_dir() and any(p.name != ".lock" for p in run_dir.iterdir()):
        raise ConfigError(f"{run_dir} is not empty: pick another --run-id")
    for line in not_run:
        progress(f"not collected: {line}")
    order = [ran[key] for key in configs if key in ran]  # the spec's order, as a run's
    with run_dir_held(run_dir):
        try:
            _write_run_dir(run_dir, job_dir, job, spec, order, left_out, progress)
        except BaseException:  # it held nothing but its `.lock` before
            shutil.rmtree(run_dir, ignore_errors=True)
            raise
    return Collected(run_dir, len(order), tuple(not_run), len(job.skipped))


def _check_launch(job_dir: Path, launch_id: str, step_dir: Path) -> None:
    """A ConfigError unless the results in `step_dir` are of the launch `launch_id`, the
    folder's (launch.json): a job of an earlier launch into it (queued or still running when
    the spec was launched again: sbatch keeps the script it was given) ran its own command
    lines there after this launch, and its workers wrote their launch's id."""
    path = step_dir / LAUNCH_ID_FILE
    try:
        ran = path.read_text().strip()
    except FileNotFoundError:
        raise ConfigError(
            f"{step_dir}: results without the {LAUNCH_ID_FILE} a step's workers write first "
            f"(another version's, or damaged?); run {job_dir / 'run.sbatch'} again"
        ) from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read {path}: {err}") from err
    if not LAUNCH_ID.fullmatch(ran):
        raise ConfigError(f"{path} does not hold a launch's id (32 hex digits): damaged?")
    if ran != launch_id:
        raise ConfigError(
            f"{step_dir}: the results of another launch into {job_dir} (its {ran}, not "
            f"{launch_id}): a job of an earlier launch, queued or running when the spec was "
            f"launched again, ran the step after it; run {job_dir / 'run.sbatch'} again "
            "once that job has ended"
        )


def _measured_iterations(path: Path, num_iterations: int, profile: Profile) -> list[Timeline]:
    """A step's timeline.json, each measured iteration alone; one that does not hold the
    spec's measured iterations 0..N-1 in order, each with ops of the step's `profile`'s stages
    and replicas only, none ending before it starts, each microbatch's forward and backward
    once on every stage of every replica, and no record of another iteration, is refused (cut
    short, another run's, damaged): `Timeline.from_dict` checks each record, not how they add
    up."""
    timeline = parse_json_file(path, "timeline", Timeline.from_dict)
    numbers = [r.iteration for r in timeline.iterations]
    if numbers != list(range(num_iterations)):
        raise ConfigError(
            f"{path} holds iterations {_ranges(numbers)}, not the spec's measured iterations "
            f"0-{num_iterations - 1}: another run's, or damaged?"
        )
    num_stages, num_replicas = profile.num_stages, profile.num_replicas
    if timeline.num_stages != num_stages:
        raise ConfigError(
            f"{path}: a timeline of {timeline.num_stages} stages, the step's profile has "
            f"{num_stages}: another run's, or damaged?"
        )
    try:
        parts = timeline.split()
    except ValueError as err:
        raise ConfigError(f"{path}: {err}: damaged?") from None
    for k, part in enumerate(parts):
        stages = {op.stage for op in part.ops}
        if not stages or not stages <= set(range(num_stages)):
            raise ConfigError(
                f"{path}: iteration {k} has ops of stages {sorted(stages)}, not of stages "
                f"0-{num_stages - 1}: damaged?"
            )
        odd = next(
            (op for op in part.ops if op.replica >= num_replicas or op.end_ms < op.start_ms), None
        )
        if odd is not None:
            raise ConfigError(
                f"{path}: iteration {k} has an op of replica {odd.replica} (of {num_replicas}) "
                f"from {odd.start_ms:g} to {odd.end_ms:g} ms: damaged?"
            )
        _check_every_op(path, k, part, profile)
    return parts


_WHOLE = (("F", "B", "W"), ("F", "BW"))
"""A microbatch's ops on a stage: its forward, then its backward split or fused."""


def _check_every_op(path: Path, k: int, part: Timeline, profile: Profile) -> None:
    """A ConfigError unless iteration `k` (`part`) ran each microbatch of `profile` on each
    stage of each replica once, forward and backward (B and W, or BW), and nothing else: a
    timeline missing a rank's records, or with an op twice, measured another iteration time
    and bubble ratio than the step ran."""
    order = {kind: n for n, kind in enumerate(("F", "B", "W", "BW"))}
    ran: dict[tuple[int, int, int], list[str]] = {}
    for op in part.ops:
        ran.setdefault((op.stage, op.replica, op.microbatch), []).append(str(op.kind))
    num_microbatches = profile.num_microbatches
    if any(m >= num_microbatches for _, _, m in ran):
        raise ConfigError(
            f"{path}: iteration {k} has ops of microbatches outside 0-{num_microbatches - 1}: "
            "damaged?"
        )
    for replica in range(profile.num_replicas):
        for stage in range(profile.num_stages):
            for m in range(num_microbatches):
                kinds = tuple(sorted(ran.get((stage, replica, m), []), key=order.__getitem__))
                if kinds not in _WHOLE:
                    raise ConfigError(
                        f"{path}: iteration {k}: stage {stage} (replica {replica}) ran "
                        f"microbatch {m} as {', '.join(kinds) or 'nothing'}, not F and B, W "
                        "(or BW) once each: cut short, or damaged?"
                    )


def _step_result(
    step_dir: Path, step: ClusterStep, spec: ExperimentSpec, iterations: list[Timeline]
) -> RunResult:
    """A step's measured iterations as `run` measures them (harness.loop): each one's
    metrics, its plan's comm and what its plan was made for, and a training backend's losses
    and parameter digest."""
    metrics = [compute_metrics(part, k) for k, part in enumerate(iterations)]
    for k, m in enumerate(metrics):  # what a run's files never hold: refused when read back
        if not (m.iteration_time_ms > 0 and m.step_time_ms >= 0 and 0 <= m.bubble_ratio <= 1):
            raise ConfigError(
                f"{step_dir / TIMELINE_FILE}: iteration {k} of {m.iteration_time_ms:g} ms, a "
                f"step of {m.step_time_ms:g} ms, bubble ratio {m.bubble_ratio:g}: damaged?"
            )
    losses: tuple[float, ...] = ()
    digest = ""
    if spec.backend == "megatron":
        losses = _losses(step_dir / LOSSES_FILE, len(iterations))
        digest = _digest(step_dir / DIGEST_FILE)
    decision = IterationDecision(dict(step.believed_ms), step.policy, dict(step.link_comms))
    num = len(iterations)
    return RunResult(
        iteration_times_ms=tuple(m.iteration_time_ms for m in metrics),
        step_times_ms=tuple(m.step_time_ms for m in metrics),
        bubble_ratios=tuple(m.bubble_ratio for m in metrics),
        comms=(CommMode(step.comm),) * num,
        timeline=None,
        losses=losses,
        params_sha256=digest,
        iterations=tuple(range(num)),
        decisions=(decision,) * num,
        num_failovers=tuple(len(part.failovers) for part in iterations),
        num_moved_workers=tuple(len(part.swaps) for part in iterations),
    )


def _losses(path: Path, num_iterations: int) -> tuple[float, ...]:
    def parse(data: Any) -> tuple[float, ...]:
        if (
            not isinstance(data, list)
            or len(data) != num_iterations
            or not all(is_number(v) for v in data)
        ):
            raise ConfigError(f"not {num_iterations} losses, one per measured iteration")
        return tuple(float(v) for v in data)

    return parse_json_file(path, "losses", parse)


def _digest(path: Path) -> str:
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read {path}: {err}") from err
    if not _SHA256.fullmatch(text):
        raise ConfigError(f"{path} does not hold a SHA-256 (64 hex digits): damaged?")
    return text


def _write_run_dir(
    run_dir: Path,
    job_dir: Path,
    job: ClusterJob,
    spec: ExperimentSpec,
    ran: list[_StepRun],
    left_out: list[ConfigurationKey],
    progress: Callable[[str], None],
) -> None:
    """The run directory's files in the order a run writes them (spec.json first, runs.csv
    last), then its report."""
    from harness.report import write_report  # plotting libraries load slowly

    warnings = []
    if left_out:
        warnings.append(
            f"{len(left_out)} of the job's {len(job.steps)} steps have no results and are left "
            "out (failed, or not run: the job stopped before them)"
        )
    if job.skipped:
        warnings.append(
            f"the launch skipped {len(job.skipped)} configuration(s) the cluster path cannot "
            f"run (its run.sbatch says why each)"
        )
    write_json_atomic(
        run_dir / "spec.json",
        {
            "schema_version": RESULTS_SCHEMA_VERSION,
            "spec_version": SPEC_VERSION,
            "run_id": run_dir.name,
            "git_revision": job.git_revision,
            "resumed_git_revisions": [],
            "spec": job.spec,
            "resolved": spec.resolve([step.config for step in ran]).to_dict(),
            "warnings": warnings,
            "ran_by": CLUSTER,
            "collected_from": str(job_dir.resolve()),
            "left_out": [list(key) for key in left_out],
        },
    )
    runs: list[dict[str, Any]] = []
    iteration_rows: list[dict[str, Any]] = []
    for count, step in enumerate(ran, start=1):
        key = step.config.key
        with messages_writer(run_dir) as messages:
            drawn = drawn_iterations(spec.num_iterations)
            recorder = ConfigurationRecorder(messages, key, drawn, spec.num_warmup_iterations)
            profile = step.config.target.profile
            iterations = _measured_iterations(step.timeline_path, spec.num_iterations, profile)
            for k, part in enumerate(iterations):
                recorder(spec.num_warmup_iterations + k, part, True)
        write_timeline(run_dir, key, recorder.timeline())
        run_row, rows = configuration_rows(run_dir.name, spec, step.config, step.result)
        runs.append(run_row)
        iteration_rows += rows
        progress(
            f"[{count}/{len(ran)}] {' '.join(key[:3])}: {step.result.median_wall_ms:.1f} ms "
            "median step"
        )
    write_csv_atomic(run_dir / "iterations.csv", ITERATIONS_COLUMNS, iteration_rows)
    write_csv_atomic(run_dir / "runs.csv", RUNS_COLUMNS, runs)
    write_report(spec, run_dir, runs)


def _ranges(numbers: list[int]) -> str:
    if not numbers:
        return "none"
    shown = ", ".join(map(str, numbers[:6]))
    return shown + (f", ... ({len(numbers)} in all)" if len(numbers) > 6 else "")
