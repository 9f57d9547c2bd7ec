"""`run` and `report`: experiments and their reports."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from harness.cli_common import (
    InputFile,
    OutputFolder,
    SpecFile,
    calibration_option,
    emit_json,
    folder_made_for,
    given_options,
    load_host_costs,
    output_file_option,
    refuse_options,
    refuse_outputs_over_inputs,
    resolve,
    schedule_options,
    seconds,
    terminal_progress,
)
from harness.experiment import new_run_dir, run_experiment
from harness.loop import CHECKPOINT_RESTART, MAX_ITERATIONS, IterationDecision, Recovery, RunResult
from harness.names import check_run_name
from harness.policies import (
    SYSTEMS,
    system_controller,
    with_delegate_count,
)
from harness.runner import (
    BACKENDS,
    INJECTIONS,
    check_calibrated,
    fixed_plan,
    link_terms,
    run_configuration,
    run_warnings,
)
from harness.spec import default_experiment, load_spec
from injectors.fault_files import load_faults
from pipeline.checks import MAX_SEED
from pipeline.engines import Controller
from pipeline.errors import ConfigError
from pipeline.faults import NO_FAULTS, FaultView
from pipeline.gantt import plot_gantt
from pipeline.profile import Profile
from pipeline.trace import RestartMark, write_chrome_trace

__all__ = ["collect", "report", "run"]

F = TypeVar("F", bound=Callable[..., Any])


def _run_dir_options(*, out_help: str, run_id_help: str) -> Callable[[F], F]:
    """A command's --out (the folder its run directory goes in) and --run-id (its name)."""

    def options(command: F) -> F:
        command = click.option(
            "--run-id",
            callback=lambda _ctx, param, value: _run_name(param, value),
            help=run_id_help,
        )(command)
        return click.option(
            "--out", type=OutputFolder(), default="results", show_default=True, help=out_help
        )(command)

    return options


