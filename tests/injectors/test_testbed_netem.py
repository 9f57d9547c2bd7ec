"""The testbed's per-link faults on kernel netem or the userspace wire, chosen by the probe,
measured with real TCP traffic where the kernel has sch_netem (needs root)."""

import os
import time
from typing import Any

import pytest
from pyroute2 import IPRoute

from injectors.doctor import run_checks
from injectors.kernel_probe import NETEM_ENV, kernel_features
from injectors.netem import NETEM_TICK_NS
from injectors.peer_tc import add_netem_class, netem_handle
from injectors.probe import measure as _measure
from injectors.testbed import MTU, Testbed, TestbedError
from injectors.wire import HEALTHY, WireState

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="network namespaces need root (CI runs as root)"
)

FREE_RTT_MS = 20.0
"""A round trip with no injected delay (as in test_testbed.py)."""


def _netem_here() -> tuple[bool, str]:
    return kernel_features().get("netem", (False, "not probed"))


def _needs_netem() -> None:
    present, why = _netem_here()
    if not present:
        pytest.skip(f"no kernel netem here: {why}")


def _netem_delay_ms(bed: Testbed, src: int, dst: int) -> float:
    """The latency of host `src`'s netem leaf for host `dst` on plane 0, read back."""
    with IPRoute(netns=bed.hosts[src]) as ipr:
        index = ipr.link_lookup(ifname="rnic0")[0]
        (leaf,) = [q for q in ipr.get_qdiscs(index=index) if q["handle"] == netem_handle(dst)]
    assert leaf.get_attr("TCA_KIND") == "netem"
    return float(leaf.get_attr("TCA_OPTIONS")["delay"] * NETEM_TICK_NS / 1e6)


def test_the_automatic_choice_is_the_probe_s_and_doctor_says_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On these machines (no sch_netem) the wire; where the kernel has netem, netem."""
    monkeypatch.delenv(NETEM_ENV, raising=False)
    present, _ = _netem_here()
    with Testbed(2) as bed:
        assert bed.uses_netem == present
        bed.set_wire(0, 1, plane=0, forward=WireState(delay_ms=1.0))
        assert bool(bed._wire_of) != present  # the wire was made, or netem took it
    by_name = {check.name: check for check in run_checks()}
    assert by_name["netem"].ok == present
    expected = "kernel netem" if present else "userspace delay wire (no sch_netem)"
    assert by_name["per-link faults"].detail == expected


def test_requiring_netem_where_the_kernel_has_none_is_refused() -> None:
    present, _ = _netem_here()
    if present:
        pytest.skip("this kernel has sch_netem")
    with (
        Testbed(2, netem=True) as bed,
        pytest.raises(TestbedError, match="asked for kernel netem: no sch_netem in"),
    ):
        bed.set_wire(0, 1, plane=0, forward=WireState(delay_ms=1.0))


def test_a_netem_class_bypasses_a_cap_as_the_wire_does() -> None:
    """The netem layout without netem (it runs here): a peer's netem class (an uncapped htb
    class, its filter first) takes its traffic out of the cap's class."""
    with Testbed(3) as bed:
        bed.cap_bandwidth(0, 1, plane=0, rate_mbit=100)
        bed.cap_bandwidth(0, 2, plane=0, rate_mbit=100)
        with IPRoute(netns=bed.hosts[0]) as ipr:
            index = ipr.link_lookup(ifname="rnic0")[0]
            add_netem_class(ipr, index, 1, bed.address(1, 0), mtu_bytes=MTU)
        freed = _measure(bed, 0, 1, 0, "8")
        capped = _measure(bed, 0, 2, 0, "8")
    assert capped <= 105 and freed > 2 * capped, (freed, capped)


def _netem_leaves_recorded(monkeypatch: pytest.MonkeyPatch, *, with_index: bool) -> list[Any]:
    """The testbed takes netem as there (its kernel features said present) and records each
    netem leaf it would set, as (the NIC's index,) the destination host and the state."""
    import injectors.testbed

    sent: list[Any] = []
    monkeypatch.setattr(
        injectors.testbed,
        "kernel_features",
        lambda: dict.fromkeys(("netem", "htb", "u32"), (True, "")),
    )
    monkeypatch.setattr(
        injectors.testbed,
        "set_netem",
        lambda ipr, index, dst, state: sent.append(
            (index, dst, state) if with_index else (dst, state)
        ),
    )
    return sent


