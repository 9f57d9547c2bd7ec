"""The runtime's own fault hook (no processes): static delays by link name, a fault view
asked with the concrete link, PP or DP."""

import dataclasses

import pytest

from pipeline.errors import LinkFailure
from pipeline.faults import NO_FAULTS, MessageFault
from pipeline.runtime.hooks import FaultViewHook, HookRoute
from pipeline.topology import Link


@dataclasses.dataclass(frozen=True)
class _Recording:
    asked: list[tuple[Link, str, str, int]] = dataclasses.field(default_factory=list)
    down: frozenset[int] = frozenset()
    """The NICs whose route is down."""
    delay_ms: tuple[float, ...] = (0.0, 0.0)
    """Per NIC."""

    def message_fault(
        self,
        link: Link,
        direction: str,
        kind: str,
        microbatch: int,
        num_bytes: int = 0,
        offset_ms: float = 0.0,
        nic: int = 0,
    ) -> MessageFault:
        self.asked.append((link, direction, kind, microbatch))
        return MessageFault(self.delay_ms[nic], failed=nic in self.down)


def test_pp_and_dp_messages_reach_the_view_as_concrete_links() -> None:
    faults = _Recording()
    hook = FaultViewHook({"0-1": 0.0, "dp1:0-1": 0.0}, faults, replica=1)
    assert hook("0-1", "forward", 0, "F", 3, 64) == 0.0
    assert hook("dp1:0-1", "backward", 0, "AR", 7, 64) == 0.0
    assert faults.asked == [
        (Link.pp(0, 1), "forward", "F", 3),  # the sender's replica's PP link
        (Link.dp(1, 0), "backward", "AR", 7),  # a DP link's name is concrete already
    ]


def test_a_failed_dp_link_names_the_all_reduce_message() -> None:
    hook = FaultViewHook({}, _Recording(down=frozenset({0})))
    with pytest.raises(LinkFailure, match=r"link dp2:0-2 \(backward\) has failed: all-reduce "):
        hook("dp2:0-2", "backward", 4, "AR", 5, 64)


def test_a_delegated_message_goes_over_the_first_nic_whose_route_is_up() -> None:
    """`route` keeps the link direction's NIC while its route is up and moves it to the first
    NIC whose route is up otherwise, with that route's delay (plus the link's own); no route
    up is a LinkFailure, as is any failure of a direct send (gloo's one NIC). No fault view:
    the hook names no NIC (the delegates decide)."""
    slow_rnic1 = _Recording(delay_ms=(0.0, 3.0))
    hook = FaultViewHook({"0-1": 2.0}, slow_rnic1)
    assert hook.route("0-1", "forward", 0, "F", 0, 64, 0, 2) == HookRoute(0, 2.0)
    assert hook.route("0-1", "forward", 0, "F", 0, 64, 1, 2) == HookRoute(1, 5.0)
    rnic0_down = FaultViewHook({"0-1": 2.0}, _Recording(down=frozenset({0}), delay_ms=(0, 3)))
    assert rnic0_down.route("0-1", "forward", 0, "F", 0, 64, 0, 2) == HookRoute(1, 5.0)
    rnic1_down = FaultViewHook({}, _Recording(down=frozenset({1})))
    assert rnic1_down.route("0-1", "forward", 0, "F", 0, 64, 1, 2) == HookRoute(0, 0.0)
    both = FaultViewHook({}, _Recording(down=frozenset({0, 1})))
    with pytest.raises(LinkFailure, match="link pp0:0-1 .forward. has failed"):
        both.route("0-1", "forward", 0, "F", 0, 64, 1, 2)
    with pytest.raises(LinkFailure):
        FaultViewHook({}, _Recording(down=frozenset({0})))("0-1", "forward", 0, "F", 0, 64)
    assert FaultViewHook({"0-1": 2.0}, NO_FAULTS).route(
        "0-1", "forward", 0, "F", 0, 64, 1, 2
    ) == HookRoute(None, 2.0)
