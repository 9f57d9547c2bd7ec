import dataclasses

from harness.policies import system_controller
from harness.runner import run_configuration
from injectors.fault_files import parse_yaml
from pipeline.profile import Profile
from pipeline.simulator import CommMode
from pipeline.topology import Link

DIRECT, DELEGATED = CommMode.DIRECT, CommMode.DELEGATED


def test_the_oracle_delegates_exactly_while_a_delay_or_a_failure_is_in_force() -> None:
    """A delay on link 1-2 in fault iterations 2 and 3, rnic0 of host 2 down from 5 on, 2
    warm-up iterations: the oracle's plans count the warm-up as the engines do (it once
    switched as many iterations early), and a failure keeps it on the delegates (they fail
    over; the direct path cannot) until a restart replaces the failed NIC."""
    profile = Profile.uniform(4, 4, 1, 1, 1, message_bytes=4096)
    faults = parse_yaml(
        '[{start_iteration: 2, end_iteration: 4, links: ["1-2"], delay_ms: 20},'
        ' {start_iteration: 5, nic: "host2:rnic0", down: true}]'
    )
    controller = system_controller("adaptra-oracle", profile, faults, num_warmup_iterations=2)
    assert [controller.plan(k).comm for k in range(2 + 7)] == [
        *(DIRECT,) * 4, DELEGATED, DELEGATED, DIRECT, DELEGATED, DELEGATED
    ]  # fmt: skip
    controller.restarted(2 + 6, stragglers=False)  # a checkpoint-restart there: the NIC replaced
    assert [controller.plan(k).comm for k in range(2 + 5, 2 + 9)] == [DIRECT] * 4
    controller = system_controller("adaptra-oracle", profile, faults, num_warmup_iterations=2)
    result = run_configuration(
        controller, backend="sim", num_iterations=4, num_warmup_iterations=2, faults=faults
    )
    assert result.comms == (DIRECT, DIRECT, DELEGATED, DELEGATED)


def test_the_oracle_knows_every_replica_s_links_the_rings_and_slow_nics() -> None:
    """It read replica 0's PP links alone: a slow link of replica 1, a slow DP ring link or
    a slow NIC left it on the direct path (382 ms, where the detector's Adaptra ran 164)."""
    profile = Profile.uniform(
        4, 8, 2, 2, 2, message_bytes=4096, num_delegates=3, num_replicas=2,
        allreduce_bytes=(8_000_000,) * 4, dp_bucket_bytes=2_000_000,
    )  # fmt: skip
    cases = {
        '[{start_iteration: 0, links: ["pp1:1-2"], delay_ms: 30}]': {"1-2": 30.0},
        '[{start_iteration: 0, links: ["dp1:0-1"], delay_ms: 30}]': {"dp1:0-1": 30.0},
        '[{start_iteration: 0, nic: "host5:rnic0", delay_ms: 30}]': {  # stage 1 of replica 1
            "0-1": 30.0, "1-2": 30.0, "dp1:0-1": 30.0,
        },
    }  # fmt: skip
    for rows, known in cases.items():
        faults = parse_yaml(rows)
        controller = system_controller("adaptra-oracle", profile, faults)
        plan = controller.plan(1)  # the first measured iteration
        assert plan.comm is DELEGATED and dict(plan.believed_ms) == known, rows
        assert controller.plan(0).comm is DIRECT  # the warm-up is healthy
    slow_replica_1 = parse_yaml('[{start_iteration: 0, links: ["pp1:1-2"], delay_ms: 30}]')
    controller = system_controller("adaptra-oracle", profile, slow_replica_1)
    run = run_configuration(controller, num_iterations=2, faults=slow_replica_1)
    assert run.iteration_times_ms == (164.0, 164.0)  # the detector's Adaptra settles there


def test_the_oracle_counts_the_profile_s_own_dp_delays_with_the_faults() -> None:
    """A spec scenario's DP delay is the profile's (`dp_delay_ms`), not a fault: the oracle
    once saw only the faults' DP delays and stayed direct under a 30 ms ring link, while it
    counted the profile's PP delays. Both kinds add up on one link."""
    base = Profile.uniform(
        4, 8, 2, 2, 2, message_bytes=4096, num_delegates=4, num_replicas=2,
        allreduce_bytes=750_000, dp_bucket_bytes=250_000,
    )  # fmt: skip
    static = dataclasses.replace(base, dp_delay_ms=((Link.parse("dp1:0-1"), 30.0),))
    plan = system_controller("adaptra-oracle", static).plan(3)
    assert plan.comm is DELEGATED and plan.believed_ms == (("dp1:0-1", 30.0),)
    faults = parse_yaml('[{start_iteration: 0, links: ["dp1:0-1"], delay_ms: 10}]')
    plan = system_controller("adaptra-oracle", static, faults).plan(3)
    assert plan.believed_ms == (("dp1:0-1", 40.0),)
    assert system_controller("adaptra-oracle", base).plan(3).comm is DIRECT


def test_the_oracle_repairs_what_the_loop_repairs_after_a_failure_in_an_iteration() -> None:
    """Two NICs down in one iteration, 0 and 15 ms into it: the restart after the first
    replaces that one only, and the oracle, told when, still plans for the second (it took
    both for repaired, where the loop's re-run meets the second)."""
    profile = Profile.uniform(4, 4, 1, 1, 1, message_bytes=4096)
    faults = parse_yaml(
        '[{start_iteration: 2, nic: "host1:rnic0", down: true},'
        ' {start_iteration: 2, at_ms: 15, nic: "host2:rnic0", down: true}]'
    )
    controller = system_controller("adaptra-oracle", profile, faults, num_warmup_iterations=0)
    assert controller.plan(2).comm is DELEGATED
    controller.restarted(2, stragglers=False, at_ms=0.0)
    assert controller.plan(2).comm is DELEGATED  # host2's rnic0 still fails in it
    controller.restarted(2, stragglers=False, at_ms=15.0)
    assert controller.plan(2).comm is DIRECT
