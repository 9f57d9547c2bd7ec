"""A network namespace of a test's own for the delegates' NIC tests: one host, two NICs; and
two trainers' delegate transports on it."""

from __future__ import annotations

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


D0 = LinkDirection("0-1", "forward")
"""The link direction the two trainers of `TwoTrainers` share."""


class TwoTrainers:
    """Trainer A (rank 0) sending `D0` to trainer B (rank 1), both on the host of
    `namespace`: their delegate transports, wired at once as two workers' are (B's on a
    thread of its own, in the namespace too: its delegates start there); closed with
    `stack`."""

    def __init__(
        self, stack: contextlib.ExitStack, namespace: str, delegates: Delegates, num_delegates: int
    ) -> None:
        self.namespace, self.num_delegates = namespace, num_delegates
        self._ports: queue.Queue[dict[LinkDirection, list[int]]] = queue.Queue()
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.folder = stack.enter_context(tempfile.TemporaryDirectory(dir=shm))
        self._other = stack.enter_context(ThreadPoolExecutor(1))
        wiring = self.on_b(lambda: delegates.connect(self.setup(1, ((D0, 0),), ())))
        self.a = delegates.connect(self.setup(0, (), ((D0, 1),)))
        stack.callback(self.a.close)
        self.b = wiring.result()
        stack.callback(self.b.close)

    def _exchange(
        self, mine: dict[LinkDirection, list[int]], wanted: tuple[LinkDirection, ...]
    ) -> dict[LinkDirection, list[int]]:
        if mine:  # the receiving side's ports, to the sending side's wiring
            self._ports.put(mine)
        return self._ports.get(timeout=30.0) if wanted else {}

    def setup(self, rank: int, inbound: tuple, outbound: tuple) -> DelegateSetup:  # type: ignore[type-arg]
        return DelegateSetup(
            rank, self.folder, inbound, outbound, self.num_delegates, 30.0, self._exchange
        )

    def on_b(self, call: Callable[[], T]) -> Future[T]:
        """`call` on B's thread, in the namespace."""

        def there() -> T:
            with entered(self.namespace):
                return call()

        return self._other.submit(there)

    def swap_b(self, after: threading.Event | None = None) -> Future[None]:
        """B's side of a rank swap after which B sends `D0` to A (on B's thread), once
        `after` is set if given (30 s at most: a hang guard)."""

        def swap() -> None:
            if after is not None:
                after.wait(30.0)
            self.b.rewire(self.setup(1, (), ((D0, 0),)))

        return self.on_b(swap)

    def swap_a(self) -> None:
        """A's side of it: A receives `D0` from B."""
        self.a.rewire(self.setup(0, ((D0, 1),), ()))


def carry(
    sender: DelegateTransport, receiver: DelegateTransport, iteration: int, values: list[float]
) -> list[WireRecord]:
    """One iteration of `D0`, a message of 16 floats per value (each filled with it): every
    message taken in whole, the sender's wire records."""
    for transport in (sender, receiver):
        transport.begin_iteration({D0: (len(values), 64)})
    buffers = [torch.zeros(16) for _ in values]
    messages = [Message(iteration, ACTIVATION, k, k) for k in range(len(values))]
    pending = [receiver.post_receive(D0, m, b) for m, b in zip(messages, buffers, strict=True)]
    for message, value in zip(messages, values, strict=True):
        sender.send(D0, message, torch.full((16,), value), fault_ms=0.0)
    for receive in pending:
        receive.wait(30.0)
    records = sender.finish_iteration(iteration)
    assert receiver.finish_iteration(iteration) == []
    assert [b.tolist() for b in buffers] == [[value] * 16 for value in values]
    return records
