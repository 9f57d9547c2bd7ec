"""Link and NIC failures: every system is checkpoint-restarted by the harness (no failover
yet), in sim and in real worker processes alike. The scaled Table 3 trace runs in both
engines below (with ZB-H2 too in benchmarks/bench_restarts.py)."""

import dataclasses
import math
import tempfile
from pathlib import Path

import pytest

from baselines import one_f_one_b, zb_h2
from harness.loop import Recovery
from harness.runner import RuntimeEngines, fixed_plan, run_configuration
from injectors.fault_files import load_faults, parse_trace, parse_yaml
from pipeline.engines import Action, Plan
from pipeline.errors import ConfigError
from pipeline.profile import Profile
from pipeline.timeline import Timeline

PRESETS = Path(__file__).parents[2] / "harness" / "presets"


@pytest.mark.parametrize("build", [one_f_one_b, zb_h2])
def test_the_paper_trace_s_nic_failure_restarts_1f1b_and_zb_in_sim(build) -> None:
    """The whole Fig. 21 trace on 8 stages: the NIC failure at 1030 restarts the job from
    the checkpoint at 1000 (one every 500 iterations): 30 iterations run twice."""
    profile = Profile.uniform(8, 24, 10, 10, 10)
    result = run_configuration(
        fixed_plan(build(profile), profile),
        num_iterations=1200,
        num_warmup_iterations=0,
        faults=load_faults(PRESETS / "table3_trace.txt"),
        keep_timeline=False,
    )
    assert (result.restarts, result.lost_iterations) == (1, 30)
    assert result.iterations == tuple(range(1030)) + tuple(range(1000, 1200))
    # The failed iteration costs its time up to the failed message, and 10 min to notice.
    healthy_ms = min(result.iteration_times_ms)
    assert 600_000 < result.restart_model_ms < 600_000 + healthy_ms
    assert result.total_ms == pytest.approx(sum(result.wall_times_ms) + result.restart_model_ms)


@pytest.mark.multiprocess
def test_the_scaled_table3_trace_restarts_sim_and_emulated_alike() -> None:
    """table3_trace_s4.txt (its delays real sleeps in the emulated run), checkpoints every 50:
    the NIC failure at 103 restarts both engines once, and 100-102 run again; the emulated
    one closes its pool and starts a fresh one, and the failed hardware is replaced."""
    faults = load_faults(PRESETS / "table3_trace_s4.txt")
    profile = Profile.uniform(4, 4, 1, 1, 1, message_bytes=1024)
    runs = {
        backend: run_configuration(
            fixed_plan(one_f_one_b(profile), profile),
            backend=backend,
            num_iterations=120,
            num_warmup_iterations=1,
            faults=faults,
            recovery=Recovery(checkpoint_every=50, restart_ms=250.0),
            keep_timeline=False,
        )
        for backend in ("sim", "emulated")
    }
    sim, emulated = runs["sim"], runs["emulated"]
    assert (sim.restarts, sim.lost_iterations) == (emulated.restarts, emulated.lost_iterations)
    assert (sim.restarts, sim.lost_iterations) == (1, 3)
    assert emulated.iterations == sim.iterations == tuple(range(103)) + tuple(range(100, 120))
    assert emulated.restart_wall_ms > 0  # a fresh pool really started
    # The hook fails the send at once: no detection timeout, the configured restart cost.
    assert 250.0 <= emulated.restart_model_ms < 250.0 + max(emulated.iteration_times_ms)
    assert sim.restart_model_ms > 600_000
    # The trace's delays reach both engines: 50 ms on two links (34-40) is the slowest row.
    slowest = max(range(len(sim.iterations)), key=sim.iteration_times_ms.__getitem__)
    assert 34 <= sim.iterations[slowest] < 41
    # Microbatch 0's forward and backward cross both links: at least 4 x 50 ms (load only adds).
    assert sim.iteration_times_ms[34] >= 200 and min(emulated.iteration_times_ms[34:41]) >= 200


