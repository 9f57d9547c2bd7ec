"""A network namespace of a test's own for the delegates' NIC tests: one host, two NICs; and
trainers' delegate transports on one host."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import queue
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import torch

from adaptra.transport import Delegates
from adaptra.transport.delegated import DelegateTransport
from pipeline.runtime.transport import (
    ACTIVATION,
    DelegateOffer,
    DelegateSetup,
    LinkDirection,
    Message,
    WireRecord,
)

T = TypeVar("T")


def ip_batch(namespace: str, commands: list[str]) -> None:
    """Run `ip` commands in `namespace`, in one process."""
    script = "".join(f"{command}\n" for command in commands)
    subprocess.run(["ip", "-n", namespace, "-batch", "-"], input=script, text=True, check=True)


@contextlib.contextmanager
def one_host_namespace() -> Iterator[str]:
    """A network namespace of the test's own, one host with two NICs, `nic0` (10.77.0.1) and
    `nic1` (10.77.1.1), and a third link, `flap`, nobody's NIC: each a veth whose peer is up
    in the namespace too (a link netlink sees go down and up; the addresses stay local)."""
    name = f"adt-delegate-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        commands = ["link set lo up"]
        for link in ("nic0", "nic1", "flap"):
            commands += [f"link add {link} type veth peer name {link}p", f"link set {link}p up"]
            commands.append(f"link set {link} up")
        commands += ["addr add 10.77.0.1/32 dev nic0", "addr add 10.77.1.1/32 dev nic1"]
        ip_batch(name, commands)
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=True)


@contextlib.contextmanager
def entered(namespace: str) -> Iterator[None]:
    """This thread in `namespace` (the processes it starts start there), then back."""
    from pyroute2 import netns

    netns.pushns(namespace)
    try:
        yield
    finally:
        netns.popns()


Wiring = tuple[tuple[tuple[LinkDirection, int], ...], tuple[tuple[LinkDirection, int], ...]]
"""A trainer's inbound and outbound link directions, each with its peer (`DelegateSetup`)."""

D0 = LinkDirection("0-1", "forward")
"""The link direction of `A_TO_B` and `B_TO_A`."""
A_TO_B: list[Wiring] = [((), ((D0, 1),)), (((D0, 0),), ())]
"""Two trainers: A (rank 0) sends `D0` to B (rank 1)."""
B_TO_A: list[Wiring] = [(((D0, 1),), ()), ((), ((D0, 0),))]
"""The two after a rank swap: B sends `D0` to A."""


class Trainers:
    """Trainers 0..N-1 (`wirings[rank]`), their delegate transports on one host (the
    calling thread's namespace), each wired, and rewired, on a thread of its own, all at
    once, as workers are; closed with `stack`."""

    def __init__(
        self,
        stack: contextlib.ExitStack,
        delegates: Delegates,
        num_delegates: int,
        wirings: list[Wiring],
        namespace: str | None = None,
    ) -> None:
        self.namespace, self.num_delegates = namespace, num_delegates
        self.replicas: dict[int, int] = {}
        """The replica each rank's next wiring plays (0 unless set)."""
        self._lock = threading.Lock()
        self._ports: dict[LinkDirection, queue.Queue[DelegateOffer]] = {}
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.folder = stack.enter_context(tempfile.TemporaryDirectory(dir=shm))
        self._threads = stack.enter_context(ThreadPoolExecutor(len(wirings)))
        self.transports: list[DelegateTransport] = []
        stack.callback(lambda: [transport.close() for transport in self.transports])
        wired = self._on_each(
            wirings, lambda rank, wiring: delegates.connect(self._setup(rank, wiring))
        )
        self.transports += [f.result() for f in wired if f.exception() is None]  # to close
        for future in wired:
            future.result()  # the first failure, if one failed

    def rewire(self, wirings: list[Wiring]) -> None:
        """A rank swap: every trainer rewired to `wirings[rank]` at once."""
        for future in self._on_each(
            wirings, lambda rank, wiring: self.transports[rank].rewire(self._setup(rank, wiring))
        ):
            future.result()

    def rewire_one(
        self, rank: int, wiring: Wiring, after: threading.Event | None = None
    ) -> Future[None]:
        """Rank `rank`'s side of a rank swap, on its thread, once `after` is set if given (30 s
        at most: a hang guard); the other ranks' sides are the caller's."""

        def rewire(rank: int, wiring: Wiring) -> None:
            if after is not None:
                after.wait(30.0)
            self.transports[rank].rewire(self._setup(rank, wiring))

        return self._on(rank, wiring, rewire)

    def _on_each(self, wirings: list[Wiring], call: Callable[[int, Wiring], T]) -> list[Future[T]]:
        """`call(rank, wirings[rank])` for every rank, each on its thread, all done."""
        futures = [self._on(rank, wiring, call) for rank, wiring in enumerate(wirings)]
        concurrent.futures.wait(futures)
        return futures

    def _on(self, rank: int, wiring: Wiring, call: Callable[[int, Wiring], T]) -> Future[T]:
        """`call(rank, wiring)` on a thread of its own, in the namespace if there is one."""

        def there() -> T:
            with contextlib.ExitStack() as stack:
                if self.namespace is not None:
                    stack.enter_context(entered(self.namespace))
                return call(rank, wiring)

        return self._threads.submit(there)

    def _queue(self, direction: LinkDirection) -> queue.Queue[DelegateOffer]:
        with self._lock:
            return self._ports.setdefault(direction, queue.Queue())

    def _exchange(
        self, mine: dict[LinkDirection, DelegateOffer], wanted: tuple[LinkDirection, ...]
    ) -> dict[LinkDirection, DelegateOffer]:
        for direction, ports in mine.items():  # to the direction's sender, on its thread
            self._queue(direction).put(ports)
        return {d: self._queue(d).get(timeout=30.0) for d in wanted}

    def _setup(self, rank: int, wiring: Wiring) -> DelegateSetup:
        inbound, outbound = wiring
        return DelegateSetup(
            rank, self.folder, inbound, outbound, self.num_delegates, 30.0, self._exchange,
            replica=self.replicas.get(rank, 0),
        )  # fmt: skip


def carry(
    sender: DelegateTransport,
    receiver: DelegateTransport,
    iteration: int,
    values: list[float],
    direction: LinkDirection = D0,
) -> list[WireRecord]:
    """One iteration of `direction`, a message of 16 floats per value (each filled with it):
    every message taken in whole, the sender's wire records."""
    for transport in (sender, receiver):
        transport.begin_iteration({direction: (len(values), 64)})
    buffers = [torch.zeros(16) for _ in values]
    messages = [Message(iteration, ACTIVATION, k, k) for k in range(len(values))]
    pending = [
        receiver.post_receive(direction, m, b) for m, b in zip(messages, buffers, strict=True)
    ]
    for message, value in zip(messages, values, strict=True):
        sender.send(direction, message, torch.full((16,), value), fault_ms=0.0)
    for receive in pending:
        receive.wait(30.0)
    records = sender.finish_iteration(iteration)
    assert receiver.finish_iteration(iteration) == []
    assert [b.tolist() for b in buffers] == [[value] * 16 for value in values]
    return records
