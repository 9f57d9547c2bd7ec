"""`launch`, `doctor` and `cleanup`: the machines a run needs."""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import click

from harness.cli_common import (
    OutputFolder,
    SpecFile,
    emit_json,
    given_options,
    refuse_options,
    resolve,
    schedule_options,
    seconds,
)
from harness.loop import MAX_ITERATIONS
from harness.runner import check_hold, check_processes, longest_hold_ms
from pipeline.errors import ConfigError
from pipeline.files import write_atomic
from pipeline.metrics import compute_metrics
from pipeline.profile import MAX_REPLICAS
from pipeline.torchrun_launch import (
    TIMELINE_FILE,
    check_master_addr,
    remove_step_results,
    torchrun_commands,
)

__all__ = ["cleanup", "doctor", "launch"]

MAX_GPUS_PER_NODE = 1024
"""The most GPUs a Slurm script's node may have (--gpus-per-node): more than any node has."""


@click.command()
@schedule_options
@click.option("--nodes", type=click.IntRange(min=1), default=1, help="Hosts to run on.")
@click.option(
    "--replicas",
    type=click.IntRange(min=1, max=MAX_REPLICAS),
    default=None,
    help="DP replicas [the profile's dp].",
)
@click.option(
    "--master-addr",
    help="Address of node 0 (needed with --nodes > 1; one node: 127.0.0.1).",
)
@click.option(
    "--master-port",
    type=click.IntRange(1, 65535),
    default=29500,
    help="Node 0's port for torchrun's store [29500; with --run, a free one the store binds "
    "itself unless given; with --spec, a multi-node step's only (default 29500 + the Slurm "
    "job id mod 1000): a one-node step's store binds a free one].",
)
@click.option(
    "--iterations", type=click.IntRange(min=1, max=MAX_ITERATIONS), default=3, show_default=True
)
@click.option(
    "--warmup-iterations",
    type=click.IntRange(min=0, max=MAX_ITERATIONS),
    default=1,
    show_default=True,
    help="Iterations run first and left out of the timeline (start-up is in the first).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=seconds(),
    default=60.0,
    show_default=True,
    help="How long a worker waits for one message, s; a profile delay not shorter than it "
    "is refused (its receiver would time out).",
)
@click.option(
    "--out",
    type=OutputFolder(),
    default="results/launch",
    show_default=True,
    help="Where the profile, schedule and (with --run) timeline.json go; every node reads the "
    "first two there.",
)
@click.option("--run", "run_here", is_flag=True, help="Run it on this host (one node only).")
@click.option(
    "--spec",
    "spec_path",
    type=SpecFile(),
    help="Write a Slurm script (OUT/run.sbatch) running this experiment spec (or bundled "
    "preset, as `run --spec` takes it) instead.",
)
@click.option(
    "--run-timeout-s",
    type=seconds(),
    default=600.0,
    show_default=True,
    help="With --run: how long torchrun may take (start-up and every iteration) before it "
    "and its workers are stopped and the launch fails.",
)
@click.option(
    "--gpus-per-node",
    type=click.IntRange(min=1, max=MAX_GPUS_PER_NODE),
    default=8,
    show_default=True,
    help="With --spec: ranks per node (a step's go on the fewest nodes that take the same "
    "number each); a megatron spec's job requests as many GPUs per node, an emulated one's "
    "none.",
)
@click.option(
    "--job-time",
    default="01:00:00",
    show_default=True,
    help="The Slurm job's time limit (with --spec), as sbatch --time takes it: "
    "[DAYS-]HH:MM:SS, MM:SS or minutes.",
)
def launch(
    profile_path: str | None,
    policy: str | None,
    schedule_path: str | None,
    time_limit_s: float | None,
    nodes: int,
    replicas: int | None,
    master_addr: str | None,
    master_port: int,
    iterations: int,
    warmup_iterations: int,
    timeout_s: float,
    out: str,
    run_here: bool,
    spec_path: str | None,
    run_timeout_s: float,
    gpus_per_node: int,
    job_time: str,
) -> None:
    """Print the torchrun command for every node (emulated compute), or run it here; with
    --spec, write a Slurm batch script for every configuration of an experiment. This path
    runs fixed plans only for now (no fault timeline, no re-planning controller). Workers
    send rank 0 pickled records and torchrun's store listens on every interface: launch
    across hosts only on a network you trust (--run keeps it on loopback where it can)."""
    if spec_path is not None:
        from harness.slurm import write_slurm_script
        from harness.spec import load_spec

        refuse_options(
            given_options() - {"spec_path", "out", "gpus_per_node", "master_port", "job_time"},
            "--spec takes the configurations, their iterations, sizes and timeout from the "
            "spec (the script takes --out, --gpus-per-node, --master-port and --job-time)",
        )
        script = write_slurm_script(
            load_spec(Path(spec_path)),
            Path(out),
            gpus_per_node=gpus_per_node,
            time_limit=job_time,
            master_port=master_port if "master_port" in given_options() else None,
        )
        skipped = f"; {script.num_skipped} skipped, listed in it" if script.num_skipped else ""
        plural = "" if script.num_configurations == 1 else "s"
        click.echo(
            f"wrote {script.path} ({script.num_configurations} configuration{plural}{skipped}): "
            f"sbatch {shlex.quote(str(script.path))}, then adaptra-bench collect "
            f"{shlex.quote(str(script.path.parent))} for its results"
        )
        return
    from pipeline.runtime.local_launch import check_local_address, run_local

    refuse_options(
        given_options() & {"gpus_per_node", "job_time"}, "it is the Slurm script's (with --spec)"
    )
    if not run_here:
        refuse_options(given_options() & {"run_timeout_s"}, "it limits a launch with --run")
    out_dir = Path(out).resolve()  # the commands name it: any node, any working directory
    written = {out_dir / "profile.json", out_dir / "schedule.json"}
    for flag, given in (("--profile", profile_path), ("--schedule", schedule_path)):
        if given is not None and Path(given).resolve() in written:  # (a link to one too)
            raise ConfigError(
                f"{flag} {given} is a file this launch writes in --out {out}, over it: "
                "give another --out"
            )
    profile, planned = resolve(profile_path, policy, schedule_path, time_limit_s)
    if replicas is not None:
        profile = dataclasses.replace(profile, num_replicas=replicas)
    world = profile.num_stages * profile.num_replicas
    if world % nodes:
        raise ConfigError(f"{world} ranks do not split evenly over {nodes} nodes")
    if run_here and nodes != 1:
        raise ConfigError("--run starts one node only; run the printed commands on each node")
    if run_here:  # every rank a process here, as `run --backend emulated` starts them
        check_processes(profile, delegated=False)
    if master_addr is not None and not master_addr.strip():
        raise ConfigError("--master-addr is empty: give the address of node 0")
    if master_addr is None and nodes > 1:
        raise ConfigError(f"--nodes {nodes} needs --master-addr: the address of node 0")
    if master_addr is not None:
        check_master_addr(master_addr)
    loopback = not run_here or master_addr is None or check_local_address(master_addr)
    check_hold(longest_hold_ms(profile), timeout_s)  # before anything is written or run
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_step_results(out_dir)  # an earlier run's: a run that fails must not leave them
    write_atomic(out_dir / "profile.json", json.dumps(profile.to_dict()))
    write_atomic(out_dir / "schedule.json", json.dumps(planned.schedule.to_dict()))
    worker_args = [
        "--profile",
        str(out_dir / "profile.json"),
        "--schedule",
        str(out_dir / "schedule.json"),
        "--warmup-iterations",
        str(warmup_iterations),
        "--iterations",
        str(iterations),
        "--timeout",
        repr(timeout_s),  # exact: the check above passed this value
        "--out",
        str(out_dir),
    ]
    # A local run's store binds a free port itself unless told one (29500 may be another
    # run's, and a port picked here may be taken before torchrun binds it).
    port = None if run_here and "master_port" not in given_options() else master_port
    commands = torchrun_commands(
        num_nodes=nodes,
        procs_per_node=world // nodes,
        master_addr=master_addr or "127.0.0.1",
        master_port=port,
        worker_args=worker_args,
        log_dir=None if run_here else out_dir / "torchrun-logs",
    )
    if not run_here:
        for command in commands:
            click.echo(command)
        click.echo(
            f"(wrote the profile and schedule they read to {out_dir}: every node needs them "
            "at that path)",
            err=True,
        )
        return
    timeline = run_local(commands[0], out_dir, loopback=loopback, timeout_s=run_timeout_s)
    times = [compute_metrics(timeline, i).iteration_time_ms for i in range(iterations)]
    click.echo(json.dumps({"iteration_times_ms": times, "timeline": str(out_dir / TIMELINE_FILE)}))