@click.command()
@functools.partial(schedule_options, refuses_system=False)
@click.option(
    "--system",
    type=click.Choice(list(SYSTEMS)),
    help="A system: its policy, comm and controller (adaptra re-plans where its detector's "
    "estimates of the links change, over the delegates once one is slow; adaptra-oracle "
    "where the delays in force change); instead of --policy/--comm.",
)
@click.option("--backend", type=click.Choice(list(BACKENDS)), default="sim", show_default=True)
@click.option(
    "--model",
    help="GPT configuration of --backend megatron (default: tiny): tiny, small, gpt2-124m.",
)
@click.option(
    "--comm",
    type=click.Choice(["direct", "delegated"]),
    help="Transport of --policy/--schedule (default: direct).",
)
@click.option(
    "--inject",
    "injection",
    type=click.Choice(list(INJECTIONS)),
    default="hook",
    show_default=True,
    help="Runtime backends: delays as a sleep before each send (hook) or in a namespace "
    "testbed's network (network; root). The simulator times them as that injection does: "
    "network, a message's bytes queue at its link's rate and its delay propagates, holding "
    "no sender.",
)
@click.option(
    "--iterations",
    type=click.IntRange(min=1, max=MAX_ITERATIONS),
    default=5,
    show_default=True,
    help="Measured iterations.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=seconds(),
    help="Runtime backends: how long a worker waits for one message, s [60] (a spec: "
    "transport_timeout_s).",
)
@click.option(
    "--warmup-iterations",
    type=click.IntRange(min=0, max=MAX_ITERATIONS),
    default=1,
    show_default=True,
    help="Iterations run first and not reported.",
)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@_run_dir_options(
    out_help="Where an experiment (--spec, or the default one) writes its run directory.",
    run_id_help="Resume (or name) an experiment's run directory: one name inside --out.",
)
@click.option(
    "--spec",
    "spec_path",
    type=SpecFile(),
    help="Experiment spec (YAML) to run instead of the default experiment, or a bundled "
    "preset's name (`--spec fig16`; an unknown name lists them).",
)
@output_file_option(
    "--trace",
    (".json",),
    help="Write a Chrome/Perfetto trace (JSON) of every iteration run, the warm-ups first "
    "(numbered as run: with one warm-up, the trace's iteration 1 is measured iteration 0); "
    "a checkpoint-restart is an instant 'restart' across the tracks, where the iterations "
    "it runs again start, its cause and the measured iteration it runs again from (both "
    "counted from measured iteration 0) in its args.",
)
@click.option(
    "--faults",
    "faults_path",
    type=InputFile(),
    help="Fault timeline: the paper's trace (.txt) or YAML (.yaml/.yml).",
)
@click.option(
    "--seed",
    type=click.IntRange(min=0, max=MAX_SEED),
    default=0,
    show_default=True,
    help="Seeds a fault timeline's draws (jitter, redrawn delays) and --backend megatron's "
    "initial weights and tokens (a spec: seed).",
)
@output_file_option("--plot", (".png",), help="Gantt chart PNG of the last measured iteration.")
@calibration_option
def run(
    profile_path: str | None,
    policy: str | None,
    schedule_path: str | None,
    time_limit_s: float | None,
    system: str | None,
    backend: str,
    model: str | None,
    comm: str | None,
    injection: str,
    iterations: int,
    timeout_s: float | None,
    warmup_iterations: int,
    fmt: str,
    out: str,
    run_id: str | None,
    spec_path: str | None,
    trace: str | None,
    faults_path: str | None,
    seed: int,
    plot: str | None,
    calibration_path: str | None,
) -> None:
    """Run one configuration, or an experiment: --spec FILE, or the embedded default with
    none of --profile, --policy, --schedule and --system."""
    single = {"profile_path", "policy", "schedule_path", "system"}
    given = given_options()
    if spec_path is not None or not given & single:
        refuse_options(
            given - {"spec_path", "out", "run_id"},
            "--spec runs an experiment, which takes only --out and --run-id (its file sets the "
            "rest; --format, --trace and --plot are a single configuration's)"
            if spec_path
            else "without --profile/--policy/--schedule/--system, run runs the default "
            "experiment, which takes only --out and --run-id (give --profile and --system to "
            "run one configuration)",
        )
        spec = load_spec(Path(spec_path)) if spec_path else default_experiment()
        with folder_made_for(Path(out)):
            run_dir = Path(out) / run_id if run_id else new_run_dir(Path(out), spec.name)
            run_experiment(spec, run_dir, progress=lambda line: click.echo(line, err=True))
        click.echo(f"results written to {run_dir}")
        return
    refuse_options(given & {"out", "run_id"}, "one configuration writes no run directory")
    refuse_outputs_over_inputs()
    if system is not None:
        if policy is not None or schedule_path is not None or comm is not None:
            raise ConfigError(
                "--system is a policy, a comm and a controller: give no --policy, "
                "--schedule or --comm with it"
            )
        if profile_path is None:
            raise ConfigError("--system needs --profile")
        if time_limit_s is not None:
            raise ConfigError("--time-limit goes with --policy milp or adaptra, not --system")
        profile = Profile.from_file(profile_path)
    elif policy is None and schedule_path is None:
        raise ConfigError("give one of --system, --policy and --schedule")
    else:
        profile, planned = resolve(profile_path, policy, schedule_path, time_limit_s)
    if backend == "megatron":  # its DP ring sums the model's real gradients
        from pipeline.runtime.megatron.model import get_preset, with_model_bytes

        profile = with_model_bytes(profile, get_preset(model or "tiny"))
    if "seed" in given and backend != "megatron" and not faults_path:
        raise ConfigError(
            "--seed seeds a fault timeline's draws (--faults) and --backend megatron's model: "
            "this run has neither, so it would change nothing"
        )
    faults: FaultView = NO_FAULTS
    if faults_path:
        timeline = load_faults(Path(faults_path), seed)
        timeline.validate(profile.topology, iterations)
        faults = timeline
    if timeout_s is not None and backend == "sim":
        raise ConfigError("--timeout is the runtime workers' (--backend emulated or megatron)")
    recovery = Recovery(transport_timeout_s=timeout_s or CHECKPOINT_RESTART.transport_timeout_s)
    if calibration_path is not None:  # before its file's warnings
        check_calibrated(backend)
    host = load_host_costs(calibration_path)
    for warning in run_warnings(
        system,
        profile,
        faults,
        num_warmup_iterations=warmup_iterations,
        backend=backend,
        host=host,
        injection=injection,
    ):
        click.echo(warning, err=True)
    controller: Controller
    if system is not None:
        controller = system_controller(
            system,
            profile,
            faults,
            num_warmup_iterations=warmup_iterations,
            recovery=recovery,
            link_terms=link_terms(backend, injection),
        )
        label, comm = system, SYSTEMS[system][1]
    else:
        comm = comm or "direct"
        if comm == "delegated":
            profile = with_delegate_count(profile, faults)
        controller = fixed_plan(planned.schedule, profile, comm, planned.policy)
        label = planned.policy
    progress = terminal_progress(iterations, warmup_iterations, fmt)
    result = run_configuration(
        controller,
        backend=backend,
        num_iterations=iterations,
        num_warmup_iterations=warmup_iterations,
        faults=faults,
        recovery=recovery,
        injection=injection,
        model=model,
        host=host,
        on_iteration=None if progress is None else lambda k, *_: progress.step(k),
        delegated=comm == "delegated",
        seed=seed,
    )
    if progress is not None:
        progress.done()
    assert result.timeline is not None  # kept by default
    if trace:
        restarts = map(RestartMark, result.restarted_before, result.restart_causes)
        write_chrome_trace(result.timeline, trace, tuple(restarts), warmup_iterations)
    if plot:
        last = result.timeline.iterations[-1]  # numbered as run, warm-ups first
        plot_gantt(
            result.timeline.one_iteration(last.iteration),
            plot,
            title=f"{label}, {result.comms[-1].value}, {backend}, iteration "
            f"{result.iterations[-1]}",
        )
    # the delegates started, provisioned before the run (not detected); each iteration used
    # its plan's share of them (IterationDecision.num_delegates)
    delegated = any(decision.num_delegates for decision in result.decisions)
    num_delegates = with_delegate_count(profile, faults).delegate_count() if delegated else None
    if fmt == "json":
        _print_run_json(result, backend, label, system, seed, model, num_delegates)
    else:
        _print_run_text(result, backend, label, iterations, model, num_delegates)


