"""What a rank swap's model state costs on the wire: `adaptra.transport.state_wire` (the
movers' own TCP connection, used where the pool has delegates) against gloo (the process
group, used otherwise), both over loopback.

Two movers trade states of SIZE bytes each way at once. The state wire: two threads of one
process, each a mover with two loopback addresses standing for its host's NICs, their offers
passed in memory (the pool passes them through its slot folder); timed from both starting
to both done, listeners and connections included. gloo: two processes in a group bound to
`lo`, each an `isend` of its state and an `irecv` of the other's, timed from a barrier to
both waits done. The states are made before the clock starts (random bytes: making 10 MiB
of them takes longer than moving them). Medians of --repeats: the state wire's trades
first, then gloo's.

Run: python benchmarks/bench_state_wire.py [--repeats 7] [--sizes-mib 1 10 64]
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import os
import statistics
import threading
import time
from multiprocessing.connection import Connection

import torch
import torch.distributed as dist

from adaptra.transport.state_wire import move_state
from pipeline.runtime.transport import StateOffer, StateRoute
from pipeline.signals import run_script

NICS = {0: ("127.0.0.11", "127.0.0.12"), 1: ("127.0.0.21", "127.0.0.22")}
"""Each mover's two NICs' loopback addresses."""
TIMEOUT_S = 60.0
TIMEOUT = datetime.timedelta(seconds=TIMEOUT_S)


def _states(size: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(size)
    return [torch.randint(0, 256, (size,), dtype=torch.uint8, generator=generator) for _ in "ab"]


def _routes() -> list[StateRoute]:
    """Both movers' routes: each offer goes to the other mover's `offer_of`."""
    offers: dict[int, StateOffer] = {}
    changed = threading.Condition()

    def route(rank: int) -> StateRoute:
        def offer(mine: StateOffer) -> None:
            with changed:
                offers[rank] = mine
                changed.notify_all()

        def offer_of(deadline: float) -> StateOffer:
            with changed:
                if not changed.wait_for(lambda: 1 - rank in offers, deadline - time.monotonic()):
                    raise TimeoutError(f"mover {1 - rank} made no offer")
                return offers[1 - rank]

        return StateRoute(1 - rank, 1 - rank, offer, offer_of)

    return [route(0), route(1)]


def state_wire_ms(states: list[torch.Tensor]) -> float:
    """One trade over the state wire, both movers' time."""
    taken = [torch.empty_like(state) for state in states]
    routes = _routes()
    errors: list[BaseException] = []
    start = threading.Barrier(3)

    def mover(rank: int) -> None:
        start.wait()
        try:
            move_state(
                states[rank], taken[rank], routes[rank], here=NICS[rank],
                taker_nics=NICS[1 - rank], ifnames=("", ""), timeout_s=TIMEOUT_S,
                user_timeout_ms=10_000,
            )  # fmt: skip
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=mover, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed_ms = (time.perf_counter() - began) * 1000.0
    if errors:
        raise errors[0]
    if not (torch.equal(taken[0], states[1]) and torch.equal(taken[1], states[0])):
        raise AssertionError("a state came over damaged")
    return elapsed_ms


def _gloo_mover(rank: int, port: int, sizes: list[int], repeats: int, out: Connection) -> None:
    """Rank `rank` of the gloo pair: for each size, `repeats` trades, each timed from a
    barrier; rank 0 sends back each size's times."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    store = dist.TCPStore("127.0.0.1", port, 2, False, timeout=TIMEOUT)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=TIMEOUT)
    try:
        times: dict[int, list[float]] = {}
        for size in sizes:
            states = _states(size)
            taken = torch.empty_like(states[rank])
            for _ in range(repeats):
                dist.barrier()
                began = time.perf_counter()
                sending = dist.isend(states[rank], 1 - rank)
                taking = dist.irecv(taken, 1 - rank)
                sending.wait()
                taking.wait()
                dist.barrier()  # both done
                times.setdefault(size, []).append((time.perf_counter() - began) * 1000.0)
                if not torch.equal(taken, states[1 - rank]):
                    raise AssertionError("a state came over damaged")
        if rank == 0:
            out.send(times)
    finally:
        dist.destroy_process_group()


def gloo_ms(sizes: list[int], repeats: int) -> dict[int, list[float]]:
    """Each size's trade times over gloo (two processes of their own, started once)."""
    store = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=TIMEOUT, wait_for_workers=False)
    context = multiprocessing.get_context("spawn")
    reader, writer = context.Pipe(duplex=False)
    movers = [
        context.Process(target=_gloo_mover, args=(rank, store.port, sizes, repeats, writer))
        for rank in (0, 1)
    ]
    for mover in movers:
        mover.start()
    try:
        deadline = time.monotonic() + TIMEOUT_S * len(sizes) * repeats
        while not reader.poll(0.5):  # a mover that died is named at once, not at the deadline
            failed = [m.exitcode for m in movers if m.exitcode not in (None, 0)]
            if failed or time.monotonic() > deadline:
                raise RuntimeError(f"the gloo movers did not finish (exit codes {failed})")
        times: dict[int, list[float]] = reader.recv()
    finally:
        for mover in movers:
            mover.join(TIMEOUT_S)
            if mover.is_alive():
                mover.kill()
                mover.join()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--sizes-mib", type=float, nargs="+", default=[1.0, 10.0, 64.0])
    args = parser.parse_args()
    if args.repeats < 1 or not all(mib > 0 for mib in args.sizes_mib):
        parser.error("--repeats must be >= 1 and every size > 0")
    sizes = [round(mib * (1 << 20)) for mib in args.sizes_mib]
    wire = {size: [state_wire_ms(_states(size)) for _ in range(args.repeats)] for size in sizes}
    gloo = gloo_ms(sizes, args.repeats)
    print(f"load average {os.getloadavg()[0]:.2f}, {args.repeats} repeats each")
    print("| MiB each way | state wire ms (median, min-max) | gloo ms (median, min-max) | ratio |")
    print("|---|---|---|---|")
    for size in sizes:
        w, g = statistics.median(wire[size]), statistics.median(gloo[size])
        print(
            f"| {size / (1 << 20):g} | {w:.1f} ({min(wire[size]):.1f}-{max(wire[size]):.1f}) "
            f"| {g:.1f} ({min(gloo[size]):.1f}-{max(gloo[size]):.1f}) | {w / g:.2f} |"
        )


if __name__ == "__main__":
    run_script(main)
