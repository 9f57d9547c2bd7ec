"""NIC failover in the delegate transport: a run goes on over the other NIC, losing nothing.

Adaptra here is its oracle (`adaptra-oracle`): it runs over the delegates while a failure is
in force, which is what these tests need; the failover is the transport's own."""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from baselines import one_f_one_b
from harness.loop import RunResult
from harness.policies import system_controller
from harness.runner import RuntimeEngines, fixed_plan, link_terms, run_configuration
from injectors.fault_files import parse_yaml
from injectors.fault_model import FaultModel
from pipeline.engines import Controller, Plan
from pipeline.errors import LinkFailure
from pipeline.host_costs import HostCosts
from pipeline.link_rates import NO_RATES
from pipeline.profile import Profile
from pipeline.runtime import WorkerLinkFailure
from pipeline.runtime.megatron.model import get_preset, with_model_bytes
from pipeline.timeline import FailoverRecord, Timeline
from pipeline.topology import Link, Topology

pytestmark = pytest.mark.multiprocess


def _delivered_once(timeline: Timeline, profile: Profile, num_iterations: int) -> None:
    """Every message of every iteration is in the timeline once (the receiving trainer also
    refuses a message its delegate reports twice)."""
    keys = Counter(
        (m.iteration, m.replica, m.link, m.direction, m.microbatch) for m in timeline.messages
    )
    per_iteration = 2 * (profile.num_stages - 1) * profile.num_microbatches * profile.num_replicas
    assert len(keys) == per_iteration * num_iterations and set(keys.values()) == {1}