@pytest.mark.multiprocess
def test_megatron_resumes_from_its_checkpoint_and_trains_exactly_as_without_the_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PP 2 x DP 2: the DP ring of stage 1 fails in iteration 3, a checkpoint iteration, after
    stage 0's workers saved it; the run restarts from the checkpoint all of them wrote, after
    iteration 1 (the half-written one is no checkpoint: loaded, stage 0 was an iteration ahead
    of stage 1): fresh processes load it, iterations 2 and 3 run again, and the run ends with
    the same losses and the same parameter digest as a run that never failed. A third run on
    the same pool restarts before its first iteration: it starts again from the initial
    parameters, not from the failed run's last checkpoint (which it tried to load). The
    checkpoints' temporary folder is gone once the engines close."""
    pytest.importorskip("megatron.core", reason="the megatron backend needs megatron-core")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    profile = Profile.uniform(2, 4, 1, 1, 1, num_replicas=2)
    ring_down = '[{start_iteration: 3, end_iteration: 4, links: ["dp1:0-1"], down: true}]'
    with RuntimeEngines() as engines:  # one pool for both runs (a restart starts another)
        runs = {
            name: run_configuration(
                fixed_plan(one_f_one_b(profile), profile),
                backend="megatron",
                model="tiny",
                num_iterations=5,
                num_warmup_iterations=0,
                faults=faults,
                recovery=Recovery(checkpoint_every=2),
                keep_timeline=False,
                engines=engines,
            )
            for name, faults in (
                ("healthy", parse_trace("0;0_1;0")),
                ("failed", parse_yaml(ring_down)),
            )
        }
        plan = fixed_plan(one_f_one_b(profile), profile).fixed
        runs["restarted first"] = run_configuration(
            _RestartAt(plan, at=0),
            backend="megatron",
            model="tiny",
            num_iterations=5,
            num_warmup_iterations=0,
            recovery=Recovery(checkpoint_every=2),
            keep_timeline=False,
            engines=engines,
        )
    # (multiprocessing's own pymp-* folder stays until this process exits)
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith("pymp-")] == []
    healthy, failed = runs["healthy"], runs["failed"]
    assert (failed.restarts, failed.lost_iterations) == (1, 1)
    assert failed.iterations == (0, 1, 2, 2, 3, 4)
    assert failed.losses[:3] + failed.losses[4:] == pytest.approx(healthy.losses, rel=0, abs=0)
    assert failed.losses[3] == failed.losses[2]  # iteration 2 again, from the same state
    assert failed.params_sha256 == healthy.params_sha256 != ""
    first = runs["restarted first"]
    assert (first.restarts, first.iterations) == (1, tuple(range(5)))
    assert first.losses == pytest.approx(healthy.losses, rel=0, abs=0)
    assert first.params_sha256 == healthy.params_sha256


@dataclasses.dataclass
class _RestartAt:
    """A fixed plan that asks for one restart at iteration `at` (or `again` times there)."""

    plan_: Plan
    at: int
    again: int = 1
    name: str = "restarter"
    restarted_at: list[tuple[int, bool]] = dataclasses.field(default_factory=list)
    """(iteration, stragglers) of every `restarted`."""

    def plan(self, iteration: int) -> Plan:
        if iteration == self.at and len(self.restarted_at) < self.again:
            return dataclasses.replace(self.plan_, action=Action.RESTART)
        return self.plan_

    def observe(self, iteration: int, timeline: Timeline) -> None:
        pass

    def restarted(self, iteration: int, *, stragglers: bool, at_ms: float = math.inf) -> None:
        self.restarted_at.append((iteration, stragglers))


def test_a_restart_a_controller_asks_for_leaves_the_slow_link_out() -> None:
    """40 ms on link 0-1 from measured iteration 0; the controller asks for a restart before
    the run's iteration 3 (measured 2): the job comes back from its checkpoint (the end of the
    warm-up) on hardware without the slow link, and iterations 0-3 run again, healthy; the
    restart costs the configured 5 s."""
    profile = Profile.uniform(2, 4, 1, 1, 1)
    faults = parse_yaml('[{start_iteration: 0, links: ["0-1"], delay_ms: 40}]')
    controller = _RestartAt(fixed_plan(one_f_one_b(profile), profile).fixed, at=3)
    result = run_configuration(
        controller, num_iterations=4, faults=faults, recovery=Recovery(restart_ms=5000.0)
    )
    assert controller.restarted_at == [(3, True)]  # the slow hardware left out too
    assert (result.restarts, result.lost_iterations, result.restart_model_ms) == (1, 2, 5000.0)
    assert result.iterations == (0, 1, 0, 1, 2, 3)
    assert result.rerun_iterations == {0, 1}  # 2 had not run: its first run is after it
    slow, healthy = result.iteration_times_ms[0], result.iteration_times_ms[2]
    assert slow > healthy and result.iteration_times_ms[2:] == (healthy,) * 4


