"""NIC failover in the delegate transport: a run goes on over the other NIC, losing nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from harness.policies import system_controller
from harness.runner import run_configuration
from injectors.fault_files import parse_yaml
from pipeline.host_costs import HostCosts
from pipeline.profile import Profile
from pipeline.timeline import FailoverRecord, Timeline

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
    # from rnic0 to rnic1: told by the hook with its first message after the failure, in
    # fault iteration 20 (run iteration 21), or by its trainer once a sibling has moved.
    assert Counter((f.link, f.direction) for f in moved) == {
        (link, direction): 2 for link in ("0-1", "1-2") for direction in ("forward", "backward")
    }
    assert len({f.carrier_pid for f in moved}) == 8
    assert {(f.nic_from, f.nic_to) for f in moved} == {("rnic0", "rnic1")}
    assert {f.cause for f in moved} <= {"fault hook", "sibling"}
    assert {f.cause for f in moved if f.iteration == 21} >= {"fault hook"}
    assert {f.iteration for f in moved} <= {21, 22} and 21 in {f.iteration for f in moved}
    assert all(f.resumed_ms >= f.noticed_ms >= timeline.iterations[21].start_ms for f in moved)
    # the message that heard it, sent anew
    assert all(f.resume_seq >= 0 for f in moved if f.cause == "fault hook")
    sim = run_configuration(
        system_controller("adaptra", profile, faults),
        num_iterations=50,
        num_warmup_iterations=1,
        faults=faults,
        host=HostCosts(failover_ms=3.0),
    )
    assert (sim.restarts, sim.lost_iterations) == (0, 0)  # sim agrees: the same directions move
    assert sim.timeline is not None
    assert {(f.link, f.direction) for f in sim.timeline.failovers} == {
        (f.link, f.direction) for f in moved
    }


@pytest.mark.parametrize("system", ["1f1b", "zb"])
def test_the_baselines_over_direct_restart_from_their_checkpoint(system: str) -> None:
    """The same failure under 1F1B and ZB over the direct path: the send on the dead NIC is
    a typed link failure, and the harness checkpoint-restarts the job from its last
    checkpoint (the start: every 500 iterations), losing the 20 iterations since."""
    profile = Profile.uniform(4, 4, 1, 1, 1, message_bytes=4096)
    faults = parse_yaml('[{start_iteration: 20, at_ms: 5, nic: "host1:rnic0", down: true}]')
    result = run_configuration(
        system_controller(system, profile, faults),
        backend="emulated",
        num_iterations=30,
        num_warmup_iterations=1,
        faults=faults,
    )
    assert (result.restarts, result.lost_iterations) == (1, 20)
    assert result.iterations == (*range(20), *range(30))
    assert result.timeline is not None and not result.timeline.failovers


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root"
)
@pytest.mark.parametrize("host", [1, 0])
def test_rnic0_of_a_host_down_mid_iteration_on_the_testbed(host: int) -> None:
    """The namespace testbed, Adaptra over delegates (S=4, 64 KiB messages): rnic0 of the
    host of stage 1 (or 0: the first stage, one link only) goes down 8 ms into fault
    iteration 2 and stays down. Its host's delegates
    see the link go down (netlink); each sender moves to rnic1 and sends again what its
    receiver lacks. Every
    iteration completes once, nothing is restarted, every message arrives once; the host's
    traffic after the failure leaves by rnic1, and none of it by the management plane (it
    carries the receivers' notices only)."""
    from harness.loop import run_loop
    from harness.network import network_engine

    profile = Profile.uniform(4, 8, 2, 2, 2, message_bytes=1 << 16, num_delegates=2)
    faults = parse_yaml(f'[{{start_iteration: 2, at_ms: 8, nic: "host{host}:rnic0", down: true}}]')
    with network_engine(profile, delegated=True) as engine:
        bed = engine.bed  # type: ignore[attr-defined]
        names = {bed.switch, *bed.hosts}
        before = bed.bytes_sent(host)
        result = run_loop(
            engine,
            system_controller("adaptra", profile, faults),
            num_iterations=5,
            num_warmup_iterations=1,
            faults=faults,
        )
        after = bed.bytes_sent(host)
    assert not names & set(_namespaces())
    assert (result.restarts, result.lost_iterations) == (0, 0)
    assert result.iterations == tuple(range(5))
    timeline = result.timeline
    assert timeline is not None
    _delivered_once(timeline, profile, 6)
    moved = timeline.failovers
    assert {(f.nic_from, f.nic_to) for f in moved} == {("rnic0", "rnic1")}
    assert {f.iteration for f in moved} <= {3, 4}  # fault iteration 2 is run iteration 3
    # The host's own senders hear netlink; their receivers there tell the others over the
    # management plane (else TCP's user timeout would, seconds later).
    links = [link for link in ("0-1", "1-2", "2-3") if str(host) in link.split("-")]
    assert {(f.link, f.direction) for f in moved} == {
        (link, direction) for link in links for direction in ("forward", "backward")
    }
    assert {f.cause for f in moved if _sent_by(host, f)} == {"link state"}
    assert {f.cause for f in moved if not _sent_by(host, f)} <= {"notice", "timeout"}
    assert len(moved) == 2 * 2 * len(links)  # each delegate (2 per direction) once
    assert len({f.carrier_pid for f in moved}) == len(moved)
    # The host sends 8 messages of 64 KiB per iteration on each of its links; from fault
    # iteration 2 on they leave by rnic1: at least the two iterations after it, whole.
    sent = {name: after[name] - before[name] for name in after}
    assert sent["rnic1"] >= 2 * 8 * len(links) * (1 << 16)
    assert sent["mgmt"] < 0.01 * sent["rnic1"]  # nothing of the data (a few control frames)
    alive = [pid for f in moved if _alive(pid := f.carrier_pid)]
    assert not alive  # every delegate ended with its pool


def _sent_by(host: int, failover: FailoverRecord) -> bool:
    """Stage h sends gradients on link (h-1)-h and activations on link h-(h+1)."""
    first, second = (int(end) for end in failover.link.split("-"))
    return (failover.direction == "backward" and second == host) or (
        failover.direction == "forward" and first == host
    )


def _namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
