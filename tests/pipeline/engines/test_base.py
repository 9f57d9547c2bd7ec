from baselines import one_f_one_b
from pipeline.engines import Plan
from pipeline.profile import Profile
from pipeline.simulator import CommMode, LinkComm
from pipeline.topology import Link

PROFILE = Profile.uniform(3, 6, 1, 1, 1)


def _plan(comm: CommMode, *overrides: tuple[int, str, CommMode]) -> Plan:
    link_comms = tuple(LinkComm(Link.pp(i), direction, way) for i, direction, way in overrides)
    return Plan(one_f_one_b(PROFILE), PROFILE, comm, link_comms=link_comms)


def test_comm_by_link_is_the_plans_comm_where_nothing_overrides_it() -> None:
    assert _plan(CommMode.DELEGATED).comm_by_link() == {"0-1": "delegated", "1-2": "delegated"}
    assert _plan(CommMode.DIRECT).comm_by_link() == {"0-1": "direct", "1-2": "direct"}


def test_comm_by_link_is_direct_where_both_directions_override_delegated() -> None:
    plan = _plan(
        CommMode.DELEGATED, (0, "forward", CommMode.DIRECT), (0, "backward", CommMode.DIRECT)
    )
    assert plan.comm_by_link() == {"0-1": "direct", "1-2": "delegated"}


def test_comm_by_link_is_delegated_where_either_direction_is() -> None:
    one_left = _plan(CommMode.DELEGATED, (0, "forward", CommMode.DIRECT))
    assert one_left.comm_by_link() == {"0-1": "delegated", "1-2": "delegated"}
    one_on = _plan(CommMode.DIRECT, (1, "backward", CommMode.DELEGATED))
    assert one_on.comm_by_link() == {"0-1": "direct", "1-2": "delegated"}


def test_comm_by_link_takes_a_directions_last_override() -> None:
    plan = _plan(
        CommMode.DIRECT, (0, "forward", CommMode.DELEGATED), (0, "forward", CommMode.DIRECT)
    )
    assert plan.comm_by_link() == {"0-1": "direct", "1-2": "direct"}