@pytest.mark.parametrize(
    ("checkpoint_every", "iterations", "rerun"),
    [(2, (0, 1, 2, 2, 3, 4, 5), {2, 3}), (1, (0, 1, 2, 3, 4, 5), {3})],
)
def test_the_iterations_run_again_after_a_failure_are_told(
    checkpoint_every: int, iterations: tuple[int, ...], rerun: set[int]
) -> None:
    """Link 0-1 down from measured iteration 3: it fails, and the job restarts from its last
    checkpoint. With one every 2 iterations, 2 is lost: 2 and 3 run again; with one every
    iteration nothing is lost (no iteration repeats) and 3 alone runs again. Either way, what
    is kept of 3 is its run after the restart, not the failed one."""
    profile = Profile.uniform(2, 4, 1, 1, 1)
    result = run_configuration(
        fixed_plan(one_f_one_b(profile), profile),
        num_iterations=6,
        faults=parse_yaml('[{start_iteration: 3, links: ["0-1"], down: true}]'),
        recovery=Recovery(checkpoint_every=checkpoint_every),
    )
    assert (result.restarts, result.iterations) == (1, iterations)
    assert result.rerun_iterations == rerun


def test_faults_that_start_in_the_iteration_a_restart_comes_before_still_happen() -> None:
    """40 ms on link 0-1 from measured iteration 0, replaced by 10 ms from measured 2, which
    also has the link down from 20 ms into it; the controller asks for a restart before
    measured 2: the restart leaves out the 40 ms (it started before), not what starts in
    measured 2, which has not run yet. Run again, measured 2 fails (a second restart, from
    the checkpoint at the end of the warm-up, the failed link replaced) and then runs, with
    measured 3, 10 ms a message slower than healthy."""
    profile = Profile.uniform(2, 4, 1, 1, 1)
    faults = parse_yaml(
        '[{start_iteration: 0, links: ["0-1"], delay_ms: 40},'
        ' {start_iteration: 2, links: ["0-1"], delay_ms: 10},'
        ' {start_iteration: 2, end_iteration: 3, links: ["0-1"], down: true, at_ms: 20}]'
    )
    controller = _RestartAt(fixed_plan(one_f_one_b(profile), profile).fixed, at=3)
    result = run_configuration(controller, num_iterations=4, faults=faults)
    assert controller.restarted_at == [(3, True), (3, False)]
    assert (result.restarts, result.lost_iterations) == (2, 4)
    assert result.restart_causes == (  # what `run` says of each, iterations as measured
        "controller restarter's request before iteration 2",
        "LinkFailure: iteration 2: the backward message of microbatch 1 on link pp0:0-1 cannot "
        "go: its link or a NIC on its route is down (27.000 ms into the iteration)",
    )
    assert result.iterations == (0, 1, 0, 1, 0, 1, 2, 3)
    assert result.iteration_times_ms == (215.0, 215.0, *(15.0,) * 4, 65.0, 65.0)
    # The first timeline iteration after each (the warm-up, then measured 0-1, ended before
    # the first; 0-1 again before the second), where its trace marks it
    assert result.restarted_before == (3, 5)
    assert result.timeline is not None
    assert [r.iteration for r in result.timeline.iterations[3:6]] == [1, 2, 1]


