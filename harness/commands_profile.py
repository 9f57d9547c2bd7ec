"""`profile`: measure a real model's per-stage op times into a profile file."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import click

from harness.cli_common import FiniteFloatRange, emit_json, output_file_option, terminal_progress
from harness.loop import MAX_ITERATIONS
from harness.results import git_revision
from harness.runner import check_processes
from pipeline.errors import ConfigError
from pipeline.files import write_atomic
from pipeline.host_costs import (
    CALIBRATION_STAGES,
    DEFAULT_CALIBRATION_OP_MS,
    MAX_CALIBRATION_OP_MS,
    CostCurve,
)
from pipeline.profile import MAX_MICROBATCHES

__all__ = ["calibrate", "profile"]


@click.command()
@click.option("--backend", type=click.Choice(["megatron"]), default="megatron")
@click.option("--model", default="tiny", show_default=True, help="GPT configuration.")
@click.option("--stages", type=click.IntRange(min=1), required=True, help="Pipeline stages.")
@click.option(
    "--microbatches",
    type=click.IntRange(min=1, max=MAX_MICROBATCHES),
    help="Microbatches per iteration (default: 2 x stages).",
)
@click.option(
    "--iterations",
    type=click.IntRange(min=1, max=MAX_ITERATIONS),
    default=3,
    show_default=True,
    help="Measured iterations.",
)
@output_file_option(
    "--out",
    (".json",),
    required=True,
    help="Where to write the profile JSON (the README's profile file).",
)
@click.option(
    "--tf32/--no-tf32",
    default=False,
    show_default=True,
    help="On a GPU, float32 matrix products on tensor cores (TF32: faster, to about 1e-3 "
    "relative); off, a GPU computes in float32 as a CPU does. No effect on a CPU.",
)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
def profile(
    backend: str,
    model: str,
    stages: int,
    microbatches: int | None,
    iterations: int,
    out: str,
    tf32: bool,
    fmt: str,
) -> None:
    """Run MODEL split into STAGES worker processes and write its median tF/tB/tW per stage
    (ms) and message bytes as a profile file for `schedule`, `simulate` and `run`. Times from
    a machine with fewer cores than stages, or with GPUs but fewer than stages, are not
    results."""
    from pipeline.runtime.devices import num_visible_gpus
    from pipeline.runtime.megatron.model import get_preset
    from pipeline.runtime.megatron.profiling import measure_profile

    get_preset(model).check_stages(stages)
    num_microbatches = microbatches if microbatches is not None else 2 * stages
    if num_microbatches < stages:
        raise ConfigError(f"--microbatches ({num_microbatches}) must be >= --stages ({stages})")
    _warn_if_cores_are_shared(stages)
    gpus_warning = shared_gpus_warning(stages, num_visible_gpus())
    if gpus_warning is not None:
        click.echo(gpus_warning, err=True)
    if tf32 and num_visible_gpus() == 0:
        click.echo("warning: --tf32 has no effect without a GPU (none is visible)", err=True)
    progress = terminal_progress(iterations, 1, fmt)  # measure_profile's one warm-up first
    measured = measure_profile(
        model,
        stages,
        num_microbatches,
        num_iterations=iterations,
        on_iteration=None if progress is None else progress.step,
        allow_tf32=tf32,
    )
    if progress is not None:
        progress.done()
    data = measured.to_dict()
    try:
        write_atomic(out, json.dumps(data, indent=1) + "\n")
    except OSError as err:
        raise ConfigError(f"cannot write {out}: {err.strerror}") from err
    if fmt == "json":
        emit_json(data)
        return
    click.echo(
        f"{model} ({backend}) over {stages} stages: t_f {list(measured.t_f_ms)}, "
        f"t_b {list(measured.t_b_ms)}, t_w {list(measured.t_w_ms)} ms, "
        f"{measured.message_bytes} bytes per message; written to {out}"
    )


@click.command()
@output_file_option(
    "--out",
    (".json",),
    required=True,
    help="Where to write this host's costs (a calibration JSON for --calibration).",
)
@click.option(
    "--repeats",
    type=click.IntRange(min=1, max=MAX_ITERATIONS),
    default=3,
    show_default=True,
    help="Per point.",
)
@click.option(
    "--stages",
    type=click.IntRange(*CALIBRATION_STAGES),
    default=4,
    show_default=True,
    help="Workers passing messages: as many as the runs to predict (each a process with its "
    "delegates' processes).",
)
@click.option(
    "--op-ms",
    type=FiniteFloatRange(min=0, max=MAX_CALIBRATION_OP_MS, min_open=True),
    default=DEFAULT_CALIBRATION_OP_MS,
    show_default=True,
    help="How long the microbenchmarks' ops last: as long as those of the runs to predict.",
)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
def calibrate(out: str, repeats: int, stages: int, op_ms: float, fmt: str) -> None:
    """Measure what the worker runtime costs on this host (per-op overhead, a send's cost
    and the receive lag by message size, the delegated path's copies and pick-up, the DP
    ring's lag, a failover) with microbenchmarks of real worker processes and delegates, and
    write them for `simulate`/`run --calibration`. Takes 1.5-3 min on 2 cores (the longer on a
    loaded host, whose costs it then measures too): run it on an idle host."""
    from adaptra.transport import Delegates
    from pipeline.runtime.calibrate import largest_pool, measure_host_costs

    check_processes(largest_pool(stages), delegated=True, remedy="use fewer --stages")
    note = shared_cores_note(stages, len(os.sched_getaffinity(0)))
    if note is not None:
        click.echo(note, err=True)
    costs = measure_host_costs(
        repeats,
        stages,
        progress=lambda line: click.echo(line, err=True),
        delegates=Delegates(),
        op_ms=op_ms,
    )
    costs = dataclasses.replace(costs, git_revision=git_revision())
    data = costs.to_dict()
    write_atomic(Path(out), json.dumps(data, indent=1) + "\n")
    if fmt == "json":
        emit_json(data)
        return
    click.echo(
        f"per op {costs.op_overhead_ms:.3f} ms; a send {_by_size(costs.send_ms_by_bytes)}; "
        f"receive lag {_by_size(costs.receive_lag_ms_by_bytes)}; written to {out}"
    )


def shared_cores_warning(num_stages: int, num_cores: int) -> str | None:
    """What to say where the stages' worker processes outnumber the CPU cores (None: they
    do not): each op's time then includes waiting for a core."""
    if num_stages <= num_cores:
        return None
    return (
        f"warning: {num_stages} stages on {num_cores} CPU core(s): the workers share cores, so "
        "the times measured include waiting for one (not results; use --stages "
        f"{num_cores} or fewer, or a larger machine)"
    )


