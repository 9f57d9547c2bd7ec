"""Multi-node launch: torchrun starts one worker per rank on every node; each runs the same
iterations on its own, and rank 0 gathers the records into a timeline.

`pipeline.torchrun_launch` writes the command line for each node; torchrun runs this
module:
`python -m torch.distributed.run ... -m pipeline.runtime.torchrun --profile P --schedule S`.
Hosts' clocks are not shared: rank 0 puts every rank's records on one clock per iteration,
each host's ranks counting from the first of them to leave the barrier that opens the
iteration (one host's ranks share its monotonic clock, so on one host this is exact; between
hosts the barrier's skew remains), and the iteration starting where the one before ended.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path

import torch.distributed as dist

from pipeline.checks import MAX_SEED
from pipeline.files import write_atomic
from pipeline.profile import Profile
from pipeline.runtime.compute import ComputeBackend, EmulatedCompute
from pipeline.runtime.config import IterationConfig, RankResult, replicas_loss
from pipeline.runtime.digest import params_sha256, whole_model_params
from pipeline.runtime.pool import assemble_timeline
from pipeline.runtime.worker import configure_threads, join
from pipeline.schedule import Schedule, validate_schedule
from pipeline.timeline import Timeline
from pipeline.torchrun_launch import (
    DIGEST_FILE,
    LAUNCH_ID,
    LAUNCH_ID_FILE,
    LOSSES_FILE,
    TIMELINE_FILE,
)

__all__ = [
    "compute_backend",
    "host_placement",
    "main",
    "on_one_clock",
    "parse_worker_args",
]


def _shift(result: RankResult, delta: float) -> RankResult:
    """The same records with every time moved by `delta` seconds."""
    moved = result.moved
    if moved is not None:
        moved = dataclasses.replace(moved, start_s=moved.start_s + delta, end_s=moved.end_s + delta)
    return dataclasses.replace(
        result,
        ops=[(k, m, a + delta, b + delta) for k, m, a, b in result.ops],
        sends=[
            (li, d, m, n, a + delta, b + delta, f, w + delta, pid)
            for li, d, m, n, a, b, f, w, pid in result.sends
        ],
        receives=[(li, d, m, a + delta, n + delta, c) for li, d, m, a, n, c in result.receives],
        step_start=result.step_start + delta,
        step_end=result.step_end + delta,
        failovers=[
            f._replace(noticed_s=f.noticed_s + delta, resumed_s=f.resumed_s + delta)
            for f in result.failovers
        ],
        moved=moved,
    )


def on_one_clock(stamped: list[tuple[int, float, RankResult]], start_s: float) -> list[RankResult]:
    """Every rank's records of one iteration on one clock, the iteration starting at
    `start_s`. `stamped`: per rank, its host's index (torchrun's node rank), when it left the
    barrier that opens the iteration, and its records, both on its host's monotonic clock.
    Each host's ranks count from the first of them to leave the barrier."""
    first: dict[int, float] = {}
    for node, left_s, _ in stamped:
        first[node] = min(left_s, first.get(node, left_s))
    return [_shift(result, start_s - first[node]) for node, _, result in stamped]


def host_placement(environ: Mapping[str, str]) -> tuple[int, int]:
    """This worker's index among its host's workers and their number, as torchrun sets them:
    the devices are chosen per host (a GPU of its own on a host of 8 GPUs, also in a job of
    16 workers over two hosts)."""
    return int(environ["LOCAL_RANK"]), int(environ["LOCAL_WORLD_SIZE"])


def parse_worker_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The worker's command line (torchrun passes each worker the same)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profile", type=Path, required=True)
    parser.add_argument("--schedule", type=Path, required=True)
    parser.add_argument("--iterations", type=int, default=3, help="Measured iterations.")
    parser.add_argument(
        "--warmup-iterations",
        type=int,
        default=0,
        help="Iterations run first and left out of the timeline (their losses are kept).",
    )
    parser.add_argument(
        "--compute", choices=["emulated", "megatron"], default="emulated", help="What ops run."
    )
    parser.add_argument("--model", default="tiny", help="The megatron GPT configuration.")
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="The megatron model's initial weights and synthetic tokens (a spec's seed; the "
        "emulated compute has neither).",
    )
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--launch-id",
        help="The cluster job's launch (`launch --spec`): written to the --out folder first, "
        "so that `collect` takes its results for that launch's only.",
    )
    args = parser.parse_args(argv)
    if args.launch_id is not None and not LAUNCH_ID.fullmatch(args.launch_id):
        parser.error(f"--launch-id must be 32 hex digits, got {args.launch_id!r}")
    if args.iterations < 1 or args.warmup_iterations < 0:
        parser.error("--iterations must be >= 1 and --warmup-iterations >= 0")
    if not 0 <= args.seed <= MAX_SEED:
        parser.error(f"--seed must be in 0..{MAX_SEED}, got {args.seed}")
    return args


def compute_backend(args: argparse.Namespace) -> ComputeBackend:
    """What the worker's ops run, from its command line."""
    if args.compute == "megatron":
        from pipeline.runtime.megatron import MegatronCompute

        return MegatronCompute(args.model, seed=args.seed)
    return EmulatedCompute()


def main(argv: list[str] | None = None) -> None:
    args = parse_worker_args(argv)
    profile = Profile.from_file(args.profile)
    schedule = Schedule.from_dict(json.loads(args.schedule.read_text()))
    validate_schedule(schedule, profile.num_stages, profile.num_microbatches)
    configure_threads()
    rank = int(os.environ["RANK"])
    compute = compute_backend(args)
    worker = join(
        rank, profile.num_stages, profile.num_replicas, "env://", args.timeout, compute,
        on_host=host_placement(os.environ),
    )  # fmt: skip
    node = int(os.environ["GROUP_RANK"])  # torchrun's node rank: the ranks of one host
    parts, losses, offset = [], [], 0.0
    num_total = args.warmup_iterations + args.iterations
    for iteration in range(num_total):
        last = iteration == num_total - 1
        config = IterationConfig(iteration, schedule, profile, collect_params=last)
        prepared = worker.prepare(config)  # its set-up is not the iteration's time
        dist.barrier()
        start_at = time.monotonic()
        result = worker.start(prepared, start_at)
        gathered: list[tuple[int, float, RankResult] | None] = [None] * dist.get_world_size()
        dist.gather_object((node, start_at, result), gathered if rank == 0 else None)
        if rank == 0:
            results = on_one_clock([g for g in gathered if g is not None], offset)
            measured = iteration - args.warmup_iterations  # < 0: a warm-up, only moves the clock
            part = assemble_timeline(profile.num_stages, measured, 0.0, offset, results)
            offset = part.iterations[0].end_ms / 1000.0
            loss = replicas_loss(results)
            if measured >= 0:  # as `run` reports them: the measured iterations' alone
                parts.append(part)
                losses += [] if loss is None else [loss]
    if rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        if args.launch_id is not None:  # whose results these are: written before them
            write_atomic(args.out / LAUNCH_ID_FILE, args.launch_id + "\n")
        if losses:  # a training backend: one loss per measured iteration, the model's digest
            write_atomic(args.out / LOSSES_FILE, json.dumps(losses))
            digest = params_sha256(whole_model_params(results))
            write_atomic(args.out / DIGEST_FILE, digest + "\n")
        # last: a timeline says the step's results are all there (`adaptra-bench collect`)
        write_atomic(args.out / TIMELINE_FILE, json.dumps(Timeline.concat(parts).to_dict()))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
