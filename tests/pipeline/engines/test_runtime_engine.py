"""The runtime engine over real worker processes: how its failures reach the loop."""

import dataclasses
import re
import signal
import time
from pathlib import Path

import pytest
import torch

from adaptra.transport import Delegates
from baselines import one_f_one_b
from injectors.fault_files import parse_yaml
from pipeline.engines import Plan
from pipeline.engines.runtime import RuntimeEngine, emulated_engine, megatron_engine
from pipeline.engines.sim import SimEngine
from pipeline.errors import ConfigError, LinkFailure
from pipeline.faults import NO_FAULTS
from pipeline.link_rates import NO_RATES
from pipeline.ops import OpKind
from pipeline.profile import Profile
from pipeline.runtime import EmulatedCompute, WorkerTimeout
from pipeline.runtime import pool as pool_module
from pipeline.simulator import CommMode
from pipeline.timeline import Timeline
from pipeline.topology import Link, Position, Topology
from tests.pipeline.runtime.test_pool import fresh_tries, interrupt_the_first_join

pytestmark = pytest.mark.multiprocess

PROFILE = Profile.uniform(2, 2, 5, 5, 5)
PLAN = Plan(one_f_one_b(PROFILE), PROFILE)


def test_a_link_failure_says_how_far_into_its_iteration_the_message_went() -> None:
    """As the simulator's does: the loop counts that time in the restart's cost."""
    down = parse_yaml('[{start_iteration: 0, links: ["0-1"], down: true}]').at(
        0, Topology(2), rates=NO_RATES
    )
    with emulated_engine(2, timeout_s=20) as engine:
        started = time.monotonic()
        with pytest.raises(LinkFailure) as info:
            engine.run(PLAN, 0, down)
        took_ms = (time.monotonic() - started) * 1000.0
    assert info.value.at_ms is not None
    assert 5.0 <= info.value.at_ms < took_ms  # after F0 (5 ms), before the engine heard


class _NoNicLeft(EmulatedCompute):
    """The last stage's first backward op raises a `LinkFailure` without `at_ms` (as the
    delegates' "could not reach its receiver over any NIC" does), saying when (monotonic s)."""

    def run(
        self, kind: OpKind, microbatch: int, inputs: torch.Tensor | None, profile: Profile
    ) -> torch.Tensor | None:
        if self._stage == 1 and kind in (OpKind.B, OpKind.BW):
            raise LinkFailure(f"no NIC left, raised at {time.monotonic()!r}")
        return super().run(kind, microbatch, inputs, profile)


