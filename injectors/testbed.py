"""The network testbed: one network namespace per host, built and torn down with pyroute2.

Every host has two data interfaces, rnic0 and rnic1, on two bridges ("planes"), and mgmt on
a management bridge that no fault touches (rendezvous and control). The bridges live in a
switch namespace of the testbed's own, so nothing is added to the root namespace. Names
carry a unique prefix, so testbeds coexist; teardown removes every namespace (and with them
every link and qdisc) on normal exit, on exceptions and on SIGTERM or SIGHUP (the shutdown
signals are held while it runs, and handled after it); each testbed records its owner process
(injectors.ownership), so that `cleanup()` there removes the leftovers of a process that was
killed outright, and only those.

The hosts' TCP stands in for an RDMA fabric, which has no congestion window to open and no
pacing on a path that carries little, so that a delay on a link costs a message the delay
and not round trips of TCP's own (`HOST_TCP`, `ROUTE_METRICS`, `MTU`): Reno instead of the
machine's default (BBR paces a flow that starts on a long path at the rate it has measured
of it: 34.5 ms per 4 KiB message over a 30 ms wire), initial windows of 128 segments on
every route and buffers of 8 MiB (a fresh connection, or one whose path just became long,
need not wait for its window), and jumbo frames: MTU 9,000 on every interface, wires
included, and GSO size 9,000 on the planes' NICs (the wires' ends keep the kernel's; a TAP
hands the wire one frame per segment; 1,500-byte frames made a 1 MiB
message 725 of them, and htb sees frames, not 64 KiB GSO bursts). Measured over a 30 ms
wire (BENCHMARKS.md, "What TCP adds on the testbed's wire"): 4 KiB and 64 KiB messages
arrive 30.2-30.5 ms after they went, from the first iteration on; 1 MiB ones 35-50 ms late
in their first two iterations on the long path, 1-4 ms after. The price: htb lets a burst
through at once (a frame, or 0.1 ms of the cap's rate: injectors.peer_tc), so a cap gives
a little more than its rate to short messages.

A host pair's per-link faults (`set_wire`) go to kernel netem on the hosts' plane interfaces
where the kernel has sch_netem (probed once per process, injectors.kernel_probe) and netem
can express them (injectors.netem); else, and for changes scheduled at a later time, to a
userspace wire between the two hosts (injectors.wire). A pair that once took the wire keeps
it for the testbed's life.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import math
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from injectors.kernel_probe import error_code, error_reason, kernel_features, per_link_path
from injectors.netem import NETEM_MAX_RATE_BIT_S, netem_cannot
from injectors.ownership import OwnerRecord
from injectors.peer_tc import (
    CAP_FILTER_PRIO,
    UNCAPPED_BYTES_S,
    add_netem_class,
    add_peer_class,
    add_peer_filter,
    cap_classid,
    change_peer_class,
    set_netem,
)
from injectors.wire import HEALTHY, WireError, WireProcess, WireState
from pipeline.errors import AdaptraBenchError
from pipeline.signals import HELD_SIGNALS, catch_swallowed, held_signals, redelivered_if_swallowed

__all__ = ["DATA_PLANES", "PREFIX", "Testbed", "TestbedError", "add_peer_filter"]

logger = logging.getLogger(__name__)

PREFIX = "adb-"
HOST_TCP = {
    "net.ipv4.tcp_congestion_control": "reno",
    "net.ipv4.tcp_rmem": "4096 8388608 33554432",
    "net.ipv4.tcp_wmem": "4096 8388608 33554432",
    # No IPv6: its own frames (listener reports, neighbour discovery, from an interface's
    # start and every few seconds) would take a wire's stall before any message does.
    "net.ipv6.conf.all.disable_ipv6": "1",
    "net.ipv6.conf.default.disable_ipv6": "1",
}
"""Sysctls set in every host's namespace (see the module)."""
MTU = 9000
"""MTU of every interface of the testbed, and GSO size of the planes' NICs (the module)."""
ROUTE_METRICS = {"initcwnd": 128, "initrwnd": 128}
"""Metrics of every route on a host's planes (see the module)."""
PLANES = ("rnic0", "rnic1", "mgmt")
"""Interfaces of every host; plane index p uses the subnet 10.(p+1).0.0/24."""
DATA_PLANES = PLANES[:2]
"""The data-plane NICs (pipeline.topology's `nics`): the management plane carries no data."""