def test_a_nic_failing_at_iteration_20_of_50_loses_nothing_at_the_transport_level() -> None:
    """No root, no namespaces: from iteration 20, 5 ms in, the fault hook has rnic0 of the
    host of stage 1 down; each sender delegate of links 0-1 and 1-2 hears it with its next
    message and moves to rnic1 (its connection over loopback's second address), the rest of
    the run goes on there: no restart, no iteration lost, every message delivered once."""
    profile = Profile.uniform(4, 4, 1, 1, 1, message_bytes=4096, num_delegates=2)
    faults = parse_yaml('[{start_iteration: 20, at_ms: 5, nic: "host1:rnic0", down: true}]')
    result = run_configuration(
        system_controller("adaptra-oracle", profile, faults),
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
        system_controller("adaptra-oracle", profile, faults),
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


def test_a_nic_failing_on_a_host_of_a_dp_ring_loses_nothing() -> None:
    """PP 4 x DP 2, emulated, hook injection: from iteration 3, 5 ms in, rnic0 of host 5 is
    down. Host 5 plays stage 1 of replica 1: links 0-1 and 1-2 of replica 1, and stage 1's DP
    ring with replica 0 (link dp1:0-1), whose all-reduce chunks go over delegates too. Every
    delegate on a route through that NIC moves to rnic1, the DP ring's included; nothing is
    restarted. The simulator moves the same link directions."""
    profile = Profile.uniform(
        4, 4, 1, 1, 1, message_bytes=4096, num_delegates=2, num_replicas=2,
        allreduce_bytes=16384, dp_bucket_bytes=4096,
    )  # fmt: skip
    faults = parse_yaml('[{start_iteration: 3, at_ms: 5, nic: "host5:rnic0", down: true}]')
    result = run_configuration(
        system_controller("adaptra-oracle", profile, faults),
        backend="emulated",
        num_iterations=6,
        faults=faults,
        delegated=True,
    )
    assert (result.restarts, result.lost_iterations) == (0, 0)
    assert result.iterations == tuple(range(6))
    timeline = result.timeline
    assert timeline is not None
    moved = {(f.link, f.direction, f.replica) for f in timeline.failovers}
    ring = {("dp1:0-1", "forward", 0), ("dp1:0-1", "backward", 1)}
    pp = {(link, d, 1) for link in ("0-1", "1-2") for d in ("forward", "backward")}
    assert moved == ring | pp
    assert {(f.nic_from, f.nic_to) for f in timeline.failovers} == {("rnic0", "rnic1")}
    sim = run_configuration(
        system_controller("adaptra-oracle", profile, faults),
        num_iterations=6,
        faults=faults,
        host=HostCosts(failover_ms=3.0),
    )
    assert (sim.restarts, sim.lost_iterations) == (0, 0)
    assert sim.timeline is not None
    assert {(f.link, f.direction, f.replica) for f in sim.timeline.failovers} == moved


@pytest.mark.parametrize("backend", ["sim", "emulated"])
def test_a_link_direction_meets_its_new_nic_s_faults_and_fails_back_to_a_repaired_one(
    backend: str,
) -> None:
    """No root: PP 2 over delegates (`adaptra-cpu`: in every iteration; the oracle plans
    direct where nothing is in force on rnic0), hook injection. rnic0 of host 1 is down in (fault)
    iteration 1 only, rnic1 of host 1 is 3 ms slow from iteration 2 and down from 3. Link
    0-1 moves to rnic1 in iteration 1, takes rnic1's 3 ms in iteration 2, and fails back to
    the repaired rnic0 in iteration 3: no restart, every message once, in the simulator and
    in real runs alike (the fault hook routes each message; the delegates follow)."""
    profile = Profile.uniform(2, 4, 1, 1, 1, message_bytes=4096, num_delegates=2)
    faults = parse_yaml(
        '[{start_iteration: 1, end_iteration: 2, nic: "host1:rnic0", down: true},'
        ' {start_iteration: 2, nic: "host1:rnic1", delay_ms: 3},'
        ' {start_iteration: 3, nic: "host1:rnic1", down: true}]'
    )
    result = run_configuration(
        # over delegates throughout; its detector (DP only: none here) built for the engine
        system_controller("adaptra-cpu", profile, faults, link_terms=link_terms(backend, "hook")),
        num_iterations=5,
        num_warmup_iterations=1,
        faults=faults,
        **(
            {"backend": "emulated", "delegated": True}
            if backend == "emulated"
            else {"host": HostCosts(failover_ms=3.0)}
        ),
    )
    assert (result.restarts, result.lost_iterations) == (0, 0)
    timeline = result.timeline
    assert timeline is not None
    _delivered_once(timeline, profile, 6)
    moves = {(f.link, f.direction, f.nic_from, f.nic_to) for f in timeline.failovers}
    both = ("forward", "backward")
    assert moves == {
        ("0-1", d, a, b) for d in both for a, b in (("rnic0", "rnic1"), ("rnic1", "rnic0"))
    }
    # run iteration = fault iteration + 1 (one warm-up); a sibling's move may be told later
    back = {f.iteration for f in timeline.failovers if f.nic_to == "rnic0"}
    assert {f.iteration for f in timeline.failovers if f.nic_to == "rnic1"} <= {2, 3}
    assert back <= {4, 5} and 4 in back
    fault_ms = [
        sorted({m.fault_ms for m in timeline.messages if m.iteration == k}) for k in range(6)
    ]
    assert fault_ms == [[0.0], [0.0], [0.0], [3.0], [0.0], [0.0]]


def test_a_run_on_a_shared_pool_starts_its_link_directions_on_rnic0() -> None:
    """An experiment's runs share the runtime's pool. Run A fails rnic0 of host 1 for one
    iteration (link 0-1 moves to rnic1); run B, on the same pool, has 5 ms on the host pair
    (on rnic0's plane): it starts on healthy hardware, over rnic0, and meets them, as the
    simulator does (the moved delegates stayed on rnic1 and ran without them)."""
    profile = Profile.uniform(2, 4, 1, 1, 1, message_bytes=4096, num_delegates=2)
    run_a = parse_yaml('[{start_iteration: 0, end_iteration: 1, nic: "host1:rnic0", down: true}]')
    run_b = parse_yaml("[{start_iteration: 0, hosts: [0, 1], delay_ms: 5}]")
    with RuntimeEngines() as engines:
        fault_ms = []
        for faults in (run_a, run_b):
            result = run_configuration(
                system_controller(
                    "adaptra-cpu", profile, faults, link_terms=link_terms("emulated", "hook")
                ),
                backend="emulated",
                delegated=True,
                engines=engines,
                num_iterations=2,
                num_warmup_iterations=1,
                faults=faults,
            )
            assert result.timeline is not None
            fault_ms.append(
                [sorted({m.fault_ms for m in result.timeline.messages if m.iteration == k})
                 for k in range(3)]
            )  # fmt: skip
            if faults is run_a:
                assert {f.nic_to for f in result.timeline.failovers} == {"rnic1"}
    assert fault_ms == [[[0.0]] * 3, [[0.0], [5.0], [5.0]]]


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


@pytest.mark.parametrize("backend", ["sim", "emulated"])
def test_both_nics_of_a_host_down_leave_no_route_to_fail_over_to(backend: str) -> None:
    """rnic0 of host 1 fails at iteration 2 and its rnic1 as well: Adaptra's delegates have
    no NIC to move to, so the message is a link failure and the job restarts, in the
    simulator and in real runs alike (no failover is recorded). rnic0 alone: it fails
    over (the tests above)."""
    profile = Profile.uniform(4, 4, 1, 1, 1, message_bytes=4096, num_delegates=2)
    faults = parse_yaml(
        '[{start_iteration: 2, at_ms: 5, nic: "host1:rnic0", down: true},'
        ' {start_iteration: 2, at_ms: 5, nic: "host1:rnic1", down: true}]'
    )
    result = run_configuration(
        system_controller("adaptra-oracle", profile, faults),
        num_iterations=4,
        num_warmup_iterations=1,
        faults=faults,
        **({"backend": "emulated", "delegated": True} if backend == "emulated" else {}),
    )
    assert (result.restarts, result.lost_iterations) == (1, 2)
    assert result.iterations == (0, 1, *range(4))
    assert result.timeline is not None and not result.timeline.failovers


def _on_testbed(
    profile: Profile,
    controller: Controller,
    faults: FaultModel,
    num_iterations: int,
    **engine_options: Any,
) -> RunResult:
    """`controller`'s run on the namespace testbed, over delegates, after one warm-up."""
    from harness.loop import run_loop
    from harness.network import network_engine

    with network_engine(profile, delegated=True, **engine_options) as engine:
        return run_loop(
            engine, controller, num_iterations=num_iterations, num_warmup_iterations=1,
            faults=faults,
        )  # fmt: skip


MEGATRON = Profile.uniform(4, 8, 1, 1, 1, num_delegates=2)
"""The megatron runs' profile: the tiny GPT's stages, 8 microbatches, 2 delegates."""


@pytest.fixture(scope="module")
def healthy_megatron() -> RunResult:
    """The run the failed ones must equal: the same 6 iterations without a failure."""
    return run_configuration(
        system_controller("adaptra-oracle", MEGATRON), backend="megatron", num_iterations=6
    )


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root"
)
@pytest.mark.parametrize("host", [1, 0])
def test_rnic0_of_a_host_down_mid_iteration_leaves_megatron_training_as_if_nothing_failed(
    host: int, healthy_megatron: RunResult
) -> None:
    """The namespace testbed, Adaptra over delegates training the tiny megatron GPT (S=4):
    rnic0 of the host of stage 1 (or 0, which also sums the tied embedding's gradient with
    stage 3) goes down 40 ms into iteration 2, the third (of about 100 ms), and stays down.
    The host's delegates see the link go down (netlink), its receivers tell their senders
    over the management plane; each sender moves to rnic1 and sends again what its receiver
    lacks. Every iteration completes once, nothing is restarted, every message arrives once,
    and the losses and the parameters equal the healthy run's bit for bit. The host's
    traffic after the failure leaves by rnic1, and none of it by the management plane (it
    carries the receivers' notices only)."""
    from harness.loop import run_loop
    from harness.network import network_engine

    faults = parse_yaml(f'[{{start_iteration: 2, at_ms: 40, nic: "host{host}:rnic0", down: true}}]')
    with network_engine(MEGATRON, delegated=True, model="tiny") as engine:
        bed = engine.bed  # type: ignore[attr-defined]
        names = {bed.switch, *bed.hosts}
        before = bed.bytes_sent(host)
        result = run_loop(
            engine,
            system_controller("adaptra-oracle", MEGATRON, faults),
            num_iterations=6,
            num_warmup_iterations=1,
            faults=faults,
        )
        after = bed.bytes_sent(host)
    assert not names & set(_namespaces())
    assert (result.restarts, result.lost_iterations) == (0, 0)
    assert result.iterations == tuple(range(6))
    assert len(result.losses) == 6 and result.losses == healthy_megatron.losses
    assert result.params_sha256 == healthy_megatron.params_sha256 != ""
    timeline = result.timeline
    assert timeline is not None
    _delivered_once(timeline, MEGATRON, 7)
    moved = timeline.failovers
    assert {(f.nic_from, f.nic_to) for f in moved} == {("rnic0", "rnic1")}
    # Run iteration 3, or the iteration of a delegate's last message before it (or -1: it
    # had none yet) where it heard netlink before its first message of iteration 3.
    assert {f.iteration for f in moved} <= {-1, 2, 3, 4}
    # The host's own senders hear netlink; their receivers there tell the others over the
    # management plane (else TCP's user timeout would, seconds later), or a delegate of the
    # same worker that moved first tells its siblings (under load it may come first).
    links = [link for link in ("0-1", "1-2", "2-3") if str(host) in link.split("-")]
    routes = links + (["tied:0-3"] if host == 0 else [])
    assert {(f.link, f.direction) for f in moved} == {
        (route, direction) for route in routes for direction in ("forward", "backward")
    }
    assert {f.cause for f in moved if _sent_by(host, f)} == {"link state"}
    assert {f.cause for f in moved if not _sent_by(host, f)} <= {"notice", "sibling", "timeout"}
    assert len(moved) == 2 * 2 * len(routes)  # each delegate once (D=2), also one idle
    assert len({f.carrier_pid for f in moved}) == len(moved)
    # The host sends 8 messages per iteration on each of its links; from iteration 2 on
    # they leave by rnic1: at least the three iterations after it, whole.
    message_bytes = 4 * math.prod(get_preset("tiny").message_shape())
    sent = {name: after[name] - before[name] for name in after}
    assert sent["rnic1"] >= 3 * 8 * len(links) * message_bytes
    assert sent["mgmt"] < 0.02 * sent["rnic1"]  # nothing of the data (a few control frames)
    alive = [pid for f in moved if _alive(pid := f.carrier_pid)]
    assert not alive  # every delegate ended with its pool


