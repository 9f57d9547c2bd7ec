"""The runtime engine over real worker processes: how its failures reach the loop."""

import time

import pytest

from baselines import one_f_one_b
from injectors.fault_files import parse_yaml
from pipeline.engines import Plan
from pipeline.engines.runtime import emulated_engine
from pipeline.errors import LinkFailure
from pipeline.faults import NO_FAULTS
from pipeline.profile import Profile
from pipeline.runtime import WorkerTimeout
from pipeline.topology import Topology

pytestmark = pytest.mark.multiprocess

PROFILE = Profile.uniform(2, 2, 5, 5, 5)
PLAN = Plan(one_f_one_b(PROFILE), PROFILE)


def test_a_link_failure_says_how_far_into_its_iteration_the_message_went() -> None:
    """As the simulator's does: the loop counts that time in the restart's cost."""
    down = parse_yaml('[{start_iteration: 0, links: ["0-1"], down: true}]').at(0, Topology(2))
    with emulated_engine(2, timeout_s=20) as engine:
        started = time.monotonic()
        with pytest.raises(LinkFailure) as info:
            engine.run(PLAN, 0, down)
        took_ms = (time.monotonic() - started) * 1000.0
    assert info.value.at_ms is not None
    assert 5.0 <= info.value.at_ms < took_ms  # after F0 (5 ms), before the engine heard


def test_after_a_timeout_the_next_iteration_runs_on_a_fresh_pool() -> None:
    # 10 s on every message against a 3 s wait: a timeout whatever the load (and 3 s is
    # ample for a healthy 5 ms op's message on a fresh pool).
    slow = parse_yaml('[{start_iteration: 0, links: ["0-1"], delay_ms: 10000}]').at(0, Topology(2))
    with emulated_engine(2, timeout_s=3) as engine:
        with pytest.raises(WorkerTimeout):
            engine.run(PLAN, 0, slow)
        timeline = engine.run(PLAN, 1, NO_FAULTS).timeline
    assert len(timeline.ops) == sum(len(ops) for ops in PLAN.schedule.stages)
    assert {r.iteration for r in timeline.ops} == {1}
