"""The `adaptra-bench` command line: thin click commands over library calls."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from harness.experiment import default_experiment, load_spec, new_run_id, run_experiment
from harness.policies import POLICIES, PlannedSchedule, plan
from harness.runner import BACKENDS, run_configuration
from injectors.fault_timeline import FaultTimeline, parse_trace, parse_yaml
from pipeline.errors import AdaptraBenchError, ConfigError
from pipeline.gantt import plot_gantt
from pipeline.metrics import compute_metrics
from pipeline.profile import Profile
from pipeline.schedule import Schedule, validate_schedule
from pipeline.simulator import CommMode, simulate
from pipeline.timeline import Timeline
from pipeline.torch_csv import from_torch_csv, to_torch_csv
from pipeline.trace import write_chrome_trace

__all__ = ["main"]

F = TypeVar("F", bound=Callable[..., Any])


def _read_text(path: str, what: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as err:
        raise ConfigError(f"cannot read {what} {path}: {err.strerror}") from err


def _load_json(path: str, what: str) -> Any:
    try:
        return json.loads(_read_text(path, what))
    except json.JSONDecodeError as err:
        raise ConfigError(f"{what} {path} is not valid JSON: {err}") from err


def _load_schedule(path: str) -> tuple[Schedule, dict[str, Any] | None]:
    """A schedule file (JSON with `stages`, or a torch CSV) and the profile it embeds, if any."""
    if path.endswith(".csv"):
        return from_torch_csv(_read_text(path, "schedule")), None
    data = _load_json(path, "schedule")
    embedded = data.get("profile") if isinstance(data, dict) else None
    return Schedule.from_dict(data), embedded if isinstance(embedded, dict) else None


def _resolve(
    profile_path: str | None,
    policy: str | None,
    schedule_path: str | None,
    time_limit_s: float | None = None,
) -> tuple[Profile, PlannedSchedule]:
    """The profile and the schedule a command works on, from --profile and --policy/--schedule."""
    if (policy is None) == (schedule_path is None):
        raise ConfigError("give exactly one of --policy and --schedule")
    schedule, embedded = _load_schedule(schedule_path) if schedule_path else (None, None)
    if profile_path is not None:
        profile = Profile.from_file(profile_path)
    elif embedded is not None:
        profile = Profile.from_dict(embedded)
    else:
        raise ConfigError("--profile is required (the schedule file has no 'profile' key)")
    if schedule is None:
        return profile, plan(str(policy), profile, time_limit_s=time_limit_s)
    validate_schedule(schedule, profile.num_stages, profile.num_microbatches)
    return profile, PlannedSchedule("given", f"schedule file {schedule_path}", schedule, 0.0)


def _schedule_options(func: F) -> F:
    func = click.option(
        "--schedule",
        "schedule_path",
        type=click.Path(dir_okay=False),
        help="JSON object with a 'stages' key (or a torch CSV): run exactly that order.",
    )(func)
    func = click.option(
        "--time-limit",
        "time_limit_s",
        type=float,
        help="Seconds for the exact solver: `milp` (default 30), `adaptra` (default: none).",
    )(func)
    func = click.option(
        "--policy",
        "--system",
        "policy",
        type=click.Choice(list(POLICIES)),
        help="Policy that orders the ops.",
    )(func)
    func = click.option(
        "--profile",
        "profile_path",
        type=click.Path(dir_okay=False),
        help="Profile JSON file (DESIGN.md).",
    )(func)
    return func


def _emit_json(data: dict[str, Any]) -> None:
    click.echo(json.dumps(data, indent=1))


@click.group()
@click.version_option(package_name="adaptra-bench")
def cli() -> None:
    """Fault-injection benchmarking of pipeline-parallel training schedules."""


@cli.command()
@_schedule_options
@click.option("--format", "fmt", type=click.Choice(["text", "json", "torch-csv"]), default="text")
@click.option("--plot", type=click.Path(dir_okay=False), help="Write a Gantt chart PNG here.")
def schedule(
    profile_path: str | None,
    policy: str | None,
    schedule_path: str | None,
    time_limit_s: float | None,
    fmt: str,
    plot: str | None,
) -> None:
    """Produce a schedule and time it in `ideal` mode under the profile's delays."""
    profile, planned = _resolve(profile_path, policy, schedule_path, time_limit_s)
    timeline = simulate(planned.schedule, profile, CommMode.IDEAL, validate=False)
    metrics = compute_metrics(timeline)
    if plot:
        plot_gantt(timeline, plot, title=f"{planned.policy}: {metrics.iteration_time_ms:g} ms")
    if fmt == "torch-csv":
        click.echo(to_torch_csv(planned.schedule), nl=False)
    elif fmt == "json":
        _emit_json(
            {
                "policy": planned.policy,
                "method": planned.method,
                "warmup": list(planned.schedule.warmup_counts()),
                "stages": planned.schedule.to_text(),
                "iteration_time_ms": metrics.iteration_time_ms,
                "generation_ms": planned.generation_ms,
            }
        )
    else:
        click.echo(
            f"policy {planned.policy} ({planned.method}), warm-up "
            f"{list(planned.schedule.warmup_counts())}, ideal iteration time "
            f"{metrics.iteration_time_ms:g} ms"
        )
        click.echo(planned.schedule.render())