DP_MEGATRON = with_model_bytes(
    Profile.uniform(2, 4, 1, 1, 1, num_delegates=1, num_replicas=2), get_preset("tiny")
)
"""PP 2 x DP 2 of the tiny megatron GPT, 4 microbatches, a delegate per link direction."""


@pytest.fixture(scope="module")
def healthy_dp_megatron() -> RunResult:
    """The run `DP_MEGATRON`'s failed ones must equal: 4 iterations after one warm-up."""
    return run_configuration(
        system_controller("adaptra-oracle", DP_MEGATRON), backend="megatron", num_iterations=4
    )


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root"
)
def test_a_last_stage_s_rnic0_down_leaves_megatron_dp_training_as_if_nothing_failed(
    healthy_dp_megatron: RunResult,
) -> None:
    """PP 2 x DP 2 on the namespace testbed, the tiny megatron GPT, Adaptra over delegates:
    rnic0 of host 1 (the last stage of replica 0) goes down in iteration 2. The last stages
    summed the loss over their replicas with a gloo all-reduce, outside the transport and its
    failover: it hung on the dead NIC for three timeouts and the run restarted from its
    checkpoint. Now each reports its replica's part and the driver sums them: no restart,
    and the losses and parameters of the healthy run."""
    faults = parse_yaml('[{start_iteration: 2, nic: "host1:rnic0", down: true}]')
    controller = system_controller("adaptra-oracle", DP_MEGATRON, faults)
    result = _on_testbed(DP_MEGATRON, controller, faults, 4, model="tiny")
    assert (result.restarts, result.lost_iterations) == (0, 0)
    assert result.timeline is not None and result.timeline.failovers
    assert len(result.losses) == 4 and result.losses == healthy_dp_megatron.losses
    assert result.params_sha256 == healthy_dp_megatron.params_sha256 != ""


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root"
)
def test_a_rank_swap_rewires_a_host_whose_rnic0_is_down_on_the_testbed() -> None:
    """PP 2 x DP 2 on the namespace testbed, Adaptra-CPU: host 1's rnic0 is down from the
    start (its delegates fail over at once) and dp0:0-1 is 25 ms slow from iteration 1, so
    Adaptra-CPU swaps that pair onto a PP edge. The swap's port exchange went over the
    process group, which gloo binds to rnic0: it waited the whole timeout there and the run
    restarted. Through the pool's slot folder, the swap is made and the run goes on."""

    profile = Profile.uniform(
        2, 4, 10, 10, 10, message_bytes=65536, num_delegates=1, num_replicas=2,
        allreduce_bytes=(262144,) * 2,
    )  # fmt: skip
    faults = parse_yaml(
        '[{start_iteration: 0, nic: "host1:rnic0", down: true},'
        ' {start_iteration: 1, links: ["dp0:0-1"], delay_ms: 25}]'
    )
    controller = system_controller(
        "adaptra-cpu", profile, faults, link_terms=link_terms("emulated", "network")
    )
    result = _on_testbed(profile, controller, faults, 8, transport_timeout_s=10)
    assert (result.restarts, result.lost_iterations) == (0, 0)
    assert sum(result.num_moved_workers) >= 2  # the swap (an undo may follow: 2 more)
    assert sum(result.num_failovers) > 0


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root"
)
def test_a_megatron_rank_swap_moves_its_state_off_a_dead_rnic0_on_the_testbed(
    healthy_dp_megatron: RunResult,
) -> None:
    """PP 2 x DP 2 on the namespace testbed, the tiny megatron GPT over delegates: host 1's
    rnic0 is down from the start, and in iteration 2 its worker trades places with host 2's
    (a fixed plan's swap). The movers' model state went over the process group, which gloo
    binds to rnic0: the swap waited the whole timeout and the run restarted. Over the NIC the
    delegates' rules pick (rnic1 here), the swap is made once, nothing restarts, and training
    goes on as the healthy run's without a swap: the same losses and parameters."""
    fixed = fixed_plan(one_f_one_b(DP_MEGATRON), DP_MEGATRON, "delegated").fixed
    swapped = Topology(2, 2).dp_pair_onto_pp(Link.parse("dp0:0-1"))

    class _SwapAtTwo:
        name = "swap"

        def plan(self, iteration: int) -> Plan:
            return dataclasses.replace(fixed, topology=swapped if iteration >= 2 else None)

        def observe(self, iteration: int, timeline: Timeline) -> None:
            pass

        def restarted(self, iteration: int, *, stragglers: bool, at_ms: float = math.inf) -> None:
            pass

    faults = parse_yaml('[{start_iteration: 0, nic: "host1:rnic0", down: true}]')
    result = _on_testbed(DP_MEGATRON, _SwapAtTwo(), faults, 4, model="tiny", transport_timeout_s=10)
    assert (result.restarts, result.lost_iterations) == (0, 0)
    assert result.timeline is not None
    swaps = result.timeline.swaps
    assert {(s.iteration, s.stage_from, s.replica_from) for s in swaps} == {(2, 1, 0), (2, 0, 1)}
    assert all(s.num_bytes > 0 for s in swaps)
    assert len(result.losses) == 4 and result.losses == healthy_dp_megatron.losses
    assert result.params_sha256 == healthy_dp_megatron.params_sha256 != ""


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root"
)
def test_rnic0_of_a_dp_ring_host_down_on_the_testbed_moves_its_ring_too() -> None:
    """PP 4 x DP 2 on the namespace testbed (a host per worker), Adaptra over delegates: rnic0
    of host 5 (stage 1 of replica 1) goes down 8 ms into iteration 2. Its PP link directions
    and stage 1's DP ring with replica 0 move to rnic1 (its own senders by netlink, the far
    ones by their receivers' notices), the emulated all-reduce goes on there, nothing is
    restarted, and host 5's traffic after the failure leaves by rnic1. The NIC is repaired
    5 ms into iteration 4: it is up again when the run ends."""
    from harness.loop import run_loop
    from harness.network import network_engine

    profile = Profile.uniform(
        4, 4, 2, 2, 2, message_bytes=1 << 16, num_delegates=2, num_replicas=2,
        allreduce_bytes=1 << 18, dp_bucket_bytes=1 << 16,
    )  # fmt: skip
    faults = parse_yaml(
        '[{start_iteration: 2, at_ms: 8, nic: "host5:rnic0", down: true},'
        ' {start_iteration: 4, at_ms: 5, nic: "host5:rnic0", delay_ms: 0}]'
    )
    with network_engine(profile, delegated=True) as engine:
        bed = engine.bed  # type: ignore[attr-defined]
        names = {bed.switch, *bed.hosts}
        before = bed.bytes_sent(5)
        result = run_loop(
            engine,
            system_controller("adaptra-oracle", profile, faults),
            num_iterations=5,
            num_warmup_iterations=1,
            faults=faults,
        )
        after = bed.bytes_sent(5)
        rnic0 = subprocess.run(
            ["ip", "-n", bed.hosts[5], "-o", "link", "show", "rnic0"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    assert "state UP" in rnic0 or ",UP" in rnic0, rnic0
    # Down 8 ms into fault iteration 2 (engine iteration 3), up 5 ms into 4 (engine's 5).
    changes = [(c.iteration, c.host, c.plane, c.up) for c in engine.nic_changes]
    assert changes == [(3, 5, 0, False), (5, 5, 0, True)]
    assert all(c.at_ms >= at_ms for c, at_ms in zip(engine.nic_changes, (8.0, 5.0), strict=True))
    assert not names & set(_namespaces())
    assert (result.restarts, result.lost_iterations) == (0, 0)
    assert result.iterations == tuple(range(5))
    timeline = result.timeline
    assert timeline is not None
    _delivered_once(timeline, profile, 6)
    # Every record, by direction (D=2 delegates each): host 5's own senders hear netlink;
    # their receivers there tell the far senders over the management plane (else TCP's user
    # timeout would, seconds later). In either, a delegate of the same worker that moved
    # first may tell its sibling before it heard (under load its move may come first).
    causes: dict[tuple[str, str, int], list[str]] = {}
    for f in timeline.failovers:
        causes.setdefault((f.link, f.direction, f.replica), []).append(f.cause)
    sends = {("0-1", "backward", 1), ("1-2", "forward", 1), ("dp1:0-1", "backward", 1)}
    receives = {("0-1", "forward", 1), ("1-2", "backward", 1), ("dp1:0-1", "forward", 0)}
    assert set(causes) == sends | receives, causes
    for direction in sends:
        assert set(causes[direction]) <= {"link state", "sibling"}, (direction, causes)
        assert "link state" in causes[direction], (direction, causes)
    for direction in receives:
        assert set(causes[direction]) <= {"notice", "sibling", "timeout"}, (direction, causes)
        assert set(causes[direction]) != {"sibling"}, (direction, causes)
    assert len(timeline.failovers) == 2 * len(causes)  # each delegate once
    assert len({f.carrier_pid for f in timeline.failovers}) == len(timeline.failovers)
    # Per iteration host 5 sends 4 x 64 KiB on each PP link and 256 KiB of all-reduce
    # chunks: at least the two iterations after the failure's, whole, by rnic1.
    sent = {name: after[name] - before[name] for name in after}
    assert sent["rnic1"] >= 2 * (2 * 4 * (1 << 16) + (1 << 18))
    assert sent["mgmt"] < 0.01 * sent["rnic1"]


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root"
)
def test_a_link_direction_that_failed_over_keeps_the_profiles_delay() -> None:
    """The profile's 20 ms on link 0-1 is the link's, on both of a host's NICs: after rnic0
    of host 1 goes down, the messages that moved to rnic1 still take 20 ms on the wire."""

    profile = Profile.uniform(2, 4, 1, 1, 1, delay_ms=[20], message_bytes=4096, num_delegates=2)
    faults = parse_yaml('[{start_iteration: 1, at_ms: 5, nic: "host1:rnic0", down: true}]')
    controller = system_controller("adaptra-oracle", profile, faults)
    result = _on_testbed(profile, controller, faults, 3, longest_hold_ms=20)
    assert (result.restarts, result.lost_iterations) == (0, 0)
    timeline = result.timeline
    assert timeline is not None
    # A move is the iteration's its trainer learns of it in: the fault's (run iteration 2),
    # or the next where a delegate (one with nothing to carry) heard netlink after its
    # trainer's last look (load can delay it).
    assert {f.iteration for f in timeline.failovers} <= {2, 3}
    after = [m for m in timeline.messages if m.iteration >= 3]  # all on rnic1
    assert len(after) == 2 * 4 and all(m.fault_ms == 0.0 for m in after)  # the workers: none
    assert min(m.arrival_ms - m.wire_start_ms for m in after) >= 20.0


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root"
)
def test_a_sender_delegate_with_no_nic_left_fails_its_iteration_at_once() -> None:
    """On the testbed rnic0 and rnic1 of host 1 go down as iteration 1 begins (the network
    takes them down; no hook says so). Host 1's sender delegates find no NIC left while
    their trainer waits on a message from host 0: the iteration ends with their
    `LinkFailure`, not with that wait's timeout (60 s here), and not the testbed's reading
    of a timeout as a failure; at the time it was noticed, measured."""
    from harness.network import network_engine

    profile = Profile.uniform(2, 4, 1, 1, 1, message_bytes=4096, num_delegates=2)
    faults = parse_yaml(
        '[{start_iteration: 1, nic: "host1:rnic0", down: true},'
        ' {start_iteration: 1, nic: "host1:rnic1", down: true}]'
    )
    controller = system_controller("adaptra-oracle", profile, faults)
    with network_engine(profile, delegated=True) as engine:
        for k in range(2):
            plan = controller.plan(k)
            topology = plan.topology or plan.profile.topology
            if k == 0:
                engine.run(plan, k, faults.at(k, topology, rates=NO_RATES))
                continue
            with pytest.raises(LinkFailure) as info:
                engine.run(plan, k, faults.at(k, topology, rates=NO_RATES))
    assert isinstance(info.value.__cause__, WorkerLinkFailure)
    assert "could not reach its receiver over any NIC" in str(info.value)
    # When, as measured: the restart's modelled cost counts it (it was None, counted 0).
    assert info.value.at_ms is not None and info.value.at_ms > 0.0


