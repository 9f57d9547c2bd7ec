"""The per-iteration loop over the sim engine: reuse of identical iterations, streaming."""

import pytest

from baselines import zb_h2
from harness import loop
from harness.runner import fixed_plan, run_configuration
from injectors.fault_files import parse_yaml
from pipeline.metrics import Metrics, compute_metrics
from pipeline.profile import Profile
from pipeline.simulator import CommMode, simulate
from pipeline.timeline import Timeline

PROFILE = Profile.uniform(4, 8, 3, 2, 1, delay_ms=(0.0, 7.0, 0.0))


def test_identical_iterations_are_reused_and_equal_what_the_simulator_gives() -> None:
    faults = parse_yaml('[{start_iteration: 50, end_iteration: 60, links: ["0-1"], delay_ms: 9}]')
    run = run_configuration(
        fixed_plan(zb_h2(PROFILE), PROFILE), num_iterations=200, num_warmup_iterations=1,
        faults=faults,
    )  # fmt: skip
    # Computed: the warm-up (healthy), the first slow one (50) and the first healthy after (60).
    assert run.reused_iterations == 201 - 3
    assert run.timeline is not None
    healthy = simulate(zb_h2(PROFILE), PROFILE, CommMode.DIRECT)
    assert run.iteration_times_ms[0] == pytest.approx(healthy.iterations[0].end_ms, abs=1e-9)
    assert len(set(round(t, 9) for t in run.iteration_times_ms)) == 2
    # A moved iteration is renumbered and placed after the one before.
    last, before = run.timeline.iterations[-1], run.timeline.iterations[-2]
    assert last.iteration == 200 and last.start_ms == before.end_ms
    assert {r.iteration for r in run.timeline.ops if r.start_ms >= last.start_ms} == {200}


def test_metrics_are_computed_once_per_iteration_that_ran(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Measured iterations that repeat the warm-up take its metrics, computed once, as those
    that repeat a measured iteration do: 2 computations in 200 (the engine's iteration 0
    starts from an empty pipeline; 1, the second warm-up, is the steady state)."""
    calls: list[int] = []

    def counted(timeline: Timeline, iteration: int) -> Metrics:
        calls.append(iteration)
        return compute_metrics(timeline, iteration)

    monkeypatch.setattr(loop, "compute_metrics", counted)
    faults = parse_yaml('[{start_iteration: 50, end_iteration: 60, links: ["0-1"], delay_ms: 9}]')
    run = run_configuration(
        fixed_plan(zb_h2(PROFILE), PROFILE),
        num_iterations=200,
        num_warmup_iterations=2,
        faults=faults,
        keep_timeline=False,
    )
    assert calls == [2, 52]  # 2 repeats warm-up 1; 52 is the first slow one
    assert run.reused_iterations == 200 - 1
    steady = simulate(zb_h2(PROFILE), PROFILE, CommMode.DIRECT).iterations[0].end_ms
    assert run.iteration_times_ms[:50] == run.iteration_times_ms[60:110]
    assert len(set(run.iteration_times_ms[50:60])) == 1
    assert run.iteration_times_ms[50] > run.iteration_times_ms[0] == pytest.approx(steady)


def test_per_message_draws_are_never_reused() -> None:
    jitter = parse_yaml('[{start_iteration: 0, links: ["1-2"], delay_ms: 5, jitter_ms: 2}]')
    run = run_configuration(
        fixed_plan(zb_h2(PROFILE), PROFILE), num_iterations=20, faults=jitter, keep_timeline=False
    )
    assert run.reused_iterations == 0  # the warm-up is healthy; every later one draws anew
    assert len(set(run.iteration_times_ms)) > 15


def test_each_measured_iteration_counts_the_failovers_its_records_hold() -> None:
    """host2:rnic0 fails in measured iteration 2: the four link directions of stage 2
    (1-2 and 2-3, both ways) move their delegates to rnic1 then, and never again."""
    profile = Profile.uniform(4, 8, 10, 10, 10)
    faults = parse_yaml("[{start_iteration: 2, nic: 'host2:rnic0', down: true}]")
    run = run_configuration(
        fixed_plan(zb_h2(profile), profile, CommMode.DELEGATED),
        num_iterations=4, faults=faults, delegated=True,
    )  # fmt: skip
    assert run.num_failovers == (0, 0, 4, 0)
    assert run.timeline is not None
    # The timeline numbers iterations as run: the warm-up is its 0.
    moved = sorted((f.iteration, f.link, f.direction, f.nic_to) for f in run.timeline.failovers)
    assert moved == [
        (3, "1-2", "backward", "rnic1"),
        (3, "1-2", "forward", "rnic1"),
        (3, "2-3", "backward", "rnic1"),
        (3, "2-3", "forward", "rnic1"),
    ]
