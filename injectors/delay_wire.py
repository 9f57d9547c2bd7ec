"""A userspace delay wire: per-packet delay on one host pair where the kernel has no netem.

A TAP device in each of the two hosts' namespaces and one process between them that forwards
every frame after a fixed delay, in each direction. Host routes (/32) send the pair's traffic
for that plane through the wire instead of the bridge; every other pair is untouched.
"""

from __future__ import annotations

import contextlib
import fcntl
import heapq
import os
import select
import struct
import time
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["run_wire"]

_TUNSETIFF = 0x400454CA
_IFF_TAP, _IFF_NO_PI = 0x0002, 0x1000
_MAX_FRAME = 65536


def _open_tap(namespace: str, ifname: str) -> int:
    from pyroute2 import netns

    netns.setns(namespace)
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", ifname.encode(), _IFF_TAP | _IFF_NO_PI))
    return fd


def run_wire(ns_a: str, ns_b: str, ifname: str, delay_ms: float, conn: Connection) -> None:
    """Process entry: open both taps, report ready, then forward frames until told to stop;
    ("delay", ms) changes the delay of frames read from then on (answered "ok")."""
    fds = (_open_tap(ns_a, ifname), _open_tap(ns_b, ifname))
    conn.send("ready")
    delay_s = delay_ms / 1000.0
    queue: list[tuple[float, int, int, bytes]] = []  # (due, seq, destination fd, frame)
    seq = 0
    while True:
        timeout = max(0.0, queue[0][0] - time.monotonic()) if queue else 0.5
        watched: list[Any] = [*fds, conn]
        readable, _, _ = select.select(watched, [], [], timeout)
        if conn in readable:
            try:
                word = conn.recv()
            except EOFError:
                return
            if not (isinstance(word, tuple) and word[0] == "delay"):
                return  # any other word (or EOF) from the testbed means stop
            delay_s = float(word[1]) / 1000.0  # frames already queued keep their due time
            conn.send("ok")
            continue
        now = time.monotonic()
        for fd in (f for f in fds if f in readable):
            frame = os.read(fd, _MAX_FRAME)
            seq += 1
            heapq.heappush(queue, (now + delay_s, seq, fds[1] if fd == fds[0] else fds[0], frame))
        while queue and queue[0][0] <= time.monotonic():
            _, _, destination, frame = heapq.heappop(queue)
            with contextlib.suppress(OSError):  # the other side is down: lost, as on a wire
                os.write(destination, frame)
