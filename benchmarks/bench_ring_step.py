"""What one step of a two-process DP ring costs over gloo on this host, bare and with a
receiver thread per bucket as the runtime's ring has (pipeline.runtime.dp_ring), against the
runtime's own ring step (BENCHMARKS.md, Fig. 18).

Two processes, chunks of 62.5 kB; each step both send their chunk and wait for the other's.
Printed per process: the cost of posting one `irecv` (us), a bare step (receives posted two
ahead, waited on by the main thread; us), a step whose receives a thread per bucket of two
waits on, handing each over through an event (us), and one whose receives one thread for
the whole ring waits on, fed each bucket's as they are posted (us). Medians of `--repeats`
runs of 200 steps.

Run: python benchmarks/bench_ring_step.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import statistics
import tempfile
import threading
import time
from multiprocessing.queues import Queue

import torch
import torch.distributed as dist

from pipeline.signals import run_script

CHUNK_BYTES, NUM_STEPS = 62_500, 200


def _chunk() -> torch.Tensor:
    return torch.empty(CHUNK_BYTES, dtype=torch.uint8)


def _bare(peer: int, out: torch.Tensor) -> float:
    start = time.perf_counter()
    pending = [dist.irecv(_chunk(), src=peer, tag=1000 + i) for i in range(2)]
    for i in range(NUM_STEPS):
        if i + 2 < NUM_STEPS:
            pending.append(dist.irecv(_chunk(), src=peer, tag=1000 + i + 2))
        dist.send(out, dst=peer, tag=1000 + i)
        pending[i].wait()
    return (time.perf_counter() - start) / NUM_STEPS * 1e6


def _bucket(peer: int, bucket: int) -> tuple[threading.Thread, list[threading.Event]]:
    works = [dist.irecv(_chunk(), src=peer, tag=5000 + 2 * bucket + k) for k in range(2)]
    events = [threading.Event() for _ in works]

    def run() -> None:
        for work, event in zip(works, events, strict=True):
            work.wait()
            event.set()

    return threading.Thread(target=run, daemon=True), events


def _threaded(peer: int, out: torch.Tensor) -> float:
    start = time.perf_counter()
    num_buckets = NUM_STEPS // 2
    upcoming = _bucket(peer, 0)
    for bucket in range(num_buckets):
        thread, events = upcoming
        if bucket + 1 < num_buckets:
            upcoming = _bucket(peer, bucket + 1)  # a bucket ahead, as the runtime's ring
        thread.start()
        for k, event in enumerate(events):
            dist.send(out, dst=peer, tag=5000 + 2 * bucket + k)
            event.wait()
        thread.join()
    return (time.perf_counter() - start) / NUM_STEPS * 1e6


def _one_thread(peer: int, out: torch.Tensor) -> float:
    """One receiver thread for the whole ring, fed each bucket's receives as they are
    posted (a bucket ahead), waiting on them in order."""
    feed: queue.SimpleQueue = queue.SimpleQueue()

    def run() -> None:
        while (item := feed.get()) is not None:
            work, event = item
            work.wait()
            event.set()

    def post(bucket: int) -> list[threading.Event]:
        events = []
        for k in range(2):
            event = threading.Event()
            feed.put((dist.irecv(_chunk(), src=peer, tag=7000 + 2 * bucket + k), event))
            events.append(event)
        return events

    start = time.perf_counter()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    num_buckets = NUM_STEPS // 2
    upcoming = post(0)
    for bucket in range(num_buckets):
        events = upcoming
        if bucket + 1 < num_buckets:
            upcoming = post(bucket + 1)
        for k, event in enumerate(events):
            dist.send(out, dst=peer, tag=7000 + 2 * bucket + k)
            event.wait()
    feed.put(None)
    thread.join()
    return (time.perf_counter() - start) / NUM_STEPS * 1e6


def _worker(rank: int, init_file: str, repeats: int, results: Queue) -> None:
    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    peer, out = 1 - rank, torch.zeros(CHUNK_BYTES, dtype=torch.uint8)
    posts, bare, threaded, one = [], [], [], []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        works = [dist.irecv(_chunk(), src=peer, tag=100 + i) for i in range(NUM_STEPS)]
        posts.append((time.perf_counter() - start) / NUM_STEPS * 1e6)
        for i in range(NUM_STEPS):
            dist.send(out, dst=peer, tag=100 + i)
        for work in works:
            work.wait()
        dist.barrier()
        bare.append(_bare(peer, out))
        dist.barrier()
        threaded.append(_threaded(peer, out))
        dist.barrier()
        one.append(_one_thread(peer, out))
    results.put((rank, *(statistics.median(v) for v in (posts, bare, threaded, one))))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        results: Queue = mp.Queue()
        init_file = os.path.join(folder, "init")
        workers = [
            mp.Process(target=_worker, args=(rank, init_file, args.repeats, results))
            for rank in (0, 1)
        ]
        for worker in workers:
            worker.start()
        rows = sorted(results.get() for _ in workers)
        for worker in workers:
            worker.join()
    print("| process | irecv post us | bare step us | step, a receiver thread per bucket us "
          "| step, one receiver thread us |")  # fmt: skip
    print("|---|---|---|---|---|")
    for rank, post, bare, threaded, one in rows:
        print(f"| {rank} | {post:.0f} | {bare:.0f} | {threaded:.0f} | {one:.0f} |")


if __name__ == "__main__":
    run_script(main)
