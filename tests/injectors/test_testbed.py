"""The namespace testbed, measured with real TCP traffic between its hosts (needs root)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from injectors.probe import measure as _measure
from injectors.testbed import Testbed, cleanup

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="network namespaces need root (CI runs as root)"
)


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


def test_a_delay_wire_delays_its_pair_only() -> None:
    with Testbed(3) as bed:
        bed.add_delay(0, 1, plane=0, delay_ms=20)
        rtt = _measure(bed, 0, 1, 0, "rtt")
        assert 36.0 <= rtt <= 44.0, rtt  # 2 x 20 ms one way, +-10 %
        assert _measure(bed, 0, 2, 0, "rtt") < 5.0
        assert _measure(bed, 0, 1, 1, "rtt") < 5.0
        wires = [process for process, _ in bed._wires]
    assert not any(process.is_alive() for process in wires)
