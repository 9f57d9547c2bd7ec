"""The namespace testbed, measured with real TCP traffic between its hosts (needs root)."""

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest

from injectors.ownership import OWNER_DIR, cleanup
from injectors.peer_tc import UNCAPPED_BYTES_S, htb_burst_bytes
from injectors.probe import measure as _measure
from injectors.testbed import MTU, PLANES, Testbed, TestbedError
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


def _neighbours(bed: Testbed, host: int) -> list[str]:
    return subprocess.run(
        ["ip", "-n", bed.hosts[host], "neigh", "show"], capture_output=True, text=True, check=True
    ).stdout.splitlines()


def test_a_restart_forgets_the_neighbours_an_outage_left_unresolved() -> None:
    """A peer unreachable in an outage leaves its entry unresolved (FAILED here, INCOMPLETE
    mid-way), which a fresh pool's first connect met: gloo's "No route to host", then a
    retry. `forget_neighbours` drops those; a resolved entry stays (a new ARP over a delayed
    wire would pay its delay), as does a permanent one."""
    with Testbed(2) as bed:
        bed.set_link(1, 0, up=False)
        connect = (
            "import socket; s = socket.socket(); s.settimeout(1); "
            f"s.connect_ex(({bed.address(1, 0)!r}, 9))"
        )  # its ARP request goes unanswered
        subprocess.run([*bed.exec_prefix(0), sys.executable, "-c", connect], check=True)
        assert any(bed.address(1, 0) in line for line in _neighbours(bed, 0))
        add = ["ip", "-n", bed.hosts[0], "neigh", "add"]
        for address, state in (("10.0.0.98", "reachable"), ("10.0.0.99", "permanent")):
            lladdr = ["lladdr", "02:11:22:33:44:55", "dev", PLANES[0]]
            subprocess.run([*add, address, *lladdr, "nud", state], check=True)
        assert bed.forget_neighbours() == 1
        kept = sorted(line.split()[0] for line in _neighbours(bed, 0))
        assert kept == ["10.0.0.98", "10.0.0.99"]


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


def _link(bed: Testbed, host: int, ifname: str) -> tuple[int, str]:
    """An interface of a host: its MTU and whether it is set up ("UP") or down ("DOWN")."""
    from pyroute2 import IPRoute

    with IPRoute(netns=bed.hosts[host]) as ipr:
        (link,) = ipr.get_links(ipr.link_lookup(ifname=ifname)[0])
    return link.get_attr("IFLA_MTU"), "UP" if link["flags"] & 1 else "DOWN"


def test_a_wire_made_while_a_nic_is_down_has_jumbo_frames_at_both_ends_after_the_repair() -> None:
    """The down host's end was skipped as the wire was made, and the repair only brought it
    up: it kept MTU 1500 (1,500-byte frames: 725 per 1 MiB message, see the module)."""
    with Testbed(3, prefix="adb-wmtu-", netem=False) as bed:
        bed.set_link(0, plane=0, up=False)
        bed.set_wire(0, 2, plane=0, forward=WireState(delay_ms=10))
        assert _link(bed, 0, "w0") == (MTU, "DOWN")  # down with its NIC, until repaired
        assert _link(bed, 2, "w0") == (MTU, "UP")
        bed.set_link(0, plane=0, up=True)
        assert [_link(bed, host, "w0") for host in (0, 2)] == [(MTU, "UP"), (MTU, "UP")]
        assert MTU == 9000


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


def _htb_classes(bed: Testbed, host: int, ifname: str = "rnic0") -> list[Any]:
    from pyroute2 import IPRoute

    with IPRoute(netns=bed.hosts[host]) as ipr:
        return list(ipr.get_classes(index=ipr.link_lookup(ifname=ifname)[0]))


def _rate_and_burst_bytes(htb: Any) -> tuple[int, int, int]:
    """An htb class's rate (bytes/s), burst and cburst (bytes), as the kernel has them: it
    keeps a burst as the time to send it, in ticks."""
    from pyroute2.netlink.rtnl.tcmsg.common import tick_in_usec

    options = htb.get_attr("TCA_OPTIONS")
    parms = options.get_attr("TCA_HTB_PARMS")
    rate_bytes_s = options.get_attr("TCA_HTB_RATE64") or parms["rate"]
    burst, cburst = (
        round(parms[key] / tick_in_usec * 1e-6 * rate_bytes_s) for key in ("buffer", "cbuffer")
    )
    return rate_bytes_s, burst, cburst