def _print_run_json(
    result: RunResult,
    backend: str,
    label: str,
    system: str | None,
    seed: int,
    model: str | None,
    num_delegates: int | None,
) -> None:
    """`run --format json`'s one configuration."""
    megatron = {
        "model": model or "tiny",
        "losses": list(result.losses),
        "params_sha256": result.params_sha256,
    }
    emit_json(
        {
            "backend": backend,
            "policy": label if system is None else SYSTEMS[system][0],
            **({"system": system} if system else {}),
            "comm": result.comms_run,
            "controller": result.controller,
            **({"num_delegates": num_delegates} if num_delegates is not None else {}),
            "seed": seed,
            "iteration_times_ms": list(result.iteration_times_ms),
            "iterations": [
                {
                    "iteration": index,
                    "iteration_ms": time_ms,
                    "detected_ms": decision.detected_ms,
                    "policy": decision.policy or label,
                    "comm": decision.comm,
                    "microbatches": decision.microbatches,
                    "num_delegates": decision.num_delegates,
                    "failovers": num_failovers,
                    "moved_workers": num_moved,
                }
                for index, time_ms, decision, num_failovers, num_moved in zip(
                    result.iterations,
                    result.iteration_times_ms,
                    result.decisions,
                    result.num_failovers,
                    result.num_moved_workers,
                    strict=True,
                )
            ],
            "median_iteration_ms": result.median_iteration_ms,
            "median_wall_ms": result.median_wall_ms,
            **({"devices": result.devices} if result.devices else {}),
            "step_times_ms": list(result.step_times_ms),
            "reused_iterations": result.reused_iterations,
            "restarts": result.restarts,
            "lost_iterations": result.lost_iterations,
            "restart_wall_ms": result.restart_wall_ms,
            "restart_model_ms": result.restart_model_ms,
            "restart_causes": list(result.restart_causes),
            **(megatron if backend == "megatron" else {}),
        }
    )