def test_a_restart_back_to_iteration_0_runs_it_again_later_on_the_sim_clock() -> None:
    """No warm-up, link 0-1 down in iteration 1: the job restarts from its start; iteration
    0 runs again after the first run of it on the clock (the run goes on), not over it."""
    profile = Profile.uniform(2, 4, 1, 1, 1)
    faults = parse_yaml('[{start_iteration: 1, end_iteration: 2, links: ["0-1"], down: true}]')
    result = run_configuration(
        fixed_plan(one_f_one_b(profile), profile),
        num_iterations=3,
        num_warmup_iterations=0,
        faults=faults,
        recovery=Recovery(checkpoint_every=5, restart_ms=10.0),
    )
    assert (result.restarts, result.iterations) == (1, (0, 0, 1, 2))
    assert result.timeline is not None
    spans = [(r.iteration, r.start_ms, r.end_ms) for r in result.timeline.iterations]
    assert spans == [(0, 0.0, 15.0), (0, 15.0, 30.0), (1, 30.0, 45.0), (2, 45.0, 60.0)]


@pytest.mark.parametrize(
    ("rows", "restarts", "model_ms"),
    [
        ('[{start_iteration: 2, links: ["2-3"], down: true, at_ms: 15}]', 1, 600_015.0),
        (
            '[{start_iteration: 2, links: ["0-1"], down: true},'
            ' {start_iteration: 2, links: ["2-3"], down: true, at_ms: 15}]',
            2,
            600_001.0 + 600_015.0,
        ),
    ],
)
def test_a_failure_later_in_the_failed_iteration_still_happens_after_the_restart(
    rows: str, restarts: int, model_ms: float
) -> None:
    """Link 2-3 down from 15 ms into measured iteration 2 fails its first message after
    that; with link 0-1 down from its start too, 0-1 fails first (1 ms in) and the restart
    replaces 0-1 only: iteration 2, run again, still meets 2-3's failure and restarts."""
    profile = Profile.uniform(4, 4, 1, 1, 1)
    result = run_configuration(
        fixed_plan(one_f_one_b(profile), profile),
        num_iterations=5,
        faults=parse_yaml(rows),
        recovery=Recovery(checkpoint_every=100),
    )
    assert (result.restarts, result.lost_iterations) == (restarts, 2 * restarts)
    assert result.iterations == (*(0, 1) * restarts, *range(5))
    assert result.restart_model_ms == model_ms


def test_a_restart_asked_for_in_the_warm_up_or_twice_in_a_row_is_refused() -> None:
    profile = Profile.uniform(2, 4, 1, 1, 1)
    plan = fixed_plan(one_f_one_b(profile), profile).fixed
    with pytest.raises(ConfigError, match="restart at iteration 0: in the warm-up"):
        run_configuration(_RestartAt(plan, at=0), num_iterations=2)
    with pytest.raises(ConfigError, match="again, before any iteration ran"):
        run_configuration(_RestartAt(plan, at=1, again=2), num_iterations=2)


def test_runs_share_a_pool_whatever_names_its_default_model() -> None:
    """The megatron engine's model defaults to "tiny": no model and "tiny" are one pool (they
    were two of the same); the emulated engine has no model."""
    with RuntimeEngines() as engines:
        assert engines.get("megatron", 2, None) is engines.get("megatron", 2, "tiny")
        assert engines.get("emulated", 2, None) is engines.get("emulated", 2, "tiny")
        assert engines.get("emulated", 2, None) is not engines.get("megatron", 2, None)


def test_a_swap_made_in_an_iteration_that_failed_is_counted_where_the_rerun_takes_it() -> None:
    """Adaptra swaps dp0:0-1's pair onto a PP edge at measured iteration 5, the iteration a
    NIC failure restarts; the rerun (from the checkpoint after the warm-up) plays the swapped
    placement. Its 2 moved workers were counted nowhere: the first iteration after a restart
    counted none, and the failed one records nothing."""
    from harness.policies import system_controller

    profile = Profile.uniform(
        4, 8, 10, 10, 10, message_bytes=1 << 20, num_replicas=2, allreduce_bytes=(4 << 20,) * 4
    )
    faults = parse_yaml(
        '[{start_iteration: 2, links: ["dp0:0-1"], delay_ms: 30},'
        ' {start_iteration: 5, at_ms: 2, end_iteration: 7, nic: "host1:rnic0", down: true}]'
    )
    result = run_configuration(
        system_controller("adaptra", profile, faults), num_iterations=9, faults=faults
    )
    assert result.restarts == 1
    moved = [(k, n) for k, n in zip(result.iterations, result.num_moved_workers, strict=True) if n]
    assert moved == [(0, 2)]  # the rerun's first iteration, where its workers take the swap