class TestbedError(AdaptraBenchError, RuntimeError):
    """The testbed could not be built, changed or torn down."""

    __test__ = False  # not a pytest test class


@contextlib.contextmanager
def _refusal(what: str, capability: str = "CAP_NET_ADMIN") -> Iterator[None]:
    """A failed call within (pyroute2's NetlinkError, an OSError) as a TestbedError saying
    that `what` failed, and why; one refused for want of privilege (EPERM, EACCES) names the
    `capability` the testbed needs (a bare NetlinkError read as a bug in the tool)."""
    from pyroute2 import NetlinkError

    try:
        yield
    except (NetlinkError, OSError) as err:
        reason = error_reason(err)
        if error_code(err) in (errno.EPERM, errno.EACCES):
            message = f"the testbed needs root ({capability}): {what} was refused: {reason}"
        else:
            message = f"{what} failed: {reason}"
        raise TestbedError(message) from err


@contextlib.contextmanager
def _entered(namespace: str) -> Iterator[None]:
    """This thread in network namespace `namespace`, then back where it was (setns moves the
    calling thread only: the process's other threads, a NIC's timer or the controller's,
    stay where they are; pyroute2's `pushns`/`popns` keep one stack for every thread)."""
    from pyroute2 import netns

    back = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        netns.setns(namespace, flags=0)
        try:
            yield
        finally:
            netns.setns(back, flags=0)
    finally:
        os.close(back)


def _set_sysctls(namespace: str, values: dict[str, str]) -> None:
    """Write `values` (key: value, as sysctl names them) in `namespace`: this thread enters it
    for the writes (/proc/sys/net is the opener's namespace's) and comes back."""
    with _entered(namespace):
        for key, value in values.items():
            path = Path("/proc/sys", *key.split("."))
            if key.startswith("net.ipv6.") and not path.exists():
                continue  # a kernel without IPv6: nothing to turn off
            path.write_text(value)


WIRE_UNRESOLVED_BYTES = 64 << 20
"""What a wire's end holds for the peer while its address is being resolved (ARP, across
the wire's delay: each end is a new interface, with no neighbour entry): the kernel's
default, 212,992 bytes (23 of the testbed's frames), dropped the rest of a message sent
into a wire that had just been made under connections with open windows (a warm-up's
over the plane: 96 of a 1 MiB message's 118 segments), and Reno then halved its threshold
for the rest of the run: every later 1 MiB message over a 20 ms wire took two round trips,
85 ms instead of 45. Enough for several connections' send buffers (`HOST_TCP`)."""


def _wire_end_sysctls(ifname: str) -> dict[str, str]:
    """The sysctls of a wire's end `ifname` (a namespace has no `neigh.default` to set)."""
    return {f"net.ipv4.neigh.{ifname}.unres_qlen_bytes": str(WIRE_UNRESOLVED_BYTES)}


WIRE_ANSWER_S = 60.0
"""How long a wire process may take to start or to answer a state: a hang guard, not a
timing (quiet, a wire starts in 0.25 s and answers in well under a millisecond; one beside
busy processes took more than 10 s to start)."""


def _tell(wire: WireProcess, word: object, answer: str, wait_s: float = WIRE_ANSWER_S) -> None:
    """`WireProcess.tell`, its failure a TestbedError."""
    try:
        wire.tell(word, answer, wait_s)
    except WireError as err:
        raise TestbedError(str(err)) from err


def _enter_and_run(
    namespace: str, ifname: str, target: Callable[..., None], args: tuple[Any, ...]
) -> None:
    """Child-process entry: move into the host's namespace, bind gloo to its interface."""
    from pyroute2 import netns

    netns.setns(namespace, flags=0)  # never made anew: it may be gone (a teardown)
    os.environ["GLOO_SOCKET_IFNAME"] = ifname
    target(*args)


_NUD_UNRESOLVED = 0x01 | 0x20
"""A neighbour entry's state bits while its address is not known: INCOMPLETE, FAILED
(linux/neighbour.h)."""


