"""The namespace testbed, measured with real TCP traffic between its hosts (needs root)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from injectors.ownership import OWNER_DIR, cleanup
from injectors.probe import measure as _measure
from injectors.testbed import Testbed, TestbedError
from injectors.wire import HEALTHY, WireState

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="network namespaces need root (CI runs as root)"
)

FREE_RTT_MS = 20.0
"""A round trip with no injected delay: about 0.06 ms quiet; load adds, but not this much."""


def test_build_addresses_and_teardown() -> None:
    with Testbed(3) as bed:
        names = set(bed.hosts) | {bed.switch}
        present = set(
            subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        )
        assert names <= present
        assert _measure(bed, 0, 2, plane=1, what="rtt") < FREE_RTT_MS
    present = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(name in present for name in names)


def _routes(bed: Testbed, host: int) -> str:
    return subprocess.run(
        ["ip", "-n", bed.hosts[host], "route"], capture_output=True, text=True, check=True
    ).stdout


def test_hosts_run_reno_with_wide_initial_windows_on_every_route_also_after_a_repair() -> None:
    with open("/proc/sys/net/ipv4/tcp_congestion_control") as file:
        root_congestion = file.read()
    with Testbed(2, netem=False) as bed:
        congestion = subprocess.run(
            [*bed.exec_prefix(1), "cat", "/proc/sys/net/ipv4/tcp_congestion_control"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert congestion.strip() == "reno"
        bed.set_wire(0, 1, plane=0, forward=WireState(delay_ms=1.0))
        bed.set_link(0, plane=0, up=False)
        bed.set_link(0, plane=0, up=True)
        routes = _routes(bed, 0).splitlines()
        assert len(routes) == 4  # three subnets and the wire's host route
        assert all("initcwnd 128 initrwnd 128" in route for route in routes)
        with open("/proc/sys/net/ipv4/tcp_congestion_control") as file:
            assert file.read() == root_congestion  # the root namespace's own: untouched


def test_two_testbeds_coexist() -> None:
    with Testbed(2) as first, Testbed(2) as second:
        assert first.name != second.name
        assert _measure(first, 0, 1, 0, "rtt") < FREE_RTT_MS
        assert _measure(second, 0, 1, 0, "rtt") < FREE_RTT_MS


def test_bandwidth_cap_hits_only_its_pair() -> None:
    """Load only slows traffic: the capped pair stays under its cap (plus rounding), and an
    uncapped pair is still more than twice as fast (the accuracy: bench_injectors.py)."""
    with Testbed(3) as bed:
        bed.cap_bandwidth(0, 1, plane=0, rate_mbit=100)
        capped = _measure(bed, 0, 1, 0, "8")
        other = _measure(bed, 0, 2, 0, "8")
        other_plane = _measure(bed, 0, 1, 1, "8")
    assert capped <= 105, capped
    assert other > 2 * capped and other_plane > 2 * capped, (capped, other, other_plane)


@pytest.mark.parametrize("rate_mbit", [12.5, 100.0, 0.75, 400e3])
def test_a_bandwidth_cap_of_any_float_rate_is_set_exactly(rate_mbit: float) -> None:
    from pyroute2 import IPRoute

    with Testbed(2) as bed:
        bed.cap_bandwidth(0, 1, plane=0, rate_mbit=rate_mbit)
        with IPRoute(netns=bed.hosts[0]) as ipr:
            (htb,) = ipr.get_classes(index=ipr.link_lookup(ifname="rnic0")[0])
    options = htb.get_attr("TCA_OPTIONS")
    rate_bytes_s = options.get_attr("TCA_HTB_RATE64") or options.get_attr("TCA_HTB_PARMS")["rate"]
    assert rate_bytes_s == round(rate_mbit * 1e6 / 8)


@pytest.mark.parametrize("rate_mbit", [0.0, -5.0, float("nan"), float("inf")])
def test_a_bad_bandwidth_cap_is_refused(rate_mbit: float) -> None:
    with Testbed(2) as bed, pytest.raises(TestbedError, match="finite rate > 0 Mbit/s"):
        bed.cap_bandwidth(0, 1, plane=0, rate_mbit=rate_mbit)


def test_a_downed_nic_fails_its_plane_only() -> None:
    with Testbed(2) as bed:
        bed.set_link(1, plane=0, up=False)
        start = time.monotonic()
        with pytest.raises((ConnectionError, AssertionError, subprocess.TimeoutExpired)):
            _measure(bed, 0, 1, 0, "rtt", timeout_s=2)
        assert time.monotonic() - start < 20
        assert _measure(bed, 0, 1, 1, "rtt") < FREE_RTT_MS
        bed.set_link(1, plane=0, up=True)
        deadline = time.monotonic() + 10  # the failed neighbour entry is re-probed
        while True:
            try:
                assert _measure(bed, 0, 1, 0, "rtt") < FREE_RTT_MS
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


_HOLD_A_TESTBED = textwrap.dedent("""
    import sys, time
    from injectors.testbed import Testbed
    with Testbed(2, prefix=sys.argv[1]) as bed:
        print(bed.name, flush=True)
        time.sleep(120)