@cli.command()
@_schedule_options
@click.option("--comm", type=click.Choice([m.value for m in CommMode]), default="ideal")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@click.option("--trace", type=click.Path(dir_okay=False), help="Write a Chrome/Perfetto trace.")
@click.option("--plot", type=click.Path(dir_okay=False), help="Write a Gantt chart PNG here.")
def simulate_cmd(
    profile_path: str | None,
    policy: str | None,
    schedule_path: str | None,
    time_limit_s: float | None,
    comm: str,
    fmt: str,
    trace: str | None,
    plot: str | None,
) -> None:
    """Simulate one iteration of a schedule and print its metrics."""
    profile, planned = _resolve(profile_path, policy, schedule_path, time_limit_s)
    timeline = simulate(planned.schedule, profile, CommMode(comm), validate=False)
    metrics = compute_metrics(timeline)
    if trace:
        write_chrome_trace(timeline, trace)
    if plot:
        plot_gantt(timeline, plot, title=f"{planned.policy}, {comm}")
    if fmt == "json":
        _emit_json({"policy": planned.policy, "comm": comm, **metrics.to_dict()})
        return
    click.echo(
        f"{planned.policy}, {comm}: iteration {metrics.iteration_time_ms:g} ms, max "
        f"stage span {metrics.max_stage_span_ms:g} ms, bubble ratio "
        f"{metrics.bubble_ratio:.3f}"
    )
    click.echo(f"{'stage':>5} {'busy ms':>10} {'idle ms':>10} {'peak mem':>9}")
    for idx, stage in enumerate(metrics.stages):
        click.echo(
            f"{idx:>5} {stage.busy_ms:>10.3f} {stage.idle_ms:>10.3f} {stage.peak_memory:>9g}"
        )


simulate_cmd.name = "simulate"


