"""Cluster launch of an experiment spec: a Slurm batch script that runs every configuration
through torchrun (pipeline.runtime.torchrun), one srun step per configuration and repeat.

Each configuration's profile and schedule are planned here and written next to the script,
so the cluster runs exactly what the simulator would have run.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import shlex
import sys
from pathlib import Path
from typing import NamedTuple

from harness.cluster_job import ClusterJob, ClusterStep
from harness.names import slug
from harness.results import git_revision
from harness.runner import check_hold, longest_hold_ms
from harness.spec import ExperimentSpec, controller_for
from pipeline.errors import ConfigError
from pipeline.files import write_atomic
from pipeline.profile import Profile
from pipeline.schedule import Schedule
from pipeline.simulator import CommMode
from pipeline.torchrun_launch import STEP_RESULTS, remove_step_results

__all__ = ["SlurmScript", "node_count", "write_slurm_script"]

SLURM_TIME = re.compile(r"\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}")
"""sbatch --time's forms: minutes, MM:SS, HH:MM:SS, DAYS-HH, DAYS-HH:MM, DAYS-HH:MM:SS."""


class SlurmScript(NamedTuple):
    path: Path
    num_configurations: int
    """Configurations it runs (each `num_repeats` times, an srun step each)."""
    num_skipped: int
    """Configurations it lists as skipped (with why, in comments)."""


_JOB_PORT = "$((29500 + SLURM_JOB_ID % 1000))"
"""Node 0's port for a multi-node step's store where none is given: the job's own."""


