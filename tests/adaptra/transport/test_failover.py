"""NIC failover in the delegate transport: a run goes on over the other NIC, losing nothing."""

from __future__ import annotations

from collections import Counter

import pytest

from harness.policies import system_controller
from harness.runner import run_configuration
from injectors.fault_files import parse_yaml
from pipeline.profile import Profile
from pipeline.timeline import Timeline

pytestmark = pytest.mark.multiprocess


def _delivered_once(timeline: Timeline, profile: Profile, num_iterations: int) -> None:
    """Every message of every iteration is in the timeline once (the receiving trainer also
    refuses a message its delegate reports twice)."""
    keys = Counter((m.iteration, m.link, m.direction, m.microbatch) for m in timeline.messages)
    per_iteration = 2 * (profile.num_stages - 1) * profile.num_microbatches
    assert len(keys) == per_iteration * num_iterations and set(keys.values()) == {1}


def test_a_nic_failing_at_iteration_20_of_50_loses_nothing_at_the_transport_level() -> None:
    """No root, no namespaces: from iteration 20, 5 ms in, the fault hook has rnic0 of the
    host of stage 1 down; each sender delegate of links 0-1 and 1-2 hears it with its next
    message and moves to rnic1 (its connection over loopback's second address), the rest of
    the run goes on there: no restart, no iteration lost, every message delivered once."""
    profile = Profile.uniform(4, 4, 1, 1, 1, message_bytes=4096, num_delegates=2)
    faults = parse_yaml('[{start_iteration: 20, at_ms: 5, nic: "host1:rnic0", down: true}]')
    result = run_configuration(
        system_controller("adaptra", profile, faults),
        backend="emulated",
        num_iterations=50,
        num_warmup_iterations=1,
        faults=faults,
        delegated=True,
    )
    assert (result.restarts, result.lost_iterations) == (0, 0)
    assert result.iterations == tuple(range(50))
    timeline = result.timeline
    assert timeline is not None
    _delivered_once(timeline, profile, 51)
    moved = timeline.failovers
    # Every sender delegate (2 per direction) of the four directions through host 1, once,
    # from rnic0 to rnic1, told by the hook: with its first message after the failure, in
    # fault iteration 20 (run iteration 21) or, if it had sent all of that one's by 5 ms, 21.
    assert Counter((f.link, f.direction) for f in moved) == {
        (link, direction): 2 for link in ("0-1", "1-2") for direction in ("forward", "backward")
    }
    assert len({f.carrier_pid for f in moved}) == 8
    assert {(f.cause, f.nic_from, f.nic_to) for f in moved} == {("fault hook", "rnic0", "rnic1")}
    assert {f.iteration for f in moved} <= {21, 22} and 21 in {f.iteration for f in moved}
    assert all(f.resumed_ms >= f.noticed_ms >= timeline.iterations[21].start_ms for f in moved)
    assert all(f.resume_seq >= 0 for f in moved)  # the message that heard it, sent anew
