"""The worker process: joins the process group once, then runs iterations on command."""

from __future__ import annotations

import datetime as dt
import os
import time
from multiprocessing.connection import Connection

import torch
import torch.distributed as dist

from pipeline.ops import OpKind
from pipeline.profile import link_name
from pipeline.runtime.compute import ComputeBackend
from pipeline.runtime.config import IterationConfig, RankResult
from pipeline.runtime.hooks import FixedDelayHook
from pipeline.runtime.transport import (
    ACTIVATION,
    GRADIENT,
    DirectTransport,
    Message,
    PendingReceive,
)

__all__ = ["join", "worker_main"]


class _Worker:
    def __init__(
        self,
        rank: int,
        stage: int,
        replica: int,
        num_stages: int,
        compute: ComputeBackend,
        dp_group: dist.ProcessGroup | None,
        timeout_s: float,
    ) -> None:
        self.rank, self.stage, self.replica = rank, stage, replica
        self.compute = compute
        self.dp_group = dp_group
        self.timeout_s = timeout_s
        # Neighbours and the link to each: activations come from up, gradients from down.
        self.up = (rank - 1, link_name(stage - 1)) if stage > 0 else None
        self.down = (rank + 1, link_name(stage)) if stage < num_stages - 1 else None

    def run(self, config: IterationConfig, start_at: float) -> RankResult:
        profile, it = config.profile, config.iteration
        hook = config.fault_hook or FixedDelayHook(
            {link_name(i): d for i, d in enumerate(profile.delay_ms)}
        )
        transport = DirectTransport(hook)
        buffers: dict[tuple[int, int], torch.Tensor] = {}
        pending: dict[tuple[int, int], PendingReceive] = {}
        for msg_kind, neighbour in ((ACTIVATION, self.up), (GRADIENT, self.down)):
            if neighbour is None:
                continue
            for m in range(profile.num_microbatches):
                buffers[msg_kind, m] = self.compute.message_buffer(profile)
                pending[msg_kind, m] = transport.post_receive(
                    neighbour[0], Message(it, msg_kind, m, m), buffers[msg_kind, m]
                )
        ops: list[tuple[str, int, float, float]] = []
        sends: list[tuple[str, str, int, int, float, float]] = []
        receives: list[tuple[str, str, int, float | None]] = []
        num_sent = {ACTIVATION: 0, GRADIENT: 0}
        self.compute.begin_iteration(config)
        _sleep_until(start_at)
        for op in config.schedule.stages[self.stage]:
            kind, m = op.kind, op.microbatch
            backward = kind is OpKind.B or kind is OpKind.BW
            source = (ACTIVATION, self.up) if kind is OpKind.F else (GRADIENT, self.down)
            inputs = None
            if (kind is OpKind.F or backward) and source[1] is not None:
                try:
                    seen = pending.pop((source[0], m)).wait(self.timeout_s)
                except TimeoutError as err:
                    raise TimeoutError(f"op {op}: {err}") from err
                direction = "forward" if source[0] == ACTIVATION else "backward"
                receives.append((source[1][1], direction, m, seen))
                inputs = buffers[source[0], m]
            start = time.monotonic()
            output = self.compute.run(kind, m, inputs, profile)
            ops.append((kind.value, m, start, time.monotonic()))
            target = (ACTIVATION, self.down) if kind is OpKind.F else (GRADIENT, self.up)
            if output is None or not (kind is OpKind.F or backward) or target[1] is None:
                continue
            (peer, link), msg_kind = target[1], target[0]
            message = Message(it, msg_kind, m, num_sent[msg_kind])
            num_sent[msg_kind] += 1
            send_start = time.monotonic()
            transport.send(peer, link, message, output)
            direction = "forward" if msg_kind == ACTIVATION else "backward"
            sends.append(
                (
                    link,
                    direction,
                    m,
                    output.numel() * output.element_size(),
                    send_start,
                    time.monotonic(),
                )
            )
        step_start = time.monotonic()
        if self.dp_group is not None and config.allreduce_bytes > 0:
            grads = torch.ones(max(config.allreduce_bytes // 4, 1), device=self.compute.device)
            dist.all_reduce(grads, group=self.dp_group)
        step_output = self.compute.end_iteration(config)
        return RankResult(
            self.rank,
            self.stage,
            self.replica,
            os.getpid(),
            ops,
            sends,
            receives,
            step_start,
            time.monotonic(),
            transport.bytes_sent,
            step_output,
        )


def _sleep_until(deadline: float) -> None:
    remaining = deadline - time.monotonic()
    if remaining > 0:
        time.sleep(remaining)


def join(
    rank: int,
    num_stages: int,
    num_replicas: int,
    init_method: str,
    timeout_s: float,
    compute: ComputeBackend,
) -> _Worker:
    """Join the gloo process group and the DP groups; the worker for this rank."""
    stage, replica = rank % num_stages, rank // num_stages
    # NCCL where CUDA is present (untested: no GPU on the project's machines), gloo otherwise.
    device = torch.device("cpu")
    if torch.cuda.is_available():
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        init_method=init_method,
        rank=rank,
        world_size=num_stages * num_replicas,
        timeout=dt.timedelta(seconds=timeout_s),
    )
    dp_group = None
    for s in range(num_stages):  # every rank creates every group, in the same order
        group = dist.new_group([r * num_stages + s for r in range(num_replicas)])
        if s == stage and num_replicas > 1:
            dp_group = group
    compute.setup(stage, num_stages, replica, device)
    return _Worker(rank, stage, replica, num_stages, compute, dp_group, timeout_s)


def worker_main(
    rank: int,
    num_stages: int,
    num_replicas: int,
    init_file: str,
    conn: Connection,
    timeout_s: float,
    compute: ComputeBackend,
) -> None:
    """Process entry point; reports ready, then answers one command per iteration."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    stage = rank % num_stages
    try:
        worker = join(rank, num_stages, num_replicas, f"file://{init_file}", timeout_s, compute)
    except Exception as err:
        conn.send(("error", f"rank {rank} (stage {stage}) could not start: {err}"))
        return
    conn.send(("ok", os.getpid()))
    while True:
        try:
            command = conn.recv()
        except EOFError:  # the controller is gone
            return
        if command is None:
            break
        config, start_at = command
        try:
            conn.send(("ok", worker.run(config, start_at)))
        except Exception as err:
            conn.send(
                ("error", f"rank {rank} (stage {stage}), iteration {config.iteration}: {err}")
            )
            return
    dist.destroy_process_group()
