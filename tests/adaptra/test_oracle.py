from harness.policies import system_controller
from harness.runner import run_configuration
from injectors.fault_files import parse_yaml
from pipeline.profile import Profile
from pipeline.simulator import CommMode

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
    controller.restarted(2 + 6)  # a checkpoint-restart there: the NIC replaced
    assert [controller.plan(k).comm for k in range(2 + 5, 2 + 9)] == [DIRECT] * 4
    controller = system_controller("adaptra-oracle", profile, faults, num_warmup_iterations=2)
    result = run_configuration(
        controller, backend="sim", num_iterations=4, num_warmup_iterations=2, faults=faults
    )
    assert result.comms == (DIRECT, DIRECT, DELEGATED, DELEGATED)