@click.command()
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
def doctor(fmt: str) -> None:
    """What this machine can do, and what that means for a run."""
    from injectors.doctor import run_checks

    checks = run_checks()
    if fmt == "json":
        emit_json(
            {c.name: {"ok": c.ok, "detail": c.detail, "consequence": c.consequence} for c in checks}
        )
        return
    for check in checks:
        line = f"{'ok ' if check.ok else 'NO '} {check.name:<16} {check.detail}"
        click.echo(line if check.ok else f"{line}\n     -> {check.consequence}")


@click.command()
def cleanup() -> None:
    """Remove what a killed run left: the torchrun (and its workers) of a `launch --run`
    killed by SIGKILL, which runs on with nowhere to send its results; the network
    namespaces of testbeds; and the worker pools' folders (rendezvous, slots, checkpoints)
    and `launch --run`'s torchrun folder, in the temporary folder and /dev/shm, whose
    processes are gone. Those of live runs are left, and so are namespaces no testbed owns
    and folders another program marked."""
    from injectors.ownership import cleanup as remove_leftovers
    from injectors.testbed import PREFIX, TestbedError
    from pipeline.runtime.scratch import clean_orphaned, stop_orphaned_torchruns

    torchruns = stop_orphaned_torchruns()
    click.echo(
        f"stopped {len(torchruns)} torchrun(s) whose launch was killed, with their workers"
        + (": pid " + ", ".join(map(str, torchruns)) if torchruns else "")
    )
    folders = clean_orphaned()
    click.echo(
        f"removed {len(folders.removed)} worker pool folder(s)"
        + (": " + ", ".join(map(str, folders.removed)) if folders.removed else "")
    )
    for folder, why in folders.failed:
        click.echo(f"could not remove {folder}: {why}", err=True)
    report = remove_leftovers(PREFIX)
    click.echo(
        f"removed {len(report.removed)} namespace(s)"
        + (": " + ", ".join(report.removed) if report.removed else "")
    )
    for name, why in report.left:
        click.echo(f"left {name}: {why}")
    for name, error in report.failed:
        click.echo(f"could not remove {name}: {error}", err=True)
    if report.failed or folders.failed:
        raise TestbedError(
            f"{len(folders.failed)} folder(s) and {len(report.failed)} namespace(s) could not "
            "be removed (see above)"
        )