def test_a_link_failure_without_its_own_time_is_timed_before_the_pool_closes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its `at_ms` is when the pool heard of it: it was taken once the failed pool had
    closed, which terminates the workers still inside the iteration (up to 2 s more), and
    the loop charges it as the time the failed iteration lost."""
    closes: list[float] = []
    real_join = pool_module._join

    def timed_join(processes: list, limit_s: float) -> None:
        closes.append(time.monotonic())
        real_join(processes, limit_s)

    starts: list[float] = []
    engine = RuntimeEngine(
        "fails", 2, compute_factory=_NoNicLeft, timeout_s=20, on_start=starts.append
    )
    with engine:
        monkeypatch.setattr(pool_module, "_join", timed_join)
        with pytest.raises(LinkFailure) as info:
            engine.run(PLAN, 0, NO_FAULTS)
        monkeypatch.undo()
    found = re.search(r"raised at ([0-9.]+)", str(info.value))
    assert found is not None and info.value.at_ms is not None
    raised_ms = (float(found[1]) - starts[-1]) * 1000.0
    close_ms = (closes[0] - starts[-1]) * 1000.0  # the failed pool's close began
    assert raised_ms <= info.value.at_ms <= close_ms


def test_after_a_timeout_the_next_iteration_runs_on_a_fresh_pool() -> None:
    # 10 s on every message against a 3 s wait: a timeout whatever the load. A healthy 5 ms
    # op's message comes well within 3 s on a fresh pool, unless a loaded host holds its
    # sender longer: that rank's own wait timing out is a timeout too, after which the next
    # try runs on a fresh pool again (what is tested), up to 3 tries.
    slow = parse_yaml('[{start_iteration: 0, links: ["0-1"], delay_ms: 10000}]').at(
        0, Topology(2), rates=NO_RATES
    )
    with emulated_engine(2, timeout_s=3) as engine:
        with pytest.raises(WorkerTimeout):
            engine.run(PLAN, 0, slow)
        for attempt in fresh_tries():
            with attempt:
                timeline = engine.run(PLAN, 1, NO_FAULTS).timeline
    assert len(timeline.ops) == sum(len(ops) for ops in PLAN.schedule.stages)
    assert {r.iteration for r in timeline.ops} == {1}


def test_a_new_run_on_a_reused_engine_starts_on_the_default_placement_as_in_sim() -> None:
    """A run ends on a swapped placement (DP link dp0:0-1 moved onto a PP edge); the next
    run's iteration 0 on the default plan swaps nothing, in the runtime engine as in the
    simulator's (it swapped back: 2 records, against none), its workers back in their
    default places before it, untimed; a run whose iteration 0 is on the swapped placement
    swaps there as on a fresh engine, moving no state."""
    profile = Profile.uniform(2, 4, 1, 1, 1, num_replicas=2, allreduce_bytes=4096)
    plain = Plan(one_f_one_b(profile), profile, CommMode.DIRECT)
    swapped = dataclasses.replace(
        plain, topology=Topology(2, 2).dp_pair_onto_pp(Link.parse("dp0:0-1"))
    )
    runs = [(plain, 0), (swapped, 1), (plain, 0), (swapped, 0), (plain, 0)]

    def moves(timeline: Timeline) -> list[tuple[int, ...]]:
        return sorted(
            (r.iteration, r.stage_from, r.replica_from, r.stage_to, r.replica_to)
            for r in timeline.swaps
        )

    sim = SimEngine()
    expected = [moves(sim.run(plan, iteration, NO_FAULTS).timeline) for plan, iteration in runs]
    assert [len(m) for m in expected] == [0, 2, 0, 2, 0]
    with emulated_engine(2, num_replicas=2, timeout_s=20) as engine:
        timelines = [engine.run(plan, i, NO_FAULTS).timeline for plan, i in runs]
        pids = tuple(engine.pids)
    assert [moves(t) for t in timelines] == expected
    assert timelines[3].swaps and {r.num_bytes for r in timelines[3].swaps} == {0}
    assert [t.iterations[0].pids == pids for t in timelines] == [True, False, True, False, True]


def test_a_rank_swap_s_new_delegates_start_on_the_first_nic_up_as_in_sim() -> None:
    """rnic0 of host 1 down until iteration 3, 3 ms on its rnic1: link 0-1 moves to rnic1 in
    iteration 0; a swap of the two stages' workers in iteration 2 gives both directions new
    delegates, which start on rnic1 (past the route the fault view has failed, as the
    testbed's pass a NIC down) and stay there after rnic0's repair, as in the simulator.
    With hook injection they started on rnic0 and moved again (a failover per direction
    the testbed never recorded)."""
    profile = Profile.uniform(2, 2, 1, 1, 1, message_bytes=4096, num_delegates=1)
    plain = Plan(one_f_one_b(profile), profile, CommMode.DELEGATED)
    swapped = dataclasses.replace(
        plain, topology=profile.topology.swapped(Position(0, 0), Position(1, 0))
    )
    view = parse_yaml(
        '[{start_iteration: 0, end_iteration: 3, nic: "host1:rnic0", down: true},'
        ' {start_iteration: 0, nic: "host1:rnic1", delay_ms: 3}]'
    )
    runs = [(plain, 0), (plain, 1), (swapped, 2), (swapped, 3)]

    def seen(engine: SimEngine | RuntimeEngine, plan: Plan, k: int) -> tuple[set, set]:  # type: ignore[type-arg]
        faults = view.at(k, plan.topology or profile.topology, rates=NO_RATES)
        timeline = engine.run(plan, k, faults).timeline
        moves = {(f.link, f.direction, f.nic_from, f.nic_to) for f in timeline.failovers}
        return moves, {m.fault_ms for m in timeline.messages}

    sim = SimEngine()
    expected = [seen(sim, plan, k) for plan, k in runs]
    moved = {("0-1", d, "rnic0", "rnic1") for d in ("forward", "backward")}
    assert expected == [(moved, {3.0}), (set(), {3.0}), (set(), {3.0}), (set(), {3.0})]
    with emulated_engine(2, timeout_s=20, delegates=Delegates()) as engine:
        assert [seen(engine, plan, k) for plan, k in runs] == expected


def test_a_nic_failing_just_after_a_swap_s_start_moves_its_new_pairs_as_in_sim() -> None:
    """rnic0 of host 1 fails 0.05 ms into the iteration that swaps the two stages' workers:
    the new pairs start on rnic0, up when the iteration (and its swap) started, and move at
    their first message, in the simulator and with hook injection alike (the hook asked by
    each worker's clock, some ms into the swap, and started them on rnic1: no move)."""
    profile = Profile.uniform(2, 2, 1, 1, 1, message_bytes=4096, num_delegates=1)
    plain = Plan(one_f_one_b(profile), profile, CommMode.DELEGATED)
    swapped = dataclasses.replace(
        plain, topology=profile.topology.swapped(Position(0, 0), Position(1, 0))
    )
    view = parse_yaml('[{start_iteration: 1, at_ms: 0.05, nic: "host1:rnic0", down: true}]')
    runs = [(plain, 0), (swapped, 1)]

    def moves(engine: SimEngine | RuntimeEngine, plan: Plan, k: int) -> set[tuple[str, ...]]:
        faults = view.at(k, plan.topology or profile.topology, rates=NO_RATES)
        timeline = engine.run(plan, k, faults).timeline
        return {(f.link, f.direction, f.nic_from, f.nic_to) for f in timeline.failovers}

    sim = SimEngine()
    expected = [moves(sim, plan, k) for plan, k in runs]
    assert expected == [set(), {("0-1", d, "rnic0", "rnic1") for d in ("forward", "backward")}]
    with emulated_engine(2, timeout_s=20, delegates=Delegates()) as engine:
        assert [moves(engine, plan, k) for plan, k in runs] == expected


def _delegated_plans(*counts: int) -> list[Plan]:
    profiles = [dataclasses.replace(PROFILE, num_delegates=n) for n in counts]
    return [Plan(one_f_one_b(p), p, CommMode.DELEGATED) for p in profiles]


def test_an_emulated_engine_restarts_its_pool_for_a_new_delegate_count() -> None:
    """No state in its workers: a fresh pool, with 2 delegates per link direction and side."""
    one, two = _delegated_plans(1, 2)
    with emulated_engine(2, timeout_s=20, delegates=Delegates()) as engine:
        engine.run(one, 0, NO_FAULTS)
        before = engine.pids
        engine.run(two, 1, NO_FAULTS)
        assert set(engine.pids).isdisjoint(before)
        assert [len(pids) for pids in engine.delegate_pids] == [2 * 2, 2 * 2]


def test_a_plan_using_fewer_delegates_than_started_runs_on_the_same_pool() -> None:
    """3 delegates started per link direction and side (the profile's count); a plan that
    uses 1, then 2 of them (`Plan.num_delegates`, Adaptra's detected share) runs on the same
    workers and delegates, its messages carried by the first so many of each direction's
    senders only; all 3 again without one."""
    profile = Profile.uniform(2, 4, 5, 5, 5, num_delegates=3)
    three = Plan(one_f_one_b(profile), profile, CommMode.DELEGATED)
    with emulated_engine(2, timeout_s=20, delegates=Delegates()) as engine:
        carriers = []
        for k, used in enumerate([None, 1, 2, None]):
            plan = dataclasses.replace(three, num_delegates=used)
            timeline = engine.run(plan, k, NO_FAULTS).timeline
            carriers.append({m.carrier_pid for m in timeline.messages})
            if k == 0:
                pids, delegates = engine.pids, engine.delegate_pids
            assert (engine.pids, engine.delegate_pids) == (pids, delegates)
    started = {pid for per_rank in delegates for pid in per_rank}  # senders and receivers
    assert [len(c) for c in carriers] == [6, 2, 4, 6]  # per direction: 3, 1, 2, 3
    assert all(c <= started for c in carriers)
    assert carriers[1] < carriers[2] < carriers[0] == carriers[3]


def test_a_plan_may_not_use_more_delegates_than_started() -> None:
    profile = Profile.uniform(2, 4, 5, 5, 5, num_delegates=3)
    three = Plan(one_f_one_b(profile), profile, CommMode.DELEGATED)
    assert dataclasses.replace(three, num_delegates=2).iteration_profile().num_delegates == 2
    assert three.iteration_profile() is three.profile
    with pytest.raises(
        ConfigError, match=r"num_delegates \(4\) must be at most the delegates started \(3"
    ):
        dataclasses.replace(three, num_delegates=4)
    with pytest.raises(ConfigError, match="num_delegates"):
        dataclasses.replace(three, num_delegates=0)


def test_a_training_engine_refuses_a_new_delegate_count_mid_run() -> None:
    """Megatron's workers hold the model: a fresh pool at iteration 2 would start from the
    initial weights again. Refused, the run goes on on its pool (the loss falls on: the same
    data every iteration); a new run (iteration 0) may take the other count, and starts from
    the initial weights as the first one did."""
    pytest.importorskip("megatron.core", reason="the megatron backend needs megatron-core")
    one, two = _delegated_plans(1, 2)
    with megatron_engine(2, "tiny", timeout_s=60, delegates=Delegates()) as engine:
        losses = [engine.run(one, k, NO_FAULTS).loss for k in range(2)]
        pids = engine.pids
        refused = "the megatron engine cannot change the delegate count from 1 to 2 at iteration 2"
        with pytest.raises(ConfigError, match=f"^{refused}: "):
            engine.run(two, 2, NO_FAULTS)
        assert engine.pids == pids
        losses.append(engine.run(one, 2, NO_FAULTS).loss)
        first_again = engine.run(two, 0, NO_FAULTS).loss
    falling = [loss for loss in losses if loss is not None]
    assert len(falling) == 3 and falling[0] > falling[1] > falling[2]
    assert first_again == falling[0]


def test_a_signal_while_the_pool_closes_still_removes_the_checkpoints(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pool holds a shutdown signal while it stops its workers and raises it once it is
    closed, inside the engine's close: the engine's checkpoints' folder (megatron: every
    stage's state) stayed behind."""
    engine = RuntimeEngine("saves", 2, trains=True, timeout_s=20)  # a training engine saves
    try:
        engine.run(PLAN, 0, NO_FAULTS, checkpoint=True)
        assert engine._checkpoints is not None
        folder = Path(engine._checkpoints)
        assert folder.is_dir()
        joins = interrupt_the_first_join(monkeypatch)
        # Python's own SIGINT handler (a pytest-xdist worker starts with SIGINT ignored).
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            with pytest.raises(KeyboardInterrupt):
                engine.close()
        finally:
            signal.signal(signal.SIGINT, previous)
        assert joins  # interrupted inside the pool's close
        assert not folder.exists()
    finally:
        monkeypatch.undo()
        engine.close()  # what a failed test left


def test_after_an_error_that_closed_the_pool_the_next_run_starts_a_fresh_one() -> None:
    """An error that is no worker's (here the testbed's change at the iteration's start, an
    `on_start` that raises) closes the pool as a worker's does: the engine's next run starts
    a fresh pool, as after a `WorkerError` (it took the closed pool for a running one: "the
    worker pool is not running")."""
    starts: list[float] = []

    def on_start(start_at: float) -> None:
        starts.append(start_at)
        if len(starts) == 1:
            raise OSError("the testbed's change could not go out")

    with emulated_engine(2, timeout_s=20, on_start=on_start) as engine:
        with pytest.raises(OSError, match="could not go out"):
            engine.run(PLAN, 0, NO_FAULTS)
        timeline = engine.run(PLAN, 0, NO_FAULTS).timeline
    assert len(timeline.ops) == sum(len(ops) for ops in PLAN.schedule.stages)
    assert len(starts) == 2