""")


def _namespaces() -> set[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in listed.splitlines() if line.strip()}


def test_cleanup_removes_a_killed_runs_namespaces_and_leaves_a_live_ones() -> None:
    """Beside a live testbed, cleanup removes only the killed one's namespaces (the live run's
    switch survives: it still carries traffic), and says why it left the others."""
    from pyroute2 import netns

    prefix = f"adb-own{os.getpid() % 1000}-"
    live = subprocess.Popen(
        [sys.executable, "-c", _HOLD_A_TESTBED, prefix], stdout=subprocess.PIPE, text=True
    )
    killed = subprocess.Popen(
        [sys.executable, "-c", _HOLD_A_TESTBED, prefix], stdout=subprocess.PIPE, text=True
    )
    stray = f"{prefix}stray"
    try:
        assert live.stdout is not None and killed.stdout is not None
        live_name, killed_name = live.stdout.readline().strip(), killed.stdout.readline().strip()
        killed.kill()
        killed.wait()
        netns.create(stray)  # not a testbed's: nobody recorded owning it
        report = cleanup(prefix=prefix)
        live_namespaces = {f"{live_name}{suffix}" for suffix in ("-sw", "-h0", "-h1")}
        assert set(report.removed) == {f"{killed_name}{suffix}" for suffix in ("-sw", "-h0", "-h1")}
        assert report.failed == ()
        left = dict(report.left)
        assert set(left) == live_namespaces | {stray}
        assert all(f"process {live.pid} still runs" in left[n] for n in live_namespaces)
        assert "no owner record" in left[stray]
        present = _namespaces()
        assert live_namespaces <= present and not any(killed_name in n for n in present)
        assert not (OWNER_DIR / f"{killed_name}.json").exists()
        assert (OWNER_DIR / f"{live_name}.json").exists()
        # The live testbed still works, and its own teardown removes it and its record.
        live.send_signal(signal.SIGTERM)
        assert live.wait(timeout=30) == 128 + signal.SIGTERM
        assert not any(live_name in n for n in _namespaces())
        assert not (OWNER_DIR / f"{live_name}.json").exists()
    finally:
        for child in (live, killed):
            child.kill()
            child.wait()
        if stray in _namespaces():
            netns.remove(stray)
        cleanup(prefix=prefix)


def test_cleanup_reports_a_namespace_it_could_not_remove(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyroute2 import netns

    script = textwrap.dedent("""
        import sys
        from injectors.testbed import Testbed
        bed = Testbed(1, prefix=sys.argv[1])
        bed.build()
        print(bed.name, flush=True)
    """)  # exits without teardown: a leftover
    prefix = f"adb-fail{os.getpid() % 1000}-"
    out = subprocess.run([sys.executable, "-c", script, prefix], capture_output=True, text=True)
    name = out.stdout.strip()
    real_remove = netns.remove

    def busy(namespace: str) -> None:
        if namespace.endswith("-sw"):
            raise OSError(16, "Device or resource busy")
        real_remove(namespace)

    try:
        monkeypatch.setattr(netns, "remove", busy)
        report = cleanup(prefix=prefix)
        assert report.removed == (f"{name}-h0",)
        assert report.failed == ((f"{name}-sw", "Device or resource busy"),)
        assert (OWNER_DIR / f"{name}.json").exists()  # kept: the next cleanup retries
    finally:
        monkeypatch.undo()
        report = cleanup(prefix=prefix)
    assert report.removed == (f"{name}-sw",)
    assert not (OWNER_DIR / f"{name}.json").exists()


def test_a_delay_wire_delays_its_pair_only() -> None:
    """2 x 20 ms one way: load only adds to a round trip, so a floor proves the delay, and
    the other pair and plane staying under the half of it prove it is this pair's only."""
    with Testbed(3) as bed:
        bed.set_wire(0, 1, plane=0, forward=WireState(delay_ms=20))
        rtt = _measure(bed, 0, 1, 0, "rtt")
        assert 38.0 <= rtt < 80.0, rtt  # the median of 20 round trips (bench: +0.35 ms)
        assert _measure(bed, 0, 2, 0, "rtt") < FREE_RTT_MS
        assert _measure(bed, 0, 1, 1, "rtt") < FREE_RTT_MS
        wires = [process for process, _ in bed._wires]
    assert not any(process.is_alive() for process in wires)


def test_a_wire_caps_one_direction() -> None:
    """Load only slows traffic: the capped direction stays under its cap and the other is
    more than twice as fast (a down wire and a downed NIC's wire ends: tests/harness/
    test_network.py, in a real run)."""
    with Testbed(2) as bed:
        bed.set_wire(0, 1, plane=0, forward=WireState(rate_bit_s=40e6), backward=HEALTHY)
        capped = _measure(bed, 0, 1, 0, "2")
        reverse = _measure(bed, 1, 0, 0, "2")
    assert capped <= 42.0 and reverse > 2 * capped, (capped, reverse)


@pytest.mark.parametrize(
    "entry",
    [
        "from injectors.testbed import _enter_and_run; _enter_and_run(NAME, 'rnic0', print, ())",
        "from injectors.wire import _open_tap; _open_tap(NAME, 'w0')",
    ],
    ids=["worker", "wire"],
)
def test_a_process_late_into_a_removed_host_fails_and_makes_no_namespace(entry: str) -> None:
    """A worker or wire that a teardown overtook (a signal mid-start) finds its host gone and
    ends; it once made the namespace anew (pyroute2's default) and waited there, leaving it."""
    with Testbed(1) as bed:
        name = bed.hosts[0]
    code = f"NAME = {name!r}\n{entry}"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    if name in left:  # the failure this test is for: undo it
        subprocess.run(["ip", "netns", "delete", name], check=True)
    assert out.returncode == 1 and "FileNotFoundError" in out.stderr
    assert name not in left
