"""The read-only fault views every engine gets (pipeline.faults)."""

import pickle

from pipeline.faults import NO_FAULTS, AfterWarmup, NoFaults
from pipeline.link_rates import NO_RATES
from pipeline.runtime.hooks import FaultViewHook, HookRoute


def test_no_faults_is_one_object_also_in_a_worker() -> None:
    """A worker gets its iteration's faults pickled; `NO_FAULTS` comes out as itself, so the
    runtime's hook knows it has no fault view and names no NIC (on the testbed the delegates'
    own failover decides: a hook naming rnic0 moved them back onto a dead NIC)."""
    shipped = pickle.loads(pickle.dumps(AfterWarmup(NO_FAULTS, 1)))
    assert pickle.loads(pickle.dumps(NoFaults())) is NO_FAULTS
    assert shipped.faults is NO_FAULTS and shipped.at(0, None, rates=NO_RATES) is NO_FAULTS  # type: ignore[arg-type]
    hook = pickle.loads(pickle.dumps(FaultViewHook({"0-1": 2.0}, NO_FAULTS)))
    assert hook.route("0-1", "forward", 0, "F", 0, 64, 1, 2) == HookRoute(None, 2.0)