def test_the_netem_path_with_its_leaves_recorded_moves_a_pair_to_the_wire_in_its_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The netem path where netem cannot be tried (here): the leaves are recorded, not sent;
    their classes are real. A change at a later time moves the pair to a wire that starts in
    the netem states in force (a round trip of 2 x 20 ms while the change is an hour off), and
    the leaves go back to healthy; a pair whose iteration has later changes (`scheduled`)
    takes the wire at once."""
    sent = _netem_leaves_recorded(monkeypatch, with_index=True)
    delayed = WireState(delay_ms=20.0)
    with Testbed(3, netem=True) as bed:
        bed.set_wire(0, 1, plane=0, forward=delayed, backward=HEALTHY)
        assert [(dst, state) for _, dst, state in sent] == [(1, delayed), (0, HEALTHY)]
        assert bed._wire_of == {}
        bed.set_wire(0, 1, plane=0, forward=WireState(delay_ms=50.0), at=time.monotonic() + 3600)
        assert [(dst, state) for _, dst, state in sent[2:]] == [(1, HEALTHY), (0, HEALTHY)]
        assert set(bed._wire_of) == {(0, 1, 0)}
        rtt = _measure(bed, 0, 1, 0, "rtt")
        assert 18.0 <= rtt < 60.0, rtt  # the forward delay only: 20 ms
        bed.set_wire(0, 2, plane=0, forward=delayed, scheduled=True)
        assert len(sent) == 4 and set(bed._wire_of) == {(0, 1, 0), (0, 2, 0)}
        bed.set_wire(1, 2, plane=0, forward=WireState(stall_ms=5.0))
        assert len(sent) == 4 and len(bed._wire_of) == 3  # a stall: netem cannot
        with IPRoute(netns=bed.hosts[0]) as ipr:
            classes = {
                c["handle"] for c in ipr.get_classes(index=ipr.link_lookup(ifname="rnic0")[0])
            }
        assert classes == {0x10201}  # host 0's netem class for host 1 (none for host 2)


def test_a_pair_on_netem_keeps_its_caps_in_its_netem_leaves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its netem class bypasses its caps' classes (above), so the caps go into its leaves,
    set before or after its state, as a wired pair's go on its wire (the leaves once had
    the state's rate alone: a capped pair on netem ran uncapped). The leaves are recorded,
    not sent (the netem path where netem cannot be tried: here)."""
    sent = _netem_leaves_recorded(monkeypatch, with_index=False)
    delayed = WireState(delay_ms=20.0)
    with Testbed(3, netem=True) as bed:
        bed.cap_bandwidth(0, 1, plane=0, rate_mbit=100)
        bed.set_wire(0, 1, plane=0, forward=delayed, backward=HEALTHY)
        assert sent == [(1, WireState(delay_ms=20.0, rate_bit_s=100e6)), (0, HEALTHY)]
        bed.cap_bandwidth(1, 0, plane=0, rate_mbit=50)
        assert sent[2:] == [
            (1, WireState(delay_ms=20.0, rate_bit_s=100e6)),
            (0, WireState(rate_bit_s=50e6)),
        ]
        bed.uncap_bandwidth(0, 1, plane=0)
        assert sent[4:] == [(1, delayed), (0, WireState(rate_bit_s=50e6))]
        bed.set_wire(0, 2, plane=0, forward=WireState(rate_bit_s=10e6))
        bed.cap_bandwidth(2, 0, plane=0, rate_mbit=20)  # the state's own rate is lower
        assert sent[6:] == [(2, WireState(rate_bit_s=10e6)), (0, WireState(rate_bit_s=10e6))] * 2
        # a cap netem cannot hold is left out of its leaves: it moved the pair to the wire
        bed.cap_bandwidth(0, 1, plane=0, rate_mbit=40_000)
        assert sent[10:] == [(1, delayed), (0, WireState(rate_bit_s=50e6))]
        assert bed._wire_of == {}


def test_netem_delays_its_pair_only() -> None:
    """As the wire's test: 2 x 20 ms one way, on netem, and no wire made."""
    _needs_netem()
    with Testbed(3) as bed:
        bed.set_wire(0, 1, plane=0, forward=WireState(delay_ms=20))
        assert bed._wire_of == {}
        assert _netem_delay_ms(bed, 0, 1) == _netem_delay_ms(bed, 1, 0) == 20.0
        rtt = _measure(bed, 0, 1, 0, "rtt")
        assert 38.0 <= rtt < 80.0, rtt
        assert _measure(bed, 0, 2, 0, "rtt") < FREE_RTT_MS
        assert _measure(bed, 0, 1, 1, "rtt") < FREE_RTT_MS


def test_netem_caps_one_direction() -> None:
    _needs_netem()
    with Testbed(2) as bed:
        bed.set_wire(0, 1, plane=0, forward=WireState(rate_bit_s=40e6), backward=HEALTHY)
        assert bed._wire_of == {}
        capped = _measure(bed, 0, 1, 0, "2")
        reverse = _measure(bed, 1, 0, 0, "2")
    assert capped <= 42.0 and reverse > 2 * capped, (capped, reverse)


def test_a_pair_on_netem_takes_the_wire_for_a_stall_and_keeps_its_delay() -> None:
    """A stall netem cannot express: the pair moves to a wire that starts in the netem
    states in force, and its netem leaves go back to doing nothing."""
    _needs_netem()
    with Testbed(2) as bed:
        bed.set_wire(0, 1, plane=0, forward=WireState(delay_ms=20))
        bed.set_wire(0, 1, plane=0, forward=WireState(delay_ms=20, stall_ms=10))
        assert set(bed._wire_of) == {(0, 1, 0)}
        assert _netem_delay_ms(bed, 0, 1) == _netem_delay_ms(bed, 1, 0) == 0.0
        rtt = _measure(bed, 0, 1, 0, "rtt")
    assert 38.0 <= rtt < 80.0, rtt