@pytest.mark.parametrize("rate_mbit", [5000.0, 100.0])
def test_a_cap_s_burst_is_a_tenth_of_a_millisecond_of_its_rate_and_a_frame_at_least(
    rate_mbit: float,
) -> None:
    """pyroute2's default burst (1,600 bytes plus rate/10^9) is less than one of the
    testbed's 9,000-byte frames: a 5 Gbit/s cap gave 2.8 Gbit/s."""
    with Testbed(2, prefix="adb-bst-") as bed:
        bed.cap_bandwidth(0, 1, plane=0, rate_mbit=rate_mbit)
        (htb,) = _htb_classes(bed, 0)
    rate_bytes_s, burst_bytes, cburst_bytes = _rate_and_burst_bytes(htb)
    expected = htb_burst_bytes(rate_bytes_s, MTU)
    assert expected == max(MTU, -(-rate_bytes_s // 10_000))
    slack = rate_bytes_s * 1e-6 + 1  # pyroute2 sends whole microseconds of it
    assert expected - slack <= burst_bytes <= expected + 1, (burst_bytes, expected)
    assert expected - slack <= cburst_bytes <= expected + 1, (cburst_bytes, expected)


def test_a_second_cap_on_a_pair_replaces_the_first() -> None:
    from pyroute2 import IPRoute

    with Testbed(2, prefix="adb-cap2-") as bed:
        bed.cap_bandwidth(0, 1, plane=0, rate_mbit=100)
        with IPRoute(netns=bed.hosts[0]) as ipr:
            filters = len(ipr.get_filters(index=ipr.link_lookup(ifname="rnic0")[0]))
        bed.cap_bandwidth(0, 1, plane=0, rate_mbit=5000)
        (htb,) = _htb_classes(bed, 0)
        with IPRoute(netns=bed.hosts[0]) as ipr:
            assert len(ipr.get_filters(index=ipr.link_lookup(ifname="rnic0")[0])) == filters
        rate_bytes_s, burst_bytes, _ = _rate_and_burst_bytes(htb)
        assert rate_bytes_s == 625_000_000
        assert abs(burst_bytes - 62_500) <= 626  # whole microseconds of the rate, as sent
        bed.cap_bandwidth(1, 0, plane=0, rate_mbit=100)  # the other direction: its own
        assert len(_htb_classes(bed, 1)) == 1


def test_a_lifted_cap_leaves_its_pair_unshaped() -> None:
    """`uncap_bandwidth` (a pair left without a role by a rank swap): the pair's class goes to
    an unshaping rate, its filter stays for a later cap; a pair never capped is untouched."""
    with Testbed(2, prefix="adb-unc-") as bed:
        bed.uncap_bandwidth(1, 0, plane=0)
        assert _htb_classes(bed, 1) == []
        bed.cap_bandwidth(0, 1, plane=0, rate_mbit=100)
        bed.uncap_bandwidth(0, 1, plane=0)
        (htb,) = _htb_classes(bed, 0)
        assert _rate_and_burst_bytes(htb)[0] == UNCAPPED_BYTES_S
        bed.cap_bandwidth(0, 1, plane=0, rate_mbit=100)
        (htb,) = _htb_classes(bed, 0)
        assert _rate_and_burst_bytes(htb)[0] == 12_500_000


def test_out_of_range_hosts_and_planes_are_refused_and_change_nothing() -> None:
    """Python's negative indices once reached another host's or the management plane's
    interface, a host past the last left its NIC marked down before an IndexError, and a
    cap from a host to itself was installed."""
    with Testbed(2, prefix="adb-rng-") as bed:
        refused = {
            "no host -1 in 2 hosts": [
                lambda: bed.set_link(-1, 0, up=False),
                lambda: bed.cap_bandwidth(-1, 0, 0, 100),
                lambda: bed.cap_bandwidth(0, -1, 0, 100),
                lambda: bed.bytes_sent(-1),
            ],
            "no host 2 in 2 hosts": [
                lambda: bed.set_link(2, 0, up=False),
                lambda: bed.cap_bandwidth(0, 2, 0, 100),
            ],
            "no data plane -1": [
                lambda: bed.set_link(0, -1, up=False),
                lambda: bed.cap_bandwidth(0, 1, -1, 100),
                lambda: bed.set_wire(0, 1, -1, WireState(delay_ms=1.0)),
            ],
            "no data plane 2": [
                lambda: bed.set_link(0, 2, up=False),
                lambda: bed.cap_bandwidth(0, 1, 2, 100),
                lambda: bed.set_wire(0, 1, 2, WireState(delay_ms=1.0)),
            ],
            "not from 0 to itself": [lambda: bed.cap_bandwidth(0, 0, 0, 100)],
        }
        for message, calls in refused.items():
            for call in calls:
                with pytest.raises(TestbedError, match=message):
                    call()
        assert bed._down == set() and bed._wire_of == {} and bed._netem_of == {}
        for host in range(2):
            for ifname in PLANES:
                assert _htb_classes(bed, host, ifname) == []
            assert _measure(bed, host, 1 - host, 0, "rtt") < FREE_RTT_MS


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


def test_the_sysctl_writes_leave_their_thread_where_it_was() -> None:
    """A thread writing a host's sysctls comes back to its own namespace, not to the main
    thread's: pyroute2's `pushns` saved `/proc/self/ns/net`, the main thread's, so a timer's
    thread that wrote them while the main thread was inside a host stayed in that host."""
    import threading

    from injectors.testbed import _entered, _set_sysctls

    def namespace() -> int:
        return os.stat("/proc/thread-self/ns/net").st_ino

    here = namespace()
    with Testbed(2) as bed:
        seen: list[int] = []
        go = threading.Event()

        def write() -> None:
            go.wait(10)
            _set_sysctls(bed.hosts[1], {})
            seen.append(namespace())

        thread = threading.Thread(target=write)  # (a thread starts in its maker's namespace)
        thread.start()
        with _entered(bed.hosts[0]):  # the main thread inside host 0 meanwhile
            go.set()
            thread.join()
        assert seen == [here] and namespace() == here


def test_a_nic_s_timer_takes_it_down_and_up_forking_no_helper(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A NIC's failure and repair come from a timer's thread `at_ms` into an iteration:
    `set_link` there makes its netlink socket inside the host's namespace, forking no helper
    (pyroute2's way for a namespace named: 40-65 ms in a process that has imported torch,
    before the NIC went down), changes the NIC there, and leaves the thread where it was."""
    import threading

    import pyroute2.netns

    helpers: list[object] = []
    create_socket = pyroute2.netns.create_socket

    def creating(netns: Any = None, *args: Any, **kwargs: Any) -> Any:
        if netns is not None:
            helpers.append(netns)  # (a socket in a namespace named: a helper forked)
        return create_socket(netns, *args, **kwargs)

    def states(bed: Testbed) -> str:
        out = subprocess.run(
            ["ip", "-n", bed.hosts[1], "-o", "link", "show", PLANES[0]],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        return "DOWN" if "state DOWN" in out else "UP"

    with Testbed(2) as bed:
        monkeypatch.setattr(pyroute2.netns, "create_socket", creating)
        seen: list[tuple[str, int]] = []

        def timer(up: bool) -> None:
            bed.set_link(1, plane=0, up=up)
            seen.append((states(bed), os.stat("/proc/thread-self/ns/net").st_ino))

        for up in (False, True):
            thread = threading.Thread(target=timer, args=(up,))
            thread.start()
            thread.join()
        here = os.stat("/proc/thread-self/ns/net").st_ino
        assert seen == [("DOWN", here), ("UP", here)]
        assert helpers == []


def test_a_nic_s_timer_looks_up_no_interface(monkeypatch: pytest.MonkeyPatch) -> None:
    """A NIC's timer looks up neither the NIC nor the host's wire ends on its plane (a
    lookup dumps every link of the host: about 33 ms inside a busy iteration, before the NIC
    went down): the build and the wire's start knew their indices. The NIC still goes down
    and comes back with its wire end."""
    import threading

    from pyroute2 import IPRoute

    with Testbed(2, netem=False) as bed:
        bed.set_wire(0, 1, plane=0, forward=WireState(delay_ms=1.0))  # a wire end on plane 0
        looked_up: list[object] = []

        def looking_up(self: Any, **kwargs: Any) -> Any:
            looked_up.append(kwargs)
            return IPRoute.__getattr__(self, "link_lookup")(**kwargs)

        monkeypatch.setattr(IPRoute, "link_lookup", looking_up, raising=False)
        for up in (False, True):
            thread = threading.Thread(target=bed.set_link, args=(1, 0, up))
            thread.start()
            thread.join()
            out = subprocess.run(
                ["ip", "-n", bed.hosts[1], "-o", "link", "show"],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            names = {PLANES[0], "w0"}  # the NIC and its wire end
            ends = [
                line
                for line in out.splitlines()
                if line.split()[1].split("@")[0].rstrip(":") in names
            ]
            assert len(ends) == 2 and all(("state DOWN" in e) != up for e in ends), out
        assert looked_up == []
        monkeypatch.undo()
        assert _measure(bed, 0, 1, 0, "rtt") >= 1.0  # through the wire again


def test_a_wire_whose_process_ended_is_named_and_forgotten() -> None:
    """A pair's wire process killed: its delay is gone (its TAPs went with it) and the
    testbed says so, naming the wire, instead of failing later on its missing interfaces;
    the pair's next state makes a new wire, which holds its delay again."""
    with Testbed(2, prefix="adb-dead-", netem=False) as bed:
        delayed = WireState(delay_ms=30.0)
        bed.set_wire(0, 1, plane=0, forward=delayed)
        assert _measure(bed, 0, 1, 0, "rtt") >= 60.0
        bed._wires[0].process.kill()
        bed._wires[0].process.join(10.0)
        with pytest.raises(TestbedError, match=r"the wire w0 between hosts 0 and 1 on plane 0 has"):
            bed.check_wires()
        assert _measure(bed, 0, 1, 0, "rtt") < FREE_RTT_MS  # no delay: the plane carries it
        bed.set_wire(0, 1, plane=0, forward=delayed)
        assert _measure(bed, 0, 1, 0, "rtt") >= 60.0
        bed.set_link(1, plane=0, up=False)  # the dead wire's missing ends are not looked for
        bed.set_link(1, plane=0, up=True)


def test_teardown_after_an_exception() -> None:
    with pytest.raises(RuntimeError, match="midway"), Testbed(2) as bed:
        names = [bed.switch, *bed.hosts]
        raise RuntimeError("midway")
    present = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(name in present for name in names)


def _signalled_testbed(body: tuple[str, ...], prefix: str, signum: int) -> None:
    """A process that builds a testbed of prefix `prefix` (`bed`), runs `body`'s lines inside
    its `with`, says its name and sleeps, sent `signum`: it ends with 128 + `signum` and
    leaves neither its namespaces nor its owner record."""
    script = "\n".join(
        [
            "import sys, time",
            "from injectors.testbed import Testbed",
            "with Testbed(2, prefix=sys.argv[1]) as bed:",
            *(f"    {line}" for line in body),
            "    print(bed.name, flush=True)",
            "    time.sleep(60)",
        ]
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, prefix], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        name = child.stdout.readline().strip()
        assert name.startswith(prefix)
        child.send_signal(signum)
        assert child.wait(timeout=30) == 128 + signum
        assert not any(name in n for n in _namespaces())
        assert not (OWNER_DIR / f"{name}.json").exists()
    finally:
        child.kill()
        child.wait()
        cleanup(prefix=prefix)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["TERM", "HUP"])
def test_teardown_after_a_shutdown_signal(signum: int) -> None:
    """Outside the CLI too: the testbed's own handler takes SIGHUP as it takes SIGTERM (a
    closed terminal once killed the process and left every namespace)."""
    # The full pid: two test workers' prefixes never collide (a pid modulo 1000 could), and
    # no interface name carries a prefix (namespace names have no 15-character limit).
    _signalled_testbed((), f"adb-sig{os.getpid()}-", signum)


def test_a_testbed_built_again_after_its_teardown_still_tears_down_on_a_signal() -> None:
    """bench_injectors.py tears a testbed down and builds it again inside its `with`: the
    teardown gave back the signal handlers, and the second build once set none, so a
    SIGTERM then ended the process outright and left every namespace."""
    body = ("bed.teardown()", "bed.build()")
    _signalled_testbed(body, f"adb-rb{os.getpid()}-", signal.SIGTERM)


def test_a_testbed_built_again_has_every_nic_up_for_its_wires() -> None:
    """A NIC taken down before a teardown is up in the next build, and so are the ends of a
    wire made there (they once came up down, as for a NIC still down: the pair was cut)."""
    with Testbed(2) as bed:
        bed.set_link(1, plane=0, up=False)
        bed.teardown()
        bed.build()
        bed.set_wire(0, 1, plane=0, forward=WireState(delay_ms=1.0))
        assert _link(bed, 1, "w0")[1] == "UP"
        assert _measure(bed, 0, 1, 0, "rtt") < FREE_RTT_MS


def test_a_shutdown_signal_handled_inside_a_finalizer_still_tears_down() -> None:
    """A SIGTERM whose handler ran inside a finalizer (pyroute2 drops an asyncio loop per
    namespace it opens) raised its SystemExit there, Python printed "Exception ignored" and
    the with-body went on, exit status 0, its namespaces there until its end: now the signal
    is handled again outside it, and the testbed is torn down, exit status 143."""
    script = textwrap.dedent("""
        import os, signal, sys, time
        from injectors.testbed import Testbed
        class SignalsItself:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(100):  # bytecode boundaries: the handler runs in here
                    pass
        with Testbed(1, prefix=sys.argv[1]) as bed:
            print(bed.name, flush=True)
            SignalsItself()
            time.sleep(10)
            print("went on", flush=True)
    """)
    prefix = f"adb-fin{os.getpid()}-"
    try:
        out = subprocess.run(
            [sys.executable, "-c", script, prefix], capture_output=True, text=True, timeout=60
        )
        (name,) = out.stdout.splitlines()
        assert out.returncode == 128 + signal.SIGTERM
        assert "Exception ignored" not in out.stderr
        assert not any(name in n for n in _namespaces())
        assert not (OWNER_DIR / f"{name}.json").exists()
    finally:
        cleanup(prefix=prefix)


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_a_testbed_without_cap_net_admin_says_so_and_leaves_nothing() -> None:
    """Root without CAP_NET_ADMIN got pyroute2's bare `NetlinkError: (1, 'Operation not
    permitted')`, which the CLI reported as an internal error (a bug), exit status 3: now
    a TestbedError (the CLI's one line, exit status 1) names the capability and the step."""
    script = textwrap.dedent("""
        import sys
        from injectors.testbed import Testbed, TestbedError
        try:
            with Testbed(1, prefix=sys.argv[1], netem=False):
                pass
        except TestbedError as err:
            print(err)
    """)
    prefix = f"adb-cap{os.getpid()}-"
    drop = ["setpriv", "--inh-caps=-net_admin", "--bounding-set=-net_admin"]
    try:
        out = subprocess.run(
            [*drop, sys.executable, "-c", script, prefix],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        (line,) = out.stdout.splitlines()
        assert line.startswith("the testbed needs root (CAP_NET_ADMIN): building the planes' ")
        assert line.endswith("-sw was refused: Operation not permitted")
        assert not any(prefix in name for name in _namespaces())
        assert not list(OWNER_DIR.glob(f"{prefix}*"))
    finally:
        cleanup(prefix=prefix)


def test_the_testbed_handles_the_shutdown_signals_only_while_it_exists() -> None:
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP)}
    if any(handler is not signal.SIG_DFL for handler in before.values()):
        pytest.skip(f"this test process handles the shutdown signals itself: {before}")
    with Testbed(1, prefix="adb-hnd-"):
        during = {signum: signal.getsignal(signum) for signum in before}
    assert all(handler not in (signal.SIG_DFL, None) for handler in during.values()), during
    assert {signum: signal.getsignal(signum) for signum in before} == before


_SIGNAL_IN_THE_MIDDLE = textwrap.dedent("""
    import os, signal, sys
    from pyroute2 import netns
    from injectors.testbed import Testbed

    prefix, where, signum, owner = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    owner_pid = os.getpid()

    def unwind(signum, frame):  # harness.cli's handler (the testbed leaves it in place)
        if os.getpid() != owner_pid:  # a helper that pyroute2 forked: it just dies
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        for each in (signal.SIGTERM, signal.SIGHUP):  # one shutdown
            signal.signal(each, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    if owner == "cli":
        for each in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(each, unwind)
    real = getattr(netns, where)

    def then_a_signal(name, *args, **kwargs):
        real(name, *args, **kwargs)
        if name.endswith("-h0"):  # made (build) or removed (teardown): others follow
            os.kill(os.getpid(), signum)

    bed = Testbed(2, prefix=prefix)
    print(bed.name, flush=True)
    setattr(netns, where, then_a_signal)
    with bed:
        pass
""")


@pytest.mark.parametrize(
    ("where", "signum", "owner"),
    [
        ("create", signal.SIGTERM, "testbed"),
        ("create", signal.SIGHUP, "cli"),
        ("remove", signal.SIGTERM, "testbed"),
        ("remove", signal.SIGTERM, "cli"),
        ("remove", signal.SIGHUP, "testbed"),
    ],
)
def test_a_signal_while_namespaces_come_and_go_leaves_none(
    where: str, signum: int, owner: str
) -> None:
    """A signal right after a namespace was made (it once came before the testbed recorded
    it: teardown left it, and its owner record went, so `cleanup` refused it) or while they
    are removed (it once raised in the teardown: every namespace after it was left) waits
    for the build's step or the whole teardown; then the process ends on it all the same."""
    prefix = f"adb-mid{os.getpid()}-"
    out = subprocess.run(
        [sys.executable, "-c", _SIGNAL_IN_THE_MIDDLE, prefix, where, str(signum), owner],
        capture_output=True,
        text=True,
        timeout=60,
    )
    name = out.stdout.strip()
    try:
        assert name.startswith(prefix), out.stderr
        assert out.returncode == 128 + signum, out.stderr
        assert not any(n.startswith(prefix) for n in _namespaces())
        assert not (OWNER_DIR / f"{name}.json").exists()
        assert "could not remove" not in out.stderr
    finally:
        cleanup(prefix=prefix)
        for leftover in (n for n in _namespaces() if n.startswith(prefix)):  # ownerless
            subprocess.run(["ip", "netns", "delete", leftover], check=False)


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

    prefix = f"adb-own{os.getpid()}-"
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


def _leftover_testbed(prefix: str) -> str:
    """The name of a one-host testbed a process built and left behind (it exited without
    its teardown), its owner record naming that process, now gone."""
    script = textwrap.dedent("""
        import sys
        from injectors.testbed import Testbed
        bed = Testbed(1, prefix=sys.argv[1])
        bed.build()
        print(bed.name, flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", script, prefix], capture_output=True, text=True)
    return out.stdout.strip()


def test_cleanup_reports_a_namespace_it_could_not_remove(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyroute2 import netns

    prefix = f"adb-fail{os.getpid()}-"
    name = _leftover_testbed(prefix)
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


def test_a_namespace_another_cleanup_removed_meanwhile_is_no_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two cleanups at once (a test's and a user's): one finds a namespace gone as it
    removes it, which is neither removed by it nor a failure (it exited 1 before)."""
    from pyroute2 import netns

    prefix = f"adb-race{os.getpid()}-"
    name = _leftover_testbed(prefix)
    real_remove = netns.remove

    def raced(namespace: str) -> None:
        real_remove(namespace)
        if namespace.endswith("-sw"):  # the other cleanup was first
            raise FileNotFoundError(2, "No such file or directory", namespace)

    try:
        monkeypatch.setattr(netns, "remove", raced)
        report = cleanup(prefix=prefix)
    finally:
        monkeypatch.undo()
        cleanup(prefix=prefix)
    assert (report.removed, report.failed) == ((f"{name}-h0",), ())
    assert not any(n.startswith(prefix) for n in _namespaces())
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
        wires = [wire.process for wire in bed._wires]
    assert not any(process.is_alive() for process in wires)


_ONE_MIB_SERVER = textwrap.dedent("""
    import socket, sys
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], 5001)); s.listen(); print("ready", flush=True)
    c, _ = s.accept()
    while True:
        got = 0
        while got < (1 << 20):
            data = c.recv(1 << 20)
            if not data:
                sys.exit(0)
            got += len(data)
        c.sendall(b"k")
""")
_ONE_MIB_CLIENT = textwrap.dedent("""
    import socket, sys, time
    s = socket.create_connection((sys.argv[1], 5001))
    payload = b"x" * (1 << 20)
    s.sendall(payload); s.recv(1)  # over the plane: the window opens (a warm-up)
    print("sent", flush=True)
    sys.stdin.readline()  # the pair has its wire now
    for _ in range(3):
        t = time.perf_counter(); s.sendall(payload); s.recv(1)
        print((time.perf_counter() - t) * 1000, flush=True)
""")


def _retransmitted(bed: Testbed, host: int) -> int:
    """The TCP segments host `host` has sent again (/proc/net/snmp, its namespace's)."""
    snmp = subprocess.run(
        [*bed.exec_prefix(host), "cat", "/proc/net/snmp"], capture_output=True, text=True
    ).stdout.splitlines()
    names, values = (line.split() for line in snmp if line.startswith("Tcp:"))
    return int(values[names.index("RetransSegs")])


def test_a_wire_made_under_an_open_connection_loses_none_of_its_first_message() -> None:
    """A wire's ends are new interfaces: their first frames wait for ARP across the wire,
    and the kernel held 212,992 bytes of them, dropping the rest: 96 segments of the first
    1 MiB message of a connection whose window had opened over the plane, after which Reno
    sent each 1 MiB message in two round trips (85 ms on a 20 ms wire, where 45 do)."""
    with Testbed(2) as bed:
        server = subprocess.Popen(
            [*bed.exec_prefix(1), sys.executable, "-I", "-c", _ONE_MIB_SERVER, bed.address(1)],
            stdout=subprocess.PIPE,
            text=True,
        )
        client = None
        try:
            assert server.stdout is not None and server.stdout.readline().strip() == "ready"
            client = subprocess.Popen(
                [*bed.exec_prefix(0), sys.executable, "-I", "-c", _ONE_MIB_CLIENT, bed.address(1)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert client.stdin is not None and client.stdout is not None
            assert client.stdout.readline().strip() == "sent"
            bed.set_wire(0, 1, plane=0, forward=WireState(delay_ms=20.0))
            client.stdin.write("go\n")
            client.stdin.flush()
            times_ms = [float(client.stdout.readline()) for _ in range(3)]
            retransmitted = _retransmitted(bed, 0)
        finally:
            for process in (client, server):
                if process is not None:
                    process.kill()
                    process.wait()
    # A tenth of a message, for load's; no time is asserted (load moves it: BENCHMARKS.md
    # has the times), the times are said if it fails.
    assert retransmitted < 12, (retransmitted, times_ms)


def test_a_wire_caps_one_direction() -> None:
    """Load only slows traffic: the capped direction stays under its cap and the other is
    more than twice as fast (a down wire and a downed NIC's wire ends: tests/harness/
    test_network.py, in a real run)."""
    with Testbed(2) as bed:
        bed.set_wire(0, 1, plane=0, forward=WireState(rate_bit_s=40e6), backward=HEALTHY)
        capped = _measure(bed, 0, 1, 0, "2")
        reverse = _measure(bed, 1, 0, 0, "2")
    assert capped <= 42.0 and reverse > 2 * capped, (capped, reverse)


def test_a_cap_on_a_wired_pair_holds_on_its_wire() -> None:
    """A wired pair's traffic takes its wire, not the NIC's htb classes: a cap of 100 Mbit/s
    on one gave 2571-2690 Mbit/s. Now the wire has it too, whether the cap or the wire came
    first, under the wire's later states; the other direction is not capped, and a lifted
    cap is gone from the wire (load only slows traffic: the accuracy, as for htb)."""
    with Testbed(3, prefix="adb-capw-", netem=False) as bed:
        bed.set_wire(0, 1, plane=0, forward=WireState(delay_ms=1.0))
        bed.cap_bandwidth(0, 1, plane=0, rate_mbit=40)
        bed.set_wire(0, 1, plane=0, forward=WireState(delay_ms=2.0))  # the cap stays
        bed.cap_bandwidth(2, 0, plane=0, rate_mbit=40)  # then its wire
        bed.set_wire(2, 0, plane=0, forward=WireState(delay_ms=1.0))
        capped = [_measure(bed, 0, 1, 0, "2"), _measure(bed, 2, 0, 0, "2")]
        reverse = _measure(bed, 1, 0, 0, "2")
        bed.uncap_bandwidth(0, 1, plane=0)
        lifted = _measure(bed, 0, 1, 0, "2")
    assert max(capped) <= 42.0, capped
    assert reverse > 2 * max(capped) and lifted > 2 * max(capped), (capped, reverse, lifted)


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


def _dies_at_once(*_: object) -> None:
    """A wire's process that ends before it says it is ready (spawned: module level)."""


def test_a_wire_that_does_not_start_is_named_and_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    """It once raised a bare EOFError and stayed the pair's wire: every later change to the
    pair failed. Now the pair's next wire works: 2 x 20 ms of round trip."""
    import injectors.wire

    with Testbed(2, prefix="adb-wst-", netem=False) as bed:
        monkeypatch.setattr(injectors.wire, "run_wire", _dies_at_once)
        with pytest.raises(
            TestbedError, match="wire w0 between hosts 0 and 1 on plane 0 is gone: EOFError"
        ):
            bed.set_wire(0, 1, plane=0, forward=WireState(delay_ms=20))
        assert bed._wire_of == {} and not bed._wires[0].process.is_alive()
        monkeypatch.undo()
        bed.set_wire(0, 1, plane=0, forward=WireState(delay_ms=20))
        assert bed._wire_of == {(0, 1, 0): 1}
        assert _measure(bed, 0, 1, 0, "rtt") >= 38.0


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")
def test_without_dev_net_tun_a_wire_says_so() -> None:
    """With /dev/net/tun hidden (a tmpfs over /dev/net in a mount namespace of the child's
    own), a pair's wire failed as "is gone: EOFError: ", its cause only in the wire's
    traceback on stderr: now the error names the missing device."""
    script = textwrap.dedent("""
        import sys
        from injectors.testbed import Testbed, TestbedError
        from injectors.wire import WireState
        with Testbed(2, prefix=sys.argv[1], netem=False) as bed:
            try:
                bed.set_wire(0, 1, plane=0, forward=WireState(delay_ms=5.0))
            except TestbedError as err:
                print(err)
    """)
    prefix = f"adb-tun{os.getpid()}-"
    hidden = 'mount -t tmpfs none /dev/net && exec "$0" -c "$1" "$2"'
    try:
        unshared = ["unshare", "-m", "--propagation", "private", "sh", "-c", hidden]
        out = subprocess.run(
            [*unshared, sys.executable, script, prefix],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines() == [
            "the wire w0 between hosts 0 and 1 on plane 0 could not start: no /dev/net/tun on "
            "this machine (the TUN/TAP device): no userspace wire can start, so no per-link "
            "fault that kernel netem does not take (see `adaptra-bench doctor`)"
        ]
        assert "Traceback" not in out.stderr
    finally:
        cleanup(prefix=prefix)


def test_a_wire_that_died_is_named_and_the_pair_s_next_change_makes_a_new_one() -> None:
    with Testbed(2, prefix="adb-wdd-", netem=False) as bed:
        bed.set_wire(0, 1, plane=0, forward=WireState(delay_ms=1.0))
        process = bed._wires[0].process
        process.kill()
        process.join()
        with pytest.raises(TestbedError, match="wire w0 between hosts 0 and 1 on plane 0 is gone"):
            bed.set_wire(0, 1, plane=0, forward=WireState(delay_ms=5.0))
        assert bed._wire_of == {}
        assert _measure(bed, 0, 1, 0, "rtt") < FREE_RTT_MS  # back on the plane, healthy
        bed.set_wire(0, 1, plane=0, forward=WireState(delay_ms=20.0))
        assert _measure(bed, 0, 1, 0, "rtt") >= 38.0
