"""The runtime's own fault hook (no processes): static delays by link name, a fault view
asked with the concrete link, PP or DP."""

import dataclasses

import pytest

from pipeline.errors import LinkFailure, RouteDown
from pipeline.faults import MessageFault
from pipeline.runtime.hooks import FaultViewHook
from pipeline.topology import Link


@dataclasses.dataclass(frozen=True)
class _Recording:
    asked: list[tuple[Link, str, str, int]] = dataclasses.field(default_factory=list)
    fail: bool = False
    stranded: bool = False

    def message_fault(
        self,
        link: Link,
        direction: str,
        kind: str,
        microbatch: int,
        num_bytes: int = 0,
        offset_ms: float = 0.0,
    ) -> MessageFault:
        self.asked.append((link, direction, kind, microbatch))
        return MessageFault(0.0, failed=self.fail, stranded=self.stranded)


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
    hook = FaultViewHook({}, _Recording(fail=True))
    with pytest.raises(LinkFailure, match=r"link dp2:0-2 \(backward\) has failed: all-reduce "):
        hook("dp2:0-2", "backward", 4, "AR", 5, 64)


def test_a_failure_another_nic_can_carry_is_a_route_down_and_one_it_cannot_is_not() -> None:
    """RouteDown tells a delegated sender (`failover`) to move to another NIC; a stranded
    message's failure, and any failure of a direct sender, is a plain LinkFailure."""
    with pytest.raises(RouteDown):
        FaultViewHook({}, _Recording(fail=True))("0-1", "forward", 0, "F", 0, 64, failover=True)
    for fault, failover in (
        (_Recording(fail=True, stranded=True), True),
        (_Recording(fail=True), False),
    ):
        with pytest.raises(LinkFailure) as info:
            FaultViewHook({}, fault)("0-1", "forward", 0, "F", 0, 64, failover=failover)
        assert type(info.value) is LinkFailure  # a direct sender's is named so