@cli.command()
@_schedule_options
@click.option("--backend", type=click.Choice(list(BACKENDS)), default="sim")
@click.option("--comm", type=click.Choice(["direct", "delegated"]), default="direct")
@click.option("--iterations", type=click.IntRange(min=1), default=5, help="Measured iterations.")
@click.option(
    "--warmup-iterations",
    type=click.IntRange(min=0),
    default=1,
    help="Iterations run first and not reported.",
)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default="results",
    help="Where the default experiment writes its run directory.",
)
@click.option("--run-id", help="Resume (or name) an experiment's run directory.")
@click.option(
    "--spec",
    "spec_path",
    type=click.Path(dir_okay=False),
    help="Experiment spec (YAML) to run instead of the default experiment.",
)
@click.option("--trace", type=click.Path(dir_okay=False), help="Write a Chrome/Perfetto trace.")
@click.option(
    "--faults",
    "faults_path",
    type=click.Path(dir_okay=False),
    help="Fault timeline: the paper's trace (.txt) or YAML (.yaml/.yml).",
)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False),
    help="Gantt chart PNG of the last measured iteration.",
)
def run(
    profile_path: str | None,
    policy: str | None,
    schedule_path: str | None,
    time_limit_s: float | None,
    backend: str,
    comm: str,
    iterations: int,
    warmup_iterations: int,
    fmt: str,
    out: str,
    run_id: str | None,
    spec_path: str | None,
    trace: str | None,
    faults_path: str | None,
    plot: str | None,
) -> None:
    """Run one configuration, or an experiment: --spec FILE, or with no --profile/--policy/
    --schedule the embedded default."""
    if profile_path is None and policy is None and schedule_path is None:
        spec = load_spec(Path(spec_path)) if spec_path else default_experiment()
        run_dir = Path(out) / (run_id or new_run_id(spec.name))
        run_experiment(spec, run_dir, progress=lambda line: click.echo(line, err=True))
        click.echo(f"results written to {run_dir}")
        return
    profile, planned = _resolve(profile_path, policy, schedule_path, time_limit_s)
    result = run_configuration(
        planned.schedule,
        profile,
        backend=backend,
        comm=comm,
        num_iterations=iterations,
        num_warmup_iterations=warmup_iterations,
        faults=_load_faults(faults_path) if faults_path else None,
    )
    if trace:
        write_chrome_trace(result.timeline, trace)
    if plot:
        last = result.timeline.iterations[-1]
        plot_gantt(
            _shifted(result.timeline, last.iteration, last.start_ms),
            plot,
            title=f"{planned.policy}, {comm}, {backend}, iteration {last.iteration}",
        )
    if fmt == "json":
        _emit_json(
            {
                "backend": backend,
                "policy": planned.policy,
                "comm": comm,
                "iteration_times_ms": list(result.iteration_times_ms),
                "median_iteration_ms": result.median_iteration_ms,
                "step_times_ms": list(result.step_times_ms),
            }
        )
        return
    click.echo(
        f"{planned.policy} over {comm} ({backend}): median iteration "
        f"{result.median_iteration_ms:.3f} ms over {iterations} iterations"
    )