class Testbed:
    """`num_hosts` hosts; use as a context manager (it builds on enter, tears down on exit)."""

    __test__ = False

    def __init__(self, num_hosts: int, *, prefix: str = PREFIX, netem: bool | None = None) -> None:
        """`netem`: None chooses netem or the wire for per-link faults by what the kernel has
        (`per_link_path`); False always takes the wire; True requires netem."""
        if num_hosts < 1 or num_hosts > 250:
            raise TestbedError(f"a testbed has 1 to 250 hosts, not {num_hosts}")
        self.num_hosts = num_hosts
        self.name = f"{prefix}{uuid.uuid4().hex[:8]}"
        self.switch = f"{self.name}-sw"
        self.hosts = [f"{self.name}-h{h}" for h in range(num_hosts)]
        self._created: list[str] = []
        self._wires: list[WireProcess] = []
        """Every wire started, failed ones too: an index, with its interfaces' name, is
        never reused."""
        self._down: set[tuple[int, int]] = set()
        """(host, plane) NICs taken down (`set_link`): a wire made meanwhile ends down there."""
        self._wire_of: dict[tuple[int, int, int], int] = {}
        """The wire of each (host pair, plane) that has one, by its index in `_wires`."""
        self._netem = netem
        self._netem_of: dict[tuple[int, int, int], tuple[WireState, WireState]] = {}
        """Each (host pair, plane) on netem: its (forward, backward) states in force."""
        self._netem_classes: set[tuple[int, int, int]] = set()
        """(source, destination, plane) with a netem class on the source's interface."""
        self._caps: set[tuple[int, int, int]] = set()
        """(source, destination, plane) with a cap's class on the source's interface."""
        self._cap_bit_s: dict[tuple[int, int, int], float] = {}
        """(source, destination, plane) -> the cap in force (a wired pair's wire has it too)."""
        self._previous_handlers: dict[int, Any] = {}
        """The handlers ours replaced, by signal (`_on_signal`; teardown puts them back)."""
        self._owner_pid = os.getpid()
        self._owner: OwnerRecord | None = None
        self._indices: dict[tuple[int, str], int] = {}
        """(host, interface name) -> the interface's index in the host (`_index`)."""

    @staticmethod
    def address(host: int, plane: int = 0) -> str:
        return f"10.{plane + 1}.0.{host + 1}"

    def __enter__(self) -> Testbed:
        # pyroute2 loaded before the handlers (`build` sets them): a signal in its first
        # import left it half initialised, and the teardown's own import of it then failed.
        from pyroute2 import IPRoute, netns  # noqa: F401

        try:
            self.build()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.teardown()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._owner_pid:
            # A forked helper (pyroute2 runs one per namespace) keeps the default: it dies.
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        # Unwinds through __exit__, which tears down (sent again if a finalizer swallows it).
        raise redelivered_if_swallowed(SystemExit(128 + signum), signum)

    def _handle_signals(self) -> None:
        """The shutdown signals that would end the process outright (their default) unwind
        through the teardown while the testbed exists (`teardown` puts the defaults back)."""
        if threading.current_thread() is not threading.main_thread():  # none can be set
            return
        catch_swallowed()  # before the first signal (redelivered_if_swallowed)
        for signum in HELD_SIGNALS:  # SIGINT's default already unwinds (KeyboardInterrupt)
            if signal.getsignal(signum) in (signal.SIG_DFL, None):  # else its owner unwinds
                self._previous_handlers[signum] = signal.signal(signum, self._on_signal)

    def build(self) -> None:
        """Make the namespaces and their links (`__enter__` does; so may a testbed that was
        torn down, which starts afresh: its signal handlers back, no NIC down)."""
        from pyroute2 import IPRoute, netns

        # pyroute2 loaded before the handlers (`__enter__`); a build after a teardown
        # handles the shutdown signals again, which that teardown gave back.
        self._handle_signals()
        self._owner = OwnerRecord.for_this_process(self.name, (self.switch, *self.hosts))
        self._owner.write()  # before any namespace exists: none is ever without an owner
        for name in (self.switch, *self.hosts):
            # Recorded first, and created with the shutdown signals held, so that a teardown
            # on a signal never misses one, nor comes before pyroute2's helper has made it.
            with held_signals(), _refusal(f"creating namespace {name}", "CAP_SYS_ADMIN"):
                self._created.append(name)
                netns.create(name)
        with (
            _refusal(f"building the planes' bridges in namespace {self.switch}"),
            IPRoute(netns=self.switch, flags=0) as ipr,
        ):
            for plane in range(len(PLANES)):
                ipr.link("add", ifname=f"br{plane}", kind="bridge")
                ipr.link("set", index=ipr.link_lookup(ifname=f"br{plane}")[0], state="up")
            for host, namespace in enumerate(self.hosts):
                for plane in range(len(PLANES)):
                    port, end = f"h{host}p{plane}", f"t{host}p{plane}"
                    ipr.link("add", ifname=port, kind="veth", peer=end)
                    bridge = ipr.link_lookup(ifname=f"br{plane}")[0]
                    ipr.link(
                        "set",
                        index=ipr.link_lookup(ifname=port)[0],
                        master=bridge,
                        mtu=MTU,
                        state="up",
                    )
                    ipr.link("set", index=ipr.link_lookup(ifname=end)[0], net_ns_fd=namespace)
        for host, namespace in enumerate(self.hosts):
            setting_up = _refusal(f"setting up host {host}'s interfaces in namespace {namespace}")
            with setting_up, IPRoute(netns=namespace, flags=0) as ipr:
                ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
                for plane, ifname in enumerate(PLANES):
                    index = ipr.link_lookup(ifname=f"t{host}p{plane}")[0]
                    ipr.link("set", index=index, ifname=ifname, mtu=MTU, gso_max_size=MTU)
                    self._indices[host, ifname] = index
                    ipr.addr("add", index=index, address=self.address(host, plane), prefixlen=24)
                    ipr.link("set", index=index, state="up")
                    self._route_plane(ipr, index, host, plane)
            with _refusal(f"setting host {host}'s TCP in namespace {namespace}"):
                _set_sysctls(namespace, HOST_TCP)

    def teardown(self) -> None:
        """Remove every namespace this testbed made; idempotent. The shutdown signals wait
        until it is done (then a noted one is handled: ours ends the process), and the
        handlers that `__enter__` replaced come back."""
        try:
            with held_signals():
                self._stop_wires()
                self._remove_namespaces()
        finally:
            for signum, handler in self._previous_handlers.items():
                signal.signal(signum, handler)
            self._previous_handlers = {}

    def _stop_wires(self) -> None:
        for wire in self._wires:
            wire.stop()
        self._wires = []
        self._wire_of = {}

    def _remove_namespaces(self) -> None:
        """Each namespace in `_created` is dropped from it once it is gone (or was never
        made: a signal between recording and creating it); the owner record goes with the
        last, else `cleanup` retries once this process has ended."""
        from pyroute2 import netns

        self._netem_of, self._netem_classes, self._caps = {}, set(), set()  # gone with them
        self._cap_bit_s, self._down, self._indices = {}, set(), {}
        for name in reversed(list(self._created)):
            try:
                netns.remove(name)
            except FileNotFoundError:
                pass  # not there: removed
            except OSError as err:
                logger.warning("could not remove namespace %s: %s", name, err)
                continue
            self._created.remove(name)
        if self._owner is not None and not self._created:
            self._owner.remove()
            self._owner = None

    def _check_host(self, host: int) -> None:
        if not 0 <= host < self.num_hosts:
            raise TestbedError(
                f"no host {host} in {self.num_hosts} hosts (0..{self.num_hosts - 1})"
            )

    @staticmethod
    def _check_plane(plane: int) -> None:
        if not 0 <= plane < len(DATA_PLANES):
            raise TestbedError(
                f"no data plane {plane}: faults go on planes 0..{len(DATA_PLANES) - 1} "
                "(the management plane never gets faults)"
            )

    @contextlib.contextmanager
    def _host(self, host: int) -> Iterator[Any]:
        """A netlink handle in the host's namespace, its socket made by this thread inside it.
        pyroute2's own (`IPRoute(netns=...)`) forks a helper process to make it: 40-65 ms in
        a process that has imported torch, which a NIC's timer paid before the NIC went down
        (at 39-172 ms into an iteration where 5 ms was asked, in runs of 50-70 ms iterations:
        after its messages)."""
        from pyroute2 import IPRoute

        with _entered(self.hosts[host]):
            ipr = IPRoute()
        with ipr:
            yield ipr

    def _index(self, ipr: Any, host: int, ifname: str) -> int:
        """Interface `ifname`'s index in `host` (`ipr`: a handle there), looked up once: a
        lookup dumps and parses every link of the host, 1 ms here between iterations but
        about 33 ms inside a busy one, which a NIC's timer paid before the NIC went down. No
        name is given to another interface in a testbed's life (a new wire's ends have new
        names; a teardown forgets them all)."""
        key = (host, ifname)
        if key not in self._indices:
            self._indices[key] = ipr.link_lookup(ifname=ifname)[0]
        return self._indices[key]

    def forget_neighbours(self) -> int:
        """Every host's unresolved neighbour (ARP) entries gone; how many. An outage leaves
        some (INCOMPLETE, FAILED) that a fresh pool's first connect met: "No route to host"
        from gloo, which retried. Resolved ones stay: a new ARP over a delayed wire pays its
        delay."""
        forgotten = 0
        for host in range(self.num_hosts):
            with _refusal(f"forgetting host {host}'s neighbours"), self._host(host) as ipr:
                for entry in ipr.neigh("dump"):
                    if not entry["state"] & _NUD_UNRESOLVED:
                        continue
                    ipr.neigh("del", dst=entry.get_attr("NDA_DST"), ifindex=entry["ifindex"])
                    forgotten += 1
        return forgotten

    def set_link(self, host: int, plane: int, up: bool) -> float:
        """A NIC failure (up=False) or its repair, on one host's interface of one plane, and
        on the host's ends of its wires on that plane (they stand in for the same NIC); when
        the call that sets the NIC itself began (monotonic s: the kernel changed it, and its
        netlink event went out, at most the call's time later)."""
        self._check_host(host)
        self._check_plane(plane)
        self.check_wires()
        (self._down.discard if up else self._down.add)((host, plane))
        set_at = 0.0
        doing = "bringing up" if up else "taking down"
        with _refusal(f"{doing} {PLANES[plane]} of host {host}"), self._host(host) as ipr:
            ends = [(PLANES[plane], None), *self._wire_ends(host, plane)]
            for ifname, there in ends:
                index = self._index(ipr, host, ifname)
                set_at = set_at or time.monotonic()
                ipr.link("set", index=index, state="up" if up else "down")
                if not up:
                    continue
                self._wait_up(ipr, index, f"{ifname} of host {host}")
                if there is None:
                    self._route_plane(ipr, index, host, plane)
                else:
                    self._route_wire(ipr, index, host, there, plane)
        return set_at

    def bytes_sent(self, host: int) -> dict[str, int]:
        """What each of the host's interfaces has sent, in bytes, by plane name (a plane's
        wire ends count as its NIC: they stand in for it)."""
        self._check_host(host)
        self.check_wires()
        with _refusal(f"reading host {host}'s counters"), self._host(host) as ipr:
            sent = {ifname: 0 for ifname in PLANES}
            for plane, ifname in enumerate(PLANES):
                ends = [ifname, *(name for name, _ in self._wire_ends(host, plane))]
                for name in ends:
                    (link,) = ipr.get_links(ipr.link_lookup(ifname=name)[0])
                    sent[ifname] += link.get_attr("IFLA_STATS64")["tx_bytes"]
        return sent

    @staticmethod
    def _wait_up(ipr: Any, index: int, what: str) -> None:
        """Until the carrier is back (a TAP with its wire reports UNKNOWN)."""
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            (link,) = ipr.get_links(index)
            if link.get("operstate") in ("UP", "UNKNOWN"):
                return
            time.sleep(0.05)
        raise TestbedError(f"{what} did not come back up")

    def cap_bandwidth(self, src: int, dst: int, plane: int, rate_mbit: float) -> None:
        """Cap traffic from host `src` to host `dst` on one plane (htb class, u32 on dst); a
        pair's second cap replaces its first. A pair with a wire on that plane, now or later,
        has the cap on its wire too (its traffic takes the wire, not the NIC's classes), and
        a pair on netem in its netem leaves (their class comes before the cap's): there the
        lower of the cap and the state's own rate (`set_wire`) holds."""
        self._check_host(src)
        self._check_host(dst)
        if src == dst:
            raise TestbedError(f"a cap is on traffic between two hosts, not from {src} to itself")
        self._check_plane(plane)
        if not (math.isfinite(rate_mbit) and rate_mbit > 0):
            raise TestbedError(f"a bandwidth cap must be a finite rate > 0 Mbit/s, not {rate_mbit}")
        # pyroute2 parses a rate string's digits as an int ("12.5mbit" fails): give bytes/s
        # (rates of 2^32 bytes/s and more go out as htb's 64-bit rate).
        rate_bytes_s = max(1, round(rate_mbit * 1e6 / 8))
        capping = _refusal(f"capping traffic from host {src} to host {dst} on plane {plane}")
        with capping, self._host(src) as ipr:
            index = ipr.link_lookup(ifname=PLANES[plane])[0]
            classid = cap_classid(dst)
            if (src, dst, plane) in self._caps:
                change_peer_class(ipr, index, classid, rate_bytes_s, mtu_bytes=MTU)
            else:
                address = self.address(dst, plane)
                add_peer_class(
                    ipr, index, classid, rate_bytes_s, address, CAP_FILTER_PRIO, mtu_bytes=MTU
                )
                self._caps.add((src, dst, plane))
        self._cap_bit_s[src, dst, plane] = rate_mbit * 1e6
        self._cap_wire(src, dst, plane)

    def uncap_bandwidth(self, src: int, dst: int, plane: int) -> None:
        """Lift `cap_bandwidth`'s cap on traffic from host `src` to host `dst` on one plane
        (its class stays, at an unshaping rate, for a later cap); none there: nothing."""
        if (src, dst, plane) not in self._caps:
            return
        lifting = _refusal(f"lifting the cap from host {src} to host {dst} on plane {plane}")
        with lifting, self._host(src) as ipr:
            index = ipr.link_lookup(ifname=PLANES[plane])[0]
            change_peer_class(ipr, index, cap_classid(dst), UNCAPPED_BYTES_S, mtu_bytes=MTU)
        if self._cap_bit_s.pop((src, dst, plane), None) is not None:
            self._cap_wire(src, dst, plane)

    def _cap_wire(self, src: int, dst: int, plane: int) -> None:
        """The pair's caps on `plane` to its wire, where it has one, or to its netem leaves
        (with the states in force), where it is on netem: its netem class bypasses the cap's."""
        key = (min(src, dst), max(src, dst), plane)
        if key in self._wire_of:
            self._send(key, self._wire_caps(key))
        elif key in self._netem_of:
            self.set_wire(*key, *self._netem_of[key])  # the wire, if netem cannot take it

    def _wire_caps(self, key: tuple[int, int, int]) -> tuple[str, float | None, float | None]:
        """The word that gives a pair's wire its caps (injectors.wire)."""
        a, b, plane = key
        return ("cap", self._cap_bit_s.get((a, b, plane)), self._cap_bit_s.get((b, a, plane)))

    @property
    def uses_netem(self) -> bool:
        """Whether per-link faults go to kernel netem where it can express them."""
        if self._netem is None:
            self._netem = per_link_path().netem
        elif self._netem:
            present, why = kernel_features().get("netem", (False, "not probed"))
            if not present:
                raise TestbedError(f"the testbed was asked for kernel netem: {why}")
        return self._netem

    def set_wire(
        self,
        host_a: int,
        host_b: int,
        plane: int,
        forward: WireState,
        backward: WireState | None = None,
        *,
        at: float = 0.0,
        scheduled: bool = False,
    ) -> None:
        """The pair's per-link faults on one plane from monotonic time `at` on (0: now):
        `forward` for packets from `host_a` to `host_b`, `backward` (default: the same) the
        other way. `scheduled`: changes at later times follow in this iteration, so the pair
        takes the wire now, not mid-iteration. Kernel netem takes them where it can (see the
        module); else the pair's wire does: its first is made here (the pair's traffic on that
        plane goes through it from then on, starting with the netem states in force), later
        calls change it in place, so workers keep their connections."""
        self._check_plane(plane)
        if not 0 <= host_a < self.num_hosts or not 0 <= host_b < self.num_hosts or host_a == host_b:
            raise TestbedError(f"no host pair {host_a}-{host_b} in {self.num_hosts} hosts")
        backward = forward if backward is None else backward
        if host_a > host_b:
            host_a, host_b, forward, backward = host_b, host_a, backward, forward
        key = (host_a, host_b, plane)
        if (
            key not in self._wire_of
            and not (at or scheduled)
            and self._netem_serves(key, forward, backward)
        ):
            # Under the pair's caps: its netem class bypasses theirs (injectors.peer_tc).
            self._set_netem(host_a, host_b, plane, self._capped(host_a, host_b, plane, forward))
            self._set_netem(host_b, host_a, plane, self._capped(host_b, host_a, plane, backward))
            self._netem_of[key] = (forward, backward)
            return
        if key not in self._wire_of:
            carried = self._netem_of.get(key)  # in force until the wire takes over
            if carried is not None:
                first = carried
            else:
                first = (HEALTHY, HEALTHY) if at else (forward, backward)
            self._add_wire(host_a, host_b, plane, first)
            if self._netem_of.pop(key, None) is not None:  # its traffic left: netem healthy
                self._set_netem(host_a, host_b, plane, HEALTHY)
                self._set_netem(host_b, host_a, plane, HEALTHY)
            elif not at:
                return  # the wire started in this state
        self._send_state(key, at, forward, backward)

    def _netem_serves(
        self, key: tuple[int, int, int], forward: WireState, backward: WireState
    ) -> bool:
        """Whether netem is in use and expresses both directions' states."""
        if not self.uses_netem:
            return False
        a, b, plane = key
        why = netem_cannot(self._capped(a, b, plane, forward)) or netem_cannot(
            self._capped(b, a, plane, backward)
        )
        if why is not None:
            logger.debug("hosts %d-%d on plane %d take the userspace wire: %s", *key, why)
        return why is None

    def _set_netem(self, src: int, dst: int, plane: int, state: WireState) -> None:
        """`state` on the traffic from host `src` to host `dst` on `plane` (a netem leaf)."""
        setting = _refusal(f"setting netem from host {src} to host {dst} on plane {plane}")
        with setting, self._host(src) as ipr:
            index = ipr.link_lookup(ifname=PLANES[plane])[0]
            if (src, dst, plane) not in self._netem_classes:
                add_netem_class(ipr, index, dst, self.address(dst, plane), mtu_bytes=MTU)
                self._netem_classes.add((src, dst, plane))
            set_netem(ipr, index, dst, state)

    def _capped(self, src: int, dst: int, plane: int, state: WireState) -> WireState:
        """`state` under the cap on the traffic from host `src` to host `dst` on `plane`
        (`cap_bandwidth`), for its netem leaves: the lower rate holds, as on the wire. A cap
        over netem's fastest rate (34.4 Gbit/s) is left out, and logged: it moved the pair to
        the userspace wire, whose one process carries far less than the cap."""
        cap_bit_s = self._cap_bit_s.get((src, dst, plane))
        if cap_bit_s is not None and cap_bit_s > NETEM_MAX_RATE_BIT_S:
            logger.warning(
                "cap of %.1f Gbit/s from host %d to host %d left out of its netem (at most "
                "%.1f Gbit/s there)",
                cap_bit_s / 1e9,
                src,
                dst,
                NETEM_MAX_RATE_BIT_S / 1e9,
            )
            cap_bit_s = None
        if cap_bit_s is None or state.down:
            return state
        rate_bit_s = min(cap_bit_s, state.rate_bit_s or math.inf)
        return dataclasses.replace(state, rate_bit_s=rate_bit_s)

    def _send_state(
        self, key: tuple[int, int, int], at: float, forward: WireState, backward: WireState
    ) -> None:
        """The pair's wire to these states (see `_send`)."""
        self._send(key, ("state", at, forward, backward))

    def _send(self, key: tuple[int, int, int], word: tuple[object, ...]) -> None:
        """`word` to the pair's wire; a wire that is gone or does not answer is stopped and
        forgotten (the pair's traffic is back on its plane, and its next `set_wire` makes a
        new one)."""
        wire = self._wires[self._wire_of[key]]
        try:
            _tell(wire, word, "ok")
        except TestbedError:
            del self._wire_of[key]
            wire.kill()
            raise

    def _add_wire(
        self, host_a: int, host_b: int, plane: int, first: tuple[WireState, WireState]
    ) -> None:
        """The pair's wire, in the states `first` before any traffic is routed through it;
        one that fails to start is stopped and forgotten."""
        from pyroute2 import IPRoute

        key, index = (host_a, host_b, plane), len(self._wires)
        ifname = f"w{index}"
        what = f"the wire {ifname} between hosts {host_a} and {host_b} on plane {plane}"
        wire = WireProcess(self.hosts[host_a], self.hosts[host_b], ifname, what)
        with held_signals():  # a wire started is a wire recorded (teardown stops it)
            self._wires.append(wire)
            wire.start()
        try:
            _tell(wire, None, "ready")
            _tell(wire, ("state", 0.0, *first), "ok")
            _tell(wire, self._wire_caps(key), "ok")
            self._wire_of[key] = index
            for here, there in ((host_a, host_b), (host_b, host_a)):
                up = (here, plane) not in self._down  # a down NIC: its end too, until repaired
                with (
                    _refusal(f"routing {what} in host {here}"),
                    IPRoute(netns=self.hosts[here], flags=0) as ipr,
                ):
                    end = self._index(ipr, here, ifname)
                    _set_sysctls(self.hosts[here], _wire_end_sysctls(ifname))
                    # The MTU on a down end too: the repair (`set_link`) only brings it up.
                    ipr.link("set", index=end, mtu=MTU, state="up" if up else "down")
                    if up:
                        self._route_wire(ipr, end, here, there, plane)
        except BaseException:
            self._wire_of.pop(key, None)
            wire.kill()
            raise

    def _route_plane(self, ipr: Any, index: int, host: int, plane: int) -> None:
        """The host's subnet route on `plane`, with `ROUTE_METRICS` (the kernel made it
        without them as the interface came up)."""
        ipr.route(
            "replace",
            dst=f"10.{plane + 1}.0.0/24",
            oif=index,
            prefsrc=self.address(host, plane),
            proto="kernel",
            scope="link",
            metrics=ROUTE_METRICS,
        )

    def _route_wire(self, ipr: Any, index: int, here: int, there: int, plane: int) -> None:
        """`here`'s traffic for `there` on `plane` through the wire's end `index` (again after
        the end was down: the kernel drops a device's routes when it goes down)."""
        ipr.route(
            "replace",
            dst=f"{self.address(there, plane)}/32",
            oif=index,
            prefsrc=self.address(here, plane),
            metrics=ROUTE_METRICS,
        )

    def check_wires(self) -> None:
        """TestbedError naming a wire whose process has ended (killed, crashed): its pair's
        faults were not in force from then on (its TAPs went with it, and the pair's traffic
        took its plane). It is forgotten, as a wire that stops answering is: the pair's next
        `set_wire` makes a new one."""
        for key, index in list(self._wire_of.items()):
            code = self._wires[index].process.exitcode
            if code is not None:
                del self._wire_of[key]
                raise TestbedError(
                    f"{self._wires[index].what} has ended (exit status {code}): its faults "
                    "were not in force from then on"
                )

    def _wire_ends(self, host: int, plane: int) -> list[tuple[str, int]]:
        """The host's ends of its wires on `plane`: (interface, the host at the other end)."""
        return [
            (f"w{index}", b if host == a else a)
            for (a, b, p), index in self._wire_of.items()
            if p == plane and host in (a, b)
        ]

    def exec_prefix(self, host: int) -> list[str]:
        """Argv prefix that runs a command inside a host (for subprocesses)."""
        return ["ip", "netns", "exec", self.hosts[host]]

    def launcher(self) -> Callable[..., BaseProcess]:
        """The launch hook: rank r runs on host r, gloo bound to the first data plane."""

        from pipeline.runtime.hooks import start_worker  # torch: only for workers

        def launch(rank: int, target: Callable[..., None], args: tuple[Any, ...]) -> BaseProcess:
            if rank >= self.num_hosts:
                raise TestbedError(
                    f"rank {rank} needs host {rank}, the testbed has {self.num_hosts}"
                )
            return start_worker(rank, _enter_and_run, (self.hosts[rank], PLANES[0], target, args))

        return launch
