"""`schedule` and `simulate`: produce and time schedules."""

from __future__ import annotations

import click

from harness.cli_common import (
    calibration_option,
    emit_json,
    load_host_costs,
    output_file_option,
    refuse_outputs_over_inputs,
    resolve,
    schedule_options,
)
from harness.policies import GIVEN_POLICY
from harness.runner import calibration_shape_warning
from pipeline.gantt import plot_gantt
from pipeline.metrics import compute_metrics
from pipeline.simulator import CommMode, check_takes_host_costs, simulate
from pipeline.torch_csv import to_torch_csv
from pipeline.trace import write_chrome_trace

__all__ = ["schedule", "simulate_cmd"]


@click.command()
@schedule_options
@click.option("--format", "fmt", type=click.Choice(["text", "json", "torch-csv"]), default="text")
@output_file_option("--plot", (".png",), help="Write a Gantt chart PNG here.")
def schedule(
    profile_path: str | None,
    policy: str | None,
    schedule_path: str | None,
    time_limit_s: float | None,
    fmt: str,
    plot: str | None,
) -> None:
    """Produce a schedule and time it in `ideal` mode under the profile's delays."""
    refuse_outputs_over_inputs()
    profile, planned = resolve(profile_path, policy, schedule_path, time_limit_s)
    timeline = simulate(planned.schedule, profile, CommMode.IDEAL, validate=False)
    metrics = compute_metrics(timeline)
    if plot:
        plot_gantt(timeline, plot, title=f"{planned.policy}: {metrics.iteration_time_ms:g} ms")
    if fmt == "torch-csv":
        click.echo(to_torch_csv(planned.schedule), nl=False)
    elif fmt == "json":
        emit_json(
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
        # A given schedule's `method` names its file; a policy's says how it was made.
        source = (
            planned.method
            if planned.policy == GIVEN_POLICY
            else f"policy {planned.policy} ({planned.method})"
        )
        click.echo(
            f"{source}, warm-up "
            f"{list(planned.schedule.warmup_counts())}, ideal iteration time "
            f"{metrics.iteration_time_ms:g} ms"
        )
        click.echo(planned.schedule.render())


@click.command()
@schedule_options
@click.option(
    "--comm",
    type=click.Choice([m.value for m in CommMode]),
    default="ideal",
    show_default=True,
    help="How messages go: ideal is the paper's model (a link's delay, nothing else); run's "
    "runtimes go direct or delegated.",
)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@output_file_option("--trace", (".json",), help="Write a Chrome/Perfetto trace (JSON).")
@output_file_option("--plot", (".png",), help="Write a Gantt chart PNG here.")
@calibration_option
def simulate_cmd(
    profile_path: str | None,
    policy: str | None,
    schedule_path: str | None,
    time_limit_s: float | None,
    comm: str,
    fmt: str,
    trace: str | None,
    plot: str | None,
    calibration_path: str | None,
) -> None:
    """Simulate one iteration of a schedule and print its metrics."""
    refuse_outputs_over_inputs()
    if calibration_path is not None:
        check_takes_host_costs(comm, "--calibration")
    host = load_host_costs(calibration_path)
    profile, planned = resolve(profile_path, policy, schedule_path, time_limit_s)
    shape_warning = calibration_shape_warning(host, profile)
    if shape_warning is not None:
        click.echo(shape_warning, err=True)
    timeline = simulate(planned.schedule, profile, CommMode(comm), validate=False, host=host)
    metrics = compute_metrics(timeline)
    if trace:
        write_chrome_trace(timeline, trace)
    if plot:
        plot_gantt(timeline, plot, title=f"{planned.policy}, {comm}")
    if fmt == "json":
        emit_json({"policy": planned.policy, "comm": comm, **metrics.to_dict()})
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