def _print_run_text(
    result: RunResult,
    backend: str,
    label: str,
    iterations: int,
    model: str | None,
    num_delegates: int | None,
) -> None:
    """`run`'s one configuration, for people."""
    # With a DP step the time per training step is the iteration and the step (a slow DP
    # link shows in the step only).
    step = (
        f" ({result.median_wall_ms:.3f} ms with the all-reduce and optimizer step)"
        if any(result.step_times_ms)
        else ""
    )
    counted = f"{iterations} iteration{'' if iterations == 1 else 's'}"
    if result.lost_iterations:  # the medians are over every iteration run
        counted = (
            f"{len(result.iteration_times_ms)} iterations run ({iterations} measured, "
            f"{result.lost_iterations} run again after a restart)"
        )
    delegates = ""
    if num_delegates is not None:
        used = sorted({d.num_delegates for d in result.decisions if d.num_delegates})
        counts = str(used[0]) if len(used) == 1 else f"{used[0]}-{used[-1]}"
        delegates = f", {counts} of {num_delegates} delegate(s) a link direction"
    click.echo(
        f"{label} over {result.comms_run} ({backend}, {result.controller} plan{delegates}): "
        f"median iteration {result.median_iteration_ms:.3f} ms{step} over {counted}"
    )
    if result.restarts:
        click.echo(
            f"{result.restarts} checkpoint-restart(s), {result.lost_iterations} iteration(s) "
            f"run again, {result.restart_model_ms:.0f} ms of modelled restart cost"
        )
        for cause in result.restart_causes:
            click.echo(f"  restarted after {cause}")
    if any(result.num_failovers):
        click.echo(_failovers_line(result.iterations, result.num_failovers))
    if any(result.num_moved_workers):
        click.echo(_moves_line(result.iterations, result.num_moved_workers))
    if any(decision.microbatches for decision in result.decisions):
        click.echo(_splits_line(result.iterations, result.decisions))
    if result.reused_iterations:
        reused = result.reused_iterations
        click.echo(
            f"{reused} identical iteration{'s' * (reused != 1)} reused (same plan and faults)"
        )
    if result.devices:
        click.echo(f"workers: {result.devices}")
    if backend == "megatron":
        click.echo(f"losses ({model or 'tiny'}): {', '.join(f'{x:.6f}' for x in result.losses)}")
        click.echo(f"params_sha256: {result.params_sha256}")


@click.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
def report(run_dir: str) -> None:
    """Rebuild a run directory's figures and report.md from its results (refused while a run
    still writes it; an interrupted run's report says how many configurations it lacks)."""
    from harness.report import write_report
    from harness.results import RUNS_COLUMNS, read_csv_rows, read_spec_record, run_dir_held
    from harness.spec import finish_advice, resolved_from_record, spec_from_record

    path = Path(run_dir)
    if not (path / "spec.json").is_file():  # before the hold, whose lock file would stay
        raise ConfigError(f"{path} is not a run directory: it has no spec.json")
    with run_dir_held(path, advice="report it once that run has ended", shared=True):
        record = read_spec_record(path)  # its errors name the file
        try:
            spec = spec_from_record(record)
        except (ConfigError, TypeError) as err:  # a field of the wrong type or value
            raise ConfigError(f"{path / 'spec.json'}: {err}") from err
        runs = read_csv_rows(path / "runs.csv", RUNS_COLUMNS)
        if not runs:  # stopped before its first configuration ended
            listed = len(resolved_from_record(record, path / "spec.json").configurations)
            raise ConfigError(
                f"{path} is an unfinished run (0 of {listed} configurations): "
                f"{finish_advice(record, spec, path)}"
            )
        coverage = write_report(spec, path, runs)
    incomplete = "" if coverage.complete else f" ({coverage}: incomplete)"
    click.echo(f"report written to {path / 'report.md'}{incomplete}")


