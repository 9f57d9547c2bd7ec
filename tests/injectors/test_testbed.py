"""The namespace testbed, measured with real TCP traffic between its hosts (needs root)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from injectors.testbed import Testbed, cleanup

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="network namespaces need root (CI runs as root)"
)

SERVER = textwrap.dedent("""
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
CLIENT = textwrap.dedent("""
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


def _measure(
    bed: Testbed, src: int, dst: int, plane: int, what: str, timeout_s: float = 10
) -> float:
    """Median RTT in ms ("rtt") or throughput in Mbit/s (a count of MiB) from src to dst."""
    address = bed.address(dst, plane)
    server = subprocess.Popen(
        [*bed.exec_prefix(dst), sys.executable, "-c", SERVER, address],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        out = subprocess.run(
            [*bed.exec_prefix(src), sys.executable, "-c", CLIENT, address, what, str(timeout_s)],
            capture_output=True,
            text=True,
            timeout=timeout_s + 30,
        )
        if out.returncode != 0:
            raise ConnectionError(out.stderr.strip().splitlines()[-1])
        return float(out.stdout)
    finally:
        server.kill()
        server.wait()


def test_build_addresses_and_teardown() -> None:
    with Testbed(3) as bed:
        names = set(bed.hosts) | {bed.switch}
        present = set(
            subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        )
        assert names <= present
        assert _measure(bed, 0, 2, plane=1, what="rtt") < 5.0
    present = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(name in present for name in names)


def test_two_testbeds_coexist() -> None:
    with Testbed(2) as first, Testbed(2) as second:
        assert first.name != second.name
        assert _measure(first, 0, 1, 0, "rtt") < 5.0
        assert _measure(second, 0, 1, 0, "rtt") < 5.0


def test_bandwidth_cap_hits_only_its_pair() -> None:
    with Testbed(3) as bed:
        bed.cap_bandwidth(0, 1, plane=0, rate_mbit=100)
        capped = _measure(bed, 0, 1, 0, "8")
        other = _measure(bed, 0, 2, 0, "8")
        other_plane = _measure(bed, 0, 1, 1, "8")
    assert 90 <= capped <= 100, capped
    assert other > 300 and other_plane > 300, (other, other_plane)


def test_a_downed_nic_fails_its_plane_only() -> None:
    with Testbed(2) as bed:
        bed.set_link(1, plane=0, up=False)
        start = time.monotonic()
        with pytest.raises((ConnectionError, AssertionError, subprocess.TimeoutExpired)):
            _measure(bed, 0, 1, 0, "rtt", timeout_s=2)
        assert time.monotonic() - start < 20
        assert _measure(bed, 0, 1, 1, "rtt") < 5.0
        bed.set_link(1, plane=0, up=True)
        deadline = time.monotonic() + 10  # the failed neighbour entry is re-probed
        while True:
            try:
                assert _measure(bed, 0, 1, 0, "rtt") < 5.0
                break
            except ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


def test_teardown_after_an_exception() -> None:
    with pytest.raises(RuntimeError, match="midway"), Testbed(2) as bed:
        names = [bed.switch, *bed.hosts]
        raise RuntimeError("midway")
    present = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(name in present for name in names)


def test_teardown_after_sigterm() -> None:
    script = textwrap.dedent("""
        import time
        from injectors.testbed import Testbed
        with Testbed(2) as bed:
            print(bed.name, flush=True)
            time.sleep(60)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    name = child.stdout.readline().strip()
    assert name.startswith("adb-")
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=30) == 128 + signal.SIGTERM
    present = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert name not in present


def test_cleanup_removes_leftovers_of_a_killed_process() -> None:
    script = textwrap.dedent("""
        import time
        from injectors.testbed import Testbed
        bed = Testbed(2, prefix="adb-leak-")
        bed.build()
        print(bed.name, flush=True)
        time.sleep(60)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    name = child.stdout.readline().strip()
    child.kill()
    child.wait()
    removed = cleanup(prefix="adb-leak-")
    assert {f"{name}-sw", f"{name}-h0", f"{name}-h1"} <= set(removed)
    present = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert name not in present