class _FailsAt:
    """A controller that plans as `inner` until it raises at `iteration`: a run that fails."""

    def __init__(self, inner: Controller, iteration: int) -> None:
        self.inner, self.iteration, self.name = inner, iteration, inner.name

    def plan(self, iteration: int) -> Plan:
        if iteration == self.iteration:
            raise RuntimeError(f"the controller failed at iteration {iteration}")
        return self.inner.plan(iteration)

    def observe(self, iteration: int, timeline: Timeline) -> None:
        self.inner.observe(iteration, timeline)

    def restarted(self, iteration: int, *, stragglers: bool, at_ms: float = math.inf) -> None:
        self.inner.restarted(iteration, stragglers=stragglers, at_ms=at_ms)


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root"
)
def test_a_run_that_fails_after_a_failover_leaves_nothing_behind() -> None:
    """rnic0 of host 1 goes down as iteration 1 begins and its delegates fail over; then the
    run itself fails (its controller raises at iteration 3). Nothing is left: no namespace,
    no worker, no delegate that carried a message or moved (the oracle's plans use 1 of the
    2 started per direction, for no delay: the idle ones move with their siblings)."""
    from harness.loop import run_loop
    from harness.network import network_engine

    profile = Profile.uniform(2, 4, 1, 1, 1, message_bytes=4096, num_delegates=2)
    faults = parse_yaml('[{start_iteration: 1, nic: "host1:rnic0", down: true}]')
    pids: set[int] = set()
    failovers: list[FailoverRecord] = []

    def seen(k: int, timeline: Timeline, measured: bool, same_as: int | None) -> None:
        pids.update(pid for record in timeline.iterations for pid in record.pids)
        pids.update(message.carrier_pid for message in timeline.messages)
        failovers.extend(timeline.failovers)

    engine = network_engine(profile, delegated=True)
    with pytest.raises(RuntimeError, match="failed at iteration 3"), engine as running:
        bed = running.bed  # type: ignore[attr-defined]
        names = {bed.switch, *bed.hosts}
        run_loop(
            running,
            _FailsAt(system_controller("adaptra-oracle", profile, faults), 3),
            num_iterations=5,
            num_warmup_iterations=1,
            faults=faults,
            on_iteration=seen,
        )
    assert not names & set(_namespaces())
    assert {(f.link, f.nic_from, f.nic_to) for f in failovers} == {("0-1", "rnic0", "rnic1")}
    moved = {f.carrier_pid for f in failovers}
    # every sender delegate moved; one per direction carried the messages
    assert len(moved) == 2 * 2 and len(moved & pids) == 2
    pids |= moved
    assert len(pids) == 2 + 2 * 2  # the workers and the four sender delegates
    assert not [pid for pid in pids if _alive(pid)]


def _sent_by(host: int, failover: FailoverRecord) -> bool:
    """Stage h sends gradients on link (h-1)-h and activations on link h-(h+1) (on the tied
    route "tied:0-3", stage 0 sends forward, stage 3 backward)."""
    first, second = (int(end) for end in failover.link.removeprefix("tied:").split("-"))
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