@cli.command()
@_schedule_options
@click.option("--nodes", type=click.IntRange(min=1), default=1, help="Hosts to run on.")
@click.option("--replicas", type=click.IntRange(min=1), default=1, help="DP replicas.")
@click.option("--master-addr", default="127.0.0.1", help="Address of node 0.")
@click.option("--master-port", type=click.IntRange(1, 65535), default=29500)
@click.option("--iterations", type=click.IntRange(min=1), default=3)
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default="results/launch",
    help="Where the profile, schedule and (with --run) timeline.json go.",
)
@click.option("--run", "run_here", is_flag=True, help="Run it on this host (one node only).")
def launch(
    profile_path: str | None,
    policy: str | None,
    schedule_path: str | None,
    time_limit_s: float | None,
    nodes: int,
    replicas: int,
    master_addr: str,
    master_port: int,
    iterations: int,
    out: str,
    run_here: bool,
) -> None:
    """Print the torchrun command for every node (emulated compute), or run it here."""
    from pipeline.runtime.torchrun import torchrun_commands  # torch: only when needed

    profile, planned = _resolve(profile_path, policy, schedule_path, time_limit_s)
    world = profile.num_stages * replicas
    if world % nodes:
        raise ConfigError(f"{world} ranks do not split evenly over {nodes} nodes")
    if run_here and nodes != 1:
        raise ConfigError("--run starts one node only; run the printed commands on each node")
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "profile.json").write_text(json.dumps(profile.to_dict()))
    (out_dir / "schedule.json").write_text(json.dumps(planned.schedule.to_dict()))
    worker_args = [
        "--profile",
        str(out_dir / "profile.json"),
        "--schedule",
        str(out_dir / "schedule.json"),
        "--replicas",
        str(replicas),
        "--iterations",
        str(iterations),
        "--out",
        str(out_dir),
    ]
    port = _free_port() if run_here else master_port
    commands = torchrun_commands(
        num_nodes=nodes,
        procs_per_node=world // nodes,
        master_addr=master_addr,
        master_port=port,
        worker_args=worker_args,
    )
    if not run_here:
        for command in commands:
            click.echo(command)
        return
    env = {**os.environ, "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}
    try:
        done = subprocess.run(
            shlex.split(commands[0]), env=env, capture_output=True, text=True, timeout=600
        )
    except subprocess.TimeoutExpired as err:
        raise ConfigError("torchrun did not finish within 600 s") from err
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(f"torchrun failed with exit code {done.returncode}: {last}")
    timeline = Timeline.from_dict(json.loads((out_dir / "timeline.json").read_text()))
    times = [compute_metrics(timeline, i).iteration_time_ms for i in range(iterations)]
    click.echo(
        json.dumps({"iteration_times_ms": times, "timeline": str(out_dir / "timeline.json")})
    )


@cli.command()
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
def doctor(fmt: str) -> None:
    """What this machine can do, and what that means for a run."""
    from injectors.doctor import run_checks

    checks = run_checks()
    if fmt == "json":
        _emit_json(
            {c.name: {"ok": c.ok, "detail": c.detail, "consequence": c.consequence} for c in checks}
        )
        return
    for check in checks:
        line = f"{'ok ' if check.ok else 'NO '} {check.name:<14} {check.detail}"
        click.echo(line if check.ok else f"{line}\n     -> {check.consequence}")


@cli.command()
def cleanup() -> None:
    """Remove network namespaces left behind by a testbed whose process was killed."""
    from injectors.testbed import cleanup as remove_leftovers

    removed = remove_leftovers()
    click.echo(
        f"removed {len(removed)} namespace(s)" + (": " + ", ".join(removed) if removed else "")
    )


@cli.command()
@click.argument("base", type=click.Path(exists=True))
@click.argument("new", type=click.Path(exists=True))
@click.option(
    "--tolerance",
    type=float,
    default=0.0,
    show_default=True,
    help="Allowed worsening per metric, in percent.",
)
def compare(base: str, new: str, tolerance: float) -> None:
    """Gate NEW against BASE (run directories or runs.csv files); exit 1 on a regression."""
    from harness.compare import compare_runs, load_runs

    changes = compare_runs(load_runs(Path(base)), load_runs(Path(new)), tolerance)
    worse = [c for c in changes if c.worse]
    width = max((len(c.configuration) for c in changes), default=10)
    click.echo(f"{'configuration':<{width}}  {'metric':<24} {'base':>12} {'new':>12} {'change':>9}")
    for c in changes:
        new_text = "missing" if c.new is None else f"{c.new:.4g}"
        pct = "" if c.change_pct is None else f"{c.change_pct:+.2f}%"
        flag = "  WORSE" if c.worse else ""
        click.echo(
            f"{c.configuration:<{width}}  {c.metric:<24} {c.base:>12.4g} {new_text:>12} "
            f"{pct:>9}{flag}"
        )
    if worse:
        raise ConfigError(
            f"{len(worse)} of {len(changes)} metrics got worse than "
            f"{tolerance:g} % (see the table above)"
        )
    click.echo(f"no regression: {len(changes)} metrics within {tolerance:g} %")


@cli.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
def report(run_dir: str) -> None:
    """Rebuild a run directory's figures and report.md from its results."""
    from harness.experiment import ExperimentSpec, write_report
    from harness.results import read_csv_rows

    path = Path(run_dir)
    spec_data = _load_json(str(path / "spec.json"), "spec")
    spec = ExperimentSpec.from_dict(spec_data.get("spec") if isinstance(spec_data, dict) else None)
    runs = read_csv_rows(path / "runs.csv")
    if not runs:
        raise ConfigError(f"{path} has no results in runs.csv")
    write_report(spec, path, runs)
    click.echo(f"report written to {path / 'report.md'}")


def _shifted(timeline: Timeline, iteration: int, start_ms: float) -> Timeline:
    """One iteration of a timeline, its times counted from its own start."""
    ops = tuple(
        r._replace(start_ms=r.start_ms - start_ms, end_ms=r.end_ms - start_ms)
        for r in timeline.ops
        if r.iteration == iteration
    )
    return Timeline(timeline.num_stages, ops, (), ())


def _load_faults(path: str) -> FaultTimeline:
    text = _read_text(path, "fault timeline")
    return parse_yaml(text) if path.endswith((".yaml", ".yml")) else parse_trace(text)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main(argv: list[str] | None = None) -> None:
    """Entry point: the tool's own errors become one line on stderr and exit status 1."""
    try:
        cli.main(args=argv, prog_name="adaptra-bench", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as err:
        err.show()
        sys.exit(err.exit_code)
    except AdaptraBenchError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(1)