def shared_gpus_warning(num_stages: int, num_gpus: int) -> str | None:
    """What `profile` says where its stages outnumber the GPUs they compute on (None: no GPU,
    where the cores' warning speaks, or a GPU per stage): stages on one GPU time-slice it, and
    the measuring order (ZB-H1's) runs their ops side by side."""
    if num_gpus == 0 or num_stages <= num_gpus:
        return None
    return (
        f"warning: {num_stages} stages on {num_gpus} GPU(s): the stages that share a GPU "
        "time-slice it, so an op's time includes the kernels of the other stages' ops that run "
        f"beside it (not results; use --stages {num_gpus} or fewer, or a GPU per stage)"
    )


def shared_cores_note(num_stages: int, num_cores: int) -> str | None:
    """What `calibrate` says where its stages outnumber the CPU cores (None: they do not):
    no warning, as `profile`'s, since the runs it calibrates for share the cores as much."""
    if num_stages <= num_cores:
        return None
    return (
        f"note: {num_stages} stages on {num_cores} CPU core(s): the costs measured include "
        f"waiting for a core, as those of the {num_stages}-stage runs they predict here"
    )


def _warn_if_cores_are_shared(num_stages: int) -> None:
    warning = shared_cores_warning(num_stages, len(os.sched_getaffinity(0)))
    if warning is not None:
        click.echo(warning, err=True)


def _by_size(curve: CostCurve) -> str:
    return ", ".join(f"{ms:.3f} ms at {size >> 10} KiB" for size, ms in curve.points) or "0 ms"