def write_slurm_script(
    spec: ExperimentSpec,
    out_dir: Path,
    *,
    gpus_per_node: int = 8,
    time_limit: str = "01:00:00",
    master_port: int | None = None,
) -> SlurmScript:
    """Write `out_dir/run.sbatch` and each configuration's files. Configurations the torchrun
    path cannot run (yet: the delegated path, fault timelines, TP; a delay its workers would
    time out on) are listed in the script as skipped, with why. A refused spec writes
    nothing. `master_port`: node 0's port for a multi-node step's store (None: 29500 plus the
    job's id mod 1000, so that two jobs Slurm puts on one node meet on different ports)."""
    if gpus_per_node < 1:
        raise ConfigError(f"--gpus-per-node must be >= 1, got {gpus_per_node}")
    if not SLURM_TIME.fullmatch(time_limit):
        raise ConfigError(
            f"job time {time_limit!r} is not one sbatch --time takes: "
            "[DAYS-]HH:MM:SS, DAYS-HH[:MM], MM:SS or minutes"
        )
    if spec.injection != "hook":
        raise ConfigError(
            f"injection {spec.injection!r}: the cluster script injects nothing in the network "
            "(its delays are the workers' fault hook); use injection: hook"
        )
    out_dir = out_dir.resolve()  # the script may run from anywhere
    launch_id = secrets.token_hex(16)  # its steps' results are this launch's (harness.collect)
    compute_args = ["--compute", "emulated"]
    if spec.backend == "megatron":  # a megatron spec names its GPT preset as its model
        compute_args = ["--compute", "megatron", "--model", str(spec.models[0])]
    steps: list[str] = []
    job_steps: list[ClusterStep] = []
    skipped: list[str] = []
    reasons: dict[_Skip, int] = {}  # why configurations are skipped, and how many for each
    plans: dict[Path, tuple[Profile, Schedule]] = {}  # written once the spec is not refused
    max_nodes, max_per_node, num_configurations = 1, 1, 0
    for target in spec.targets():
        model = target.cost.model if target.cost else None
        for scenario in spec.scenarios(target):
            for system in spec.systems:
                name = f"{target.label}/{system}/{scenario.name}"
                # One fixed schedule per step: Adaptra's is the one it runs once it has found
                # the scenario's delays (its oracle's plan).
                known = "adaptra-oracle" if system == "adaptra" else system
                planned = controller_for(known, target, scenario).plan(0)
                schedule, profile = planned.schedule, planned.profile
                why = _unsupported(model.tp if model else 1, scenario.faults is not None)
                why = why or _unrunnable(profile, planned.comm, spec.transport_timeout_s)
                if why:
                    skipped.append(f"skipped {name}: {why}")
                    reasons[why] = reasons.get(why, 0) + 1
                    continue
                config = slug((target.label, system, scenario.name), "configuration name")
                config_dir = out_dir / config
                plans[config_dir] = (profile, schedule)
                world = profile.num_stages * profile.num_replicas
                num_nodes = node_count(world, gpus_per_node)
                max_nodes = max(max_nodes, num_nodes)
                max_per_node = max(max_per_node, world // num_nodes)
                num_configurations += 1
                steps.append(_comment(f"{name}: {world} ranks on {num_nodes} node(s)"))
                for repeat in range(spec.num_repeats):  # a step each, in a folder each
                    step_dir, step_name = config_dir, config
                    if spec.num_repeats > 1:
                        step_dir, step_name = config_dir / f"repeat-{repeat}", f"{config}-{repeat}"
                    job_steps.append(
                        ClusterStep(
                            (target.label, system, scenario.name, str(repeat)),
                            str(step_dir.relative_to(out_dir)),
                            planned.policy,
                            _as_stepped(planned.comm.value),
                            {link: _as_stepped(c) for link, c in planned.comm_by_link().items()},
                            dict(planned.believed_ms),
                        )
                    )
                    worker_args = [
                        "--profile",
                        str(config_dir / "profile.json"),
                        "--schedule",
                        str(config_dir / "schedule.json"),
                        "--warmup-iterations",
                        str(spec.num_warmup_iterations),
                        "--iterations",
                        str(spec.num_iterations),
                        "--timeout",
                        repr(spec.transport_timeout_s),  # exact: the spec checked this value
                        *compute_args,
                        "--seed",  # megatron's weights and tokens (the emulated has neither)
                        str(spec.seed),
                        "--out",
                        str(step_dir),
                        "--launch-id",
                        launch_id,
                    ]
                    steps.append(
                        f"run_step {num_nodes} {world // num_nodes} {shlex.quote(step_name)} "
                        + shlex.join([str(step_dir), *worker_args])
                    )
    if not steps:
        raise ConfigError(
            "no configuration of this spec can run on the cluster yet: " + _grouped(reasons)
        )
    for config_dir, (profile, schedule) in plans.items():
        config_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(config_dir / "profile.json", json.dumps(profile.to_dict()))
        write_atomic(config_dir / "schedule.json", json.dumps(schedule.to_dict()))
    for step in job_steps:  # an earlier launch's results: `collect` must not take them
        remove_step_results(out_dir / step.folder)
    script = "\n".join(
        [
            "#!/bin/bash",
            f"#SBATCH --job-name={_job_name(spec.name)}",
            f"#SBATCH --nodes={max_nodes}",
            "#SBATCH --ntasks-per-node=1",
            # A CPU for each of a node's ranks (each a process of one thread): a task's one
            # CPU by default, which its torchrun's workers all shared.
            f"#SBATCH --cpus-per-task={max_per_node}",
            # An emulated step computes on the CPU (sleeps): its GPUs would be held for nothing.
            f"#SBATCH --gpus-per-node={gpus_per_node}"
            if spec.backend == "megatron"
            else f"# (emulated compute: no GPU; --gpus-per-node {gpus_per_node} places the ranks)",
            f"#SBATCH --time={time_limit}",
            _comment(f"Written by adaptra-bench from spec {spec.name!r}."),
            "# One srun step per configuration and repeat (folders repeat-K if the spec repeats),",
            "# each a torchrun of pipeline.runtime.torchrun; each step's folder gets its measured",
            "# iterations' timeline (warm-ups run first, unreported), and torchrun's logs (in",
            "# torchrun-logs/, each worker's output too, not a folder of the nodes' temporary",
            "# directory left behind).",
            "set -euo pipefail",
            "if [[ -z ${SLURM_JOB_NODELIST:-} || -z ${SLURM_JOB_ID:-} ]]; then",
            '  echo "this is a Slurm batch script: submit it with sbatch (no Slurm job here)" >&2',
            "  exit 2",
            "fi",
            "# Node 0 (the job's first) hosts each step's rendezvous. The whole list is read:",
            "# `| head -n 1` ended the job here, under pipefail, once it outgrew the pipe.",
            'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST") || MASTER_ADDR=',
            "MASTER_ADDR=${MASTER_ADDR%%$'\\n'*}",
            "if [[ -z $MASTER_ADDR ]]; then",
            '  echo "no node to run on: scontrol show hostnames names none of'
            ' $SLURM_JOB_NODELIST" >&2',
            "  exit 1",
            "fi",
            "# A multi-node step's store is on node 0 at this port (torch joins whatever holds",
            "# it: a job id's own port keeps two of these jobs on one node apart).",
            f"MASTER_PORT={_JOB_PORT if master_port is None else master_port}",
            "# The Python that wrote this script (its torch, adaptra-bench), unless PYTHON says.",
            f"PYTHON=${{PYTHON:-{shlex.quote(sys.executable)}}}",
            "# A step that fails is named at the end (the job then exits 1); the others run.",
            "failed=()",
            "run_step() {  # nodes, ranks per node, step name, its folder, worker arguments...",
            "  local nodes=$1 per_node=$2 name=$3 folder=$4; shift 4",
            # A one-node step's store binds a free port itself (as `launch --run`'s): one
            # that found --master-port taken on node 0 (another job's, any torchrun's
            # default) joined that store as a client, and failed once its owner ended.
            '  local rendezvous=(--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT")',
            "  if (( nodes == 1 )); then",
            "    rendezvous=(--rdzv-endpoint=127.0.0.1:0 --local-addr=127.0.0.1"
            " --rdzv-conf=is_host=1)",
            "  fi",
            "  rm -f " + " ".join(f'"$folder/{name}"' for name in STEP_RESULTS),
            # One torchrun on each of the job's first nodes, node 0 (its rendezvous) among
            # them: srun takes the job's SLURM_NTASKS (all its nodes) as its -n unless given one.
            # (--cpus-per-task: srun does not take the job's in every Slurm version)
            '  if ! srun --nodes="$nodes" --ntasks="$nodes" --ntasks-per-node=1 --relative=0 \\',
            '    --cpus-per-task="$per_node" \\',
            '    "$PYTHON" -m torch.distributed.run \\',
            '    --nnodes="$nodes" --nproc-per-node="$per_node" --rdzv-backend=c10d \\',
            '    "${rendezvous[@]}" --rdzv-id="$SLURM_JOB_ID-$name" \\',
            '    --log-dir="$folder/torchrun-logs" --tee=3 -m pipeline.runtime.torchrun "$@"; then',
            '    echo "step $name failed (its torchrun-logs/ say why)" >&2',
            '    failed+=("$name")',
            "  fi",
            "}",
            *steps,
            *map(_comment, skipped),
            "if (( ${#failed[@]} )); then",
            '  echo "${#failed[@]} step(s) failed: ${failed[*]}" >&2',
            "  exit 1",
            "fi",
            _comment(
                f"Then `adaptra-bench collect {out_dir}` turns the steps' timelines into a run "
                "directory (runs.csv, iterations.csv, report.md) for report and compare."
            ),
            "",
        ]
    )
    # What the steps run: a sim spec's configurations run the emulated workers.
    ran = spec.to_dict() | {"backend": "megatron" if spec.backend == "megatron" else "emulated"}
    ClusterJob(
        json.loads(json.dumps(ran)), git_revision(), launch_id, tuple(job_steps), tuple(skipped)
    ).write(out_dir)
    path = out_dir / "run.sbatch"
    write_atomic(path, script)
    path.chmod(0o755)
    return SlurmScript(path, num_configurations, len(skipped))


def _comment(text: str) -> str:
    """A comment line of the script: any line break or other control character in `text`
    (user-given names are in it) is written as its escape, so the line stays a comment."""
    return "# " + "".join(
        c if c == " " or c.isprintable() else c.encode("unicode_escape").decode() for c in text
    )


def _job_name(name: str) -> str:
    """The spec name as a Slurm job name: sbatch reads #SBATCH lines itself, not a shell, so
    anything but letters, digits and "._-" becomes "_"."""
    return "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in name)


class _Skip(NamedTuple):
    """Why a configuration is skipped: what it has, and why the torchrun path cannot run it."""

    what: str
    why: str

    def __str__(self) -> str:
        return f"{self.what} ({self.why})"


def _grouped(reasons: dict[_Skip, int]) -> str:
    """How many configurations are skipped for each reason, one clause per distinct `why`:
    "2 have TP 2 and 2 have TP 4 (the runtime runs PP x DP ranks; ...)"."""
    by_why: dict[str, list[str]] = {}
    for skip, count in reasons.items():
        have = "has" if count == 1 else "have"
        by_why.setdefault(skip.why, []).append(f"{count} {have} {skip.what}")
    clauses = []
    for why, counts in by_why.items():
        joined = counts[0] if len(counts) == 1 else ", ".join(counts[:-1]) + " and " + counts[-1]
        clauses.append(f"{joined} ({why})")
    return "; ".join(clauses)


def node_count(num_ranks: int, gpus_per_node: int) -> int:
    """The fewest nodes of `gpus_per_node` GPUs that hold `num_ranks` ranks split evenly (the
    same number on each): 9 ranks on 8-GPU nodes take 3 nodes of 3, not 2 uneven ones."""
    fewest = math.ceil(num_ranks / gpus_per_node)
    return next(n for n in range(fewest, num_ranks + 1) if num_ranks % n == 0)


def _unrunnable(profile: Profile, comm: CommMode, transport_timeout_s: float) -> _Skip | None:
    """Why a configuration's plan cannot run as a step: its comm, or a delay its receiver
    would time out on (a step known to fail: the job's time is not spent on it)."""
    # (the paper's injected sleeps are the simulator's; a step runs the direct path)
    if comm not in (CommMode.DIRECT, CommMode.NCCL_SLEEP):
        return _Skip(f"{comm.value} comm", "the torchrun path has no delegate transport yet")
    longest_ms = longest_hold_ms(profile)
    try:
        check_hold(longest_ms, transport_timeout_s)
    except ConfigError:
        return _Skip(
            f"a delay of {longest_ms:g} ms",
            f"not shorter than the workers' {transport_timeout_s:g} s timeout for one "
            "message, the spec's transport_timeout_s: its step would fail",
        )
    return None


def _as_stepped(comm: str) -> str:
    """The comm mode a step runs for a plan's `comm`: the paper's injected sleeps
    (`nccl-sleep`) are the simulator's; a step runs them as direct sends (its workers' fault
    hook sleeping the delays), and its results say so."""
    return CommMode.DIRECT.value if comm == CommMode.NCCL_SLEEP.value else comm


def _unsupported(tp: int, has_faults: bool) -> _Skip | None:
    if tp > 1:
        return _Skip(
            f"TP {tp}", "the runtime runs PP x DP ranks; TP is modelled by the simulator only"
        )
    if has_faults:
        return _Skip(
            "a fault timeline",
            "the torchrun path runs fixed plans only; `adaptra-bench run` replays timelines",
        )
    return None
