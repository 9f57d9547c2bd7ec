"""Measure a testbed pair with real TCP traffic: round trip or throughput (verifies injection)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from injectors.testbed import Testbed
from pipeline.signals import held_signals

__all__ = ["measure"]

_ISOLATED = (sys.executable, "-I", "-c")
"""The probes' Python: isolated, no module of the working directory or PYTHONPATH first."""

_SERVER = textwrap.dedent("""
    import socket, sys
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], 5000)); s.listen(); print("ready", flush=True)
    c, _ = s.accept()
    while True:
        data = c.recv(1 << 16)
        if not data:
            break
        if data == b"p":
            c.sendall(b"p")
""")
_CLIENT = textwrap.dedent("""
    import socket, sys, time
    s = socket.create_connection((sys.argv[1], 5000), timeout=float(sys.argv[3]))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if sys.argv[2] == "rtt":
        times = []
        for _ in range(20):
            t = time.perf_counter(); s.sendall(b"p"); s.recv(1)
            times.append(time.perf_counter() - t)
        print(sorted(times)[10] * 1000)
    else:
        payload = b"x" * (1 << 20); t = time.perf_counter()
        for _ in range(int(sys.argv[2])):
            s.sendall(payload)
        s.shutdown(socket.SHUT_WR); s.recv(1)
        print(int(sys.argv[2]) * 8 * (1 << 20) / (time.perf_counter() - t) / 1e6)
""")


def measure(
    bed: Testbed, src: int, dst: int, plane: int, what: str, timeout_s: float = 10
) -> float:
    """Median RTT in ms ("rtt") or throughput in Mbit/s (a count of MiB) from src to dst."""
    address = bed.address(dst, plane)
    server: subprocess.Popen[str] | None = None
    try:
        with held_signals():  # a server started is a server recorded (the end stops it)
            server = subprocess.Popen(
                [*bed.exec_prefix(dst), *_ISOLATED, _SERVER, address],
                stdout=subprocess.PIPE,
                text=True,
            )
        if server.stdout is None or server.stdout.readline().strip() != "ready":
            raise ConnectionError(f"the probe server on host {dst} did not start")
        out = subprocess.run(
            [*bed.exec_prefix(src), *_ISOLATED, _CLIENT, address, what, str(timeout_s)],
            capture_output=True,
            text=True,
            timeout=timeout_s + 30,
        )
        if out.returncode != 0:
            said = out.stderr.strip().splitlines() or [f"exited with {out.returncode}, silent"]
            raise ConnectionError(f"the probe client on host {src}: {said[-1]}")
        return float(out.stdout)
    finally:
        if server is not None:
            server.kill()
            server.wait()