@click.command()
@click.argument("job_dir", type=click.Path(exists=True, file_okay=False))
@_run_dir_options(
    out_help="Where the run directory goes.",
    run_id_help="The run directory's name inside --out (a new one; default: the spec's name "
    "and the time).",
)
def collect(job_dir: str, out: str, run_id: str | None) -> None:
    """Turn a cluster job's results (the folder `launch --spec` wrote, after its run.sbatch
    ran) into a run directory, as `run --spec` writes one: runs.csv, iterations.csv and
    report.md, for `report` and `compare`. Steps without results are left out and named."""
    from harness.collect import collect_job

    with folder_made_for(Path(out)):
        collected = collect_job(
            Path(job_dir), Path(out), run_id, progress=lambda line: click.echo(line, err=True)
        )
    left = f"; {len(collected.not_run)} without results left out" if collected.not_run else ""
    skipped = f"; {collected.num_skipped} the launch skipped" if collected.num_skipped else ""
    click.echo(
        f"collected {collected.num_collected} configuration run(s){left}{skipped}: "
        f"{collected.run_dir} (report.md in it)"
    )


def _run_name(param: click.Parameter, value: str | None) -> str | None:
    try:
        return None if value is None else check_run_name(value, "the run id")
    except ConfigError as err:
        raise click.BadParameter(str(err), param=param) from err


def _moves_line(iterations: tuple[int, ...], num_moved: tuple[int, ...]) -> str:
    """The workers rank swaps moved, by measured iteration: "rank swaps moved 2 worker(s):
    2 at the start of iteration 4 (--trace shows them)"."""
    moves = zip(iterations, num_moved, strict=True)
    where = [f"{n} at the start of iteration {k}" for k, n in moves if n]
    return f"rank swaps moved {sum(num_moved)} worker(s): {', '.join(where)} (--trace shows them)"


def _splits_line(iterations: tuple[int, ...], decisions: tuple[IterationDecision, ...]) -> str:
    """The iterations run on an uneven split of the global batch (a rebalance), in runs of
    one split, each counted once (one run again after a restart is listed again): "the
    global batch rebalanced over the DP replicas in 7 iteration(s): 8-14 as 12+4"."""
    runs: list[tuple[int, int, str]] = []  # first, last iteration, split
    for k, decision in zip(iterations, decisions, strict=True):
        split = decision.microbatches
        if not split:
            continue
        if runs and runs[-1][2] == split and runs[-1][1] + 1 == k:
            runs[-1] = (runs[-1][0], k, split)
        else:
            runs.append((k, k, split))
    where = [f"{a}{f'-{b}' * (b != a)} as {split}" for a, b, split in runs]
    num_split = len({k for a, b, _ in runs for k in range(a, b + 1)})  # (runs again: once)
    return (
        f"the global batch rebalanced over the DP replicas in {num_split} iteration(s): "
        + ", ".join(where)
    )


def _failovers_line(iterations: tuple[int, ...], num_failovers: tuple[int, ...]) -> str:
    """The delegates' moves to another NIC, by measured iteration: "3 failover(s) to another
    NIC: 2 in iteration 4, 1 in iteration 5 (--trace shows when and why)"."""
    where = [f"{n} in iteration {k}" for k, n in zip(iterations, num_failovers, strict=True) if n]
    return (
        f"{sum(num_failovers)} failover(s) to another NIC: {', '.join(where)} "
        "(--trace shows when and why)"
    )
