"""The exact solver: the paper's Fig. 4/5 optima, warm starts, and brute force on tiny cases.

Brute force enumerates every op order per stage (at N=2 without assuming microbatch order), so
it checks the symmetry breaking and the memory model independently of their proofs.
"""

from __future__ import annotations

import functools
import itertools
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptra.bounds import iteration_lower_bound_ms
from adaptra.exact import (
    ExactModelError,
    ExactResult,
    rounded_to,
    solve_exact,
    solve_exact_deterministic,
)
from adaptra.scheduler import plan_adaptra
from pipeline.errors import DeadlockError, MemoryLimitError, ScheduleError
from pipeline.metrics import compute_metrics
from pipeline.ops import Op, OpKind
from pipeline.profile import Profile
from pipeline.schedule import Schedule, peak_memory, validate_schedule
from pipeline.simulator import CommMode, simulate
from tests.adaptra.worst_profiles import LATE_LAST_STAGE

FIG4_OPTIMUM = {0.0: 390.0, 20.0: 410.0, 30.0: 420.0, 40.0: 430.0}
REPO = Path(__file__).resolve().parents[2]


def fig4_profile(c0: float) -> Profile:
    return Profile.uniform(4, 12, 10, 10, 10, delay_ms=(c0, 0.0, 0.0))


def makespan(schedule: Schedule, profile: Profile) -> float:
    return compute_metrics(simulate(schedule, profile, CommMode.IDEAL)).iteration_time_ms


def check_result(result: ExactResult, profile: Profile) -> None:
    """Valid, re-simulated honestly, within memory, and never better than its own bound."""
    validate_schedule(result.schedule, profile.num_stages, profile.num_microbatches)
    assert result.iteration_time_ms == makespan(result.schedule, profile)
    assert result.lower_bound_ms <= result.iteration_time_ms + 1e-9
    if profile.mem_limit is not None:
        assert max(map(peak_memory, result.schedule.stages)) <= profile.mem_limit


def one_f_one_b_split(num_stages: int, n: int, warmup: list[int], lag: int) -> Schedule:
    """Warm-up forwards, then B, F pairs; each W runs `lag` B's after its own B."""
    stages = []
    for i in range(num_stages):
        ops = [Op(OpKind.F, m) for m in range(warmup[i])]
        for m in range(n):
            ops.append(Op(OpKind.B, m))
            if m >= lag:
                ops.append(Op(OpKind.W, m - lag))
            if m + warmup[i] < n:
                ops.append(Op(OpKind.F, m + warmup[i]))
        ops += [Op(OpKind.W, m) for m in range(max(0, n - lag), n)]
        stages.append(tuple(ops))
    return Schedule(tuple(stages))


def best_1f1b_split(profile: Profile) -> float:
    """The best of a family of 1F1B-split orders (warm-ups non-increasing) within memory."""
    s, n = profile.num_stages, profile.num_microbatches
    best = float("inf")
    for top in range(1, n + 1):
        for slope in (0, 1, 2):
            warmup = [max(1, min(n, top - slope * i)) for i in range(s)]
            for lag in (0, 1, 2):
                schedule = one_f_one_b_split(s, n, warmup, lag)
                peak = max(map(peak_memory, schedule.stages))
                if profile.mem_limit is None or peak <= profile.mem_limit:
                    best = min(best, makespan(schedule, profile))
    return best


@functools.cache
def stage_orders(n: int, ordered: bool) -> tuple[tuple[Op, ...], ...]:
    """Every order of F, B, W of n microbatches with F(m) < B(m) < W(m); `ordered` also
    keeps each kind in microbatch order (the solver's symmetry breaking, so only use it
    where the full enumeration is too large)."""
    ops = [Op(kind, m) for m in range(n) for kind in (OpKind.F, OpKind.B, OpKind.W)]
    orders = []
    for perm in itertools.permutations(ops):
        position = {op: k for k, op in enumerate(perm)}
        chained = all(
            position[ops[3 * m]] < position[ops[3 * m + 1]] < position[ops[3 * m + 2]]
            for m in range(n)
        )
        in_order = all(
            position[ops[3 * m + k]] < position[ops[3 * m + 3 + k]]
            for m in range(n - 1)
            for k in range(3)
        )
        if chained and (in_order or not ordered):
            orders.append(perm)
    return tuple(orders)


def brute_force(profile: Profile, ordered: bool) -> float:
    """The optimum over all valid orders within memory (tiny S and N only)."""
    orders = stage_orders(profile.num_microbatches, ordered)
    if profile.mem_limit is not None:
        orders = [o for o in orders if peak_memory(o) <= profile.mem_limit]
    best = float("inf")
    for combo in itertools.product(orders, repeat=profile.num_stages):
        try:
            best = min(best, makespan(Schedule(combo), profile))
        except DeadlockError:
            continue
    return best


@pytest.mark.parametrize("c0", sorted(FIG4_OPTIMUM))
def test_fig4_proven_optimum(c0: float) -> None:
    profile = fig4_profile(c0)
    result = solve_exact_deterministic(profile, deterministic_time_s=10)
    check_result(result, profile)
    assert result.optimal and result.status == "OPTIMAL" and result.exact_in_ms
    assert result.iteration_time_ms == FIG4_OPTIMUM[c0] == result.lower_bound_ms


@pytest.mark.parametrize("c0", [0.0, 10.0, 20.0, 30.0, 40.0])
def test_fig4_warm_start_never_worse(c0: float, fig4_fixture: dict[str, Any]) -> None:
    profile = fig4_profile(c0)
    warm = Schedule.from_dict(fig4_fixture)
    replay = makespan(warm, profile)
    assert replay == fig4_fixture["replay_ms_by_c0"][str(int(c0))]
    result = solve_exact_deterministic(profile, deterministic_time_s=10, warm_start=warm)
    check_result(result, profile)
    assert result.iteration_time_ms <= replay
    if c0 in FIG4_OPTIMUM:
        assert result.optimal and result.iteration_time_ms == FIG4_OPTIMUM[c0]


def test_solver_strictly_beats_its_warm_start(fig4_fixture: dict[str, Any]) -> None:
    profile = fig4_profile(40.0)
    warm = Schedule.from_dict(fig4_fixture)
    result = solve_exact_deterministic(profile, deterministic_time_s=10, warm_start=warm)
    assert makespan(warm, profile) == 560.0
    assert result.iteration_time_ms == 430.0 and result.optimal
    assert result.schedule != warm


@st.composite
def small_profiles(draw: st.DrawFn) -> Profile:
    num_stages = draw(st.integers(1, 3))
    n = draw(st.integers(num_stages, 6))
    times = st.lists(st.integers(1, 20), min_size=num_stages, max_size=num_stages)
    delays = st.lists(st.integers(0, 30), min_size=num_stages - 1, max_size=num_stages - 1)
    return Profile(
        num_stages=num_stages,
        num_microbatches=n,
        t_f_ms=tuple(map(float, draw(times))),
        t_b_ms=tuple(map(float, draw(times))),
        t_w_ms=tuple(map(float, draw(times))),
        delay_ms=tuple(map(float, draw(delays))),
        mem_limit=draw(st.sampled_from([None, None, 1.0, 1.5, 2.0, 3.0])),
    )


@settings(max_examples=40, deadline=None)
@given(small_profiles())
def test_random_small_profiles_optimal(profile: Profile) -> None:
    result = solve_exact_deterministic(profile, deterministic_time_s=5)
    check_result(result, profile)
    assert result.optimal
    assert result.iteration_time_ms == result.lower_bound_ms
    assert result.iteration_time_ms <= best_1f1b_split(profile)


@pytest.mark.parametrize(
    ("num_microbatches", "seed", "mem_limit"),
    [
        *((2, seed, mem) for seed, mem in enumerate([None, 1.0, 1.5, None, 1.0, 1.5])),
        *((3, seed, mem) for seed, mem in enumerate([None, 1.0, 1.5, 2.0], start=6)),
    ],
)
def test_matches_brute_force(num_microbatches: int, seed: int, mem_limit: float | None) -> None:
    """S=2, including zero-length ops (equal-time corner cases of the memory model). N=2
    enumerates every order; N=3 (40320 orders a stage) only microbatch-ordered ones."""
    rng = random.Random(seed)

    def times() -> tuple[float, float]:
        return float(rng.choice([0, 1, 2, 3, 5])), float(rng.choice([0, 1, 2, 3, 5]))

    profile = Profile(
        num_stages=2,
        num_microbatches=num_microbatches,
        t_f_ms=times(),
        t_b_ms=times(),
        t_w_ms=times(),
        delay_ms=(float(rng.randint(0, 4)),),
        mem_limit=mem_limit,
    )
    result = solve_exact_deterministic(profile, deterministic_time_s=5)
    check_result(result, profile)
    assert result.optimal
    optimum = brute_force(profile, ordered=num_microbatches > 2)
    assert result.iteration_time_ms == optimum == result.lower_bound_ms


def test_fused_warm_start_is_split_and_kept_if_better() -> None:
    """1F1B with BW ops as the warm start; with no time to search, its split form returns."""
    profile = Profile.uniform(3, 6, 3, 4, 2, delay_ms=(5.0, 1.0))
    split = one_f_one_b_split(3, 6, [3, 2, 1], lag=0)
    fused = Schedule(
        tuple(
            tuple(
                Op(OpKind.BW, m) if kind is OpKind.B else Op(kind, m)
                for kind, m in ops
                if kind is not OpKind.W
            )
            for ops in split.stages
        )
    )
    result = solve_exact(profile, time_limit_s=0.0, warm_start=fused)
    check_result(result, profile)
    assert all(op.kind is not OpKind.BW for ops in result.schedule.stages for op in ops)
    assert result.iteration_time_ms <= makespan(split, profile) <= makespan(fused, profile)
    if result.status == "UNKNOWN":  # nothing found in no time: the warm start, split
        assert result.schedule == split


def test_no_solution_in_time_is_an_actionable_error() -> None:
    with pytest.raises(ScheduleError, match="time_limit_s or pass a warm_start"):
        solve_exact(Profile.uniform(8, 32, 10, 10, 10, mem_limit=4.0), time_limit_s=0.0)


def test_warm_start_over_the_memory_limit_is_refused(fig4_fixture: dict[str, Any]) -> None:
    profile = Profile.uniform(4, 12, 10, 10, 10, mem_limit=3.0)
    with pytest.raises(MemoryLimitError, match="warm start"):
        solve_exact(profile, warm_start=Schedule.from_dict(fig4_fixture))


def test_fractional_times_scale_exactly_or_round() -> None:
    tenths = Profile.uniform(2, 3, 1.5, 2.25, 0.5, delay_ms=(0.1,))
    result = solve_exact_deterministic(tenths, deterministic_time_s=5)
    check_result(result, tenths)
    assert result.exact_in_ms and result.optimal
    assert result.iteration_time_ms == pytest.approx(result.lower_bound_ms)
    thirds = Profile.uniform(2, 3, 1 / 3, 1.0, 1.0)
    rounded = solve_exact(thirds, time_limit_s=5)
    check_result(rounded, thirds)
    assert not rounded.exact_in_ms


def test_times_past_an_hour_in_1_us_units_round_to_a_coarser_unit() -> None:
    """A delay of 3600.001 ms (or 360000.5, 1000000.25: a detector's estimate of a long
    delay has one decimal) scaled to 1 us units is more than an hour of them, which the
    scaled problem's profile refused: `--policy adaptra`, `milp` and `run --system adaptra`
    failed with "delay_ms[0] must be finite and in 0..3600000 ms, got 3600001.0", a value
    no input gave. The model rounds to the finest unit that holds them now; a transfer
    longer than an hour in whole ms is no model's: `milp` says so, `adaptra` plans without
    it."""
    for delay_ms, unit in ((3600.001, " to 10 us"), (360000.5, " to 1 ms"), (3600.5, "")):
        profile = Profile.uniform(2, 3, 1.0, 1.0, 1.0, delay_ms=(delay_ms,))
        result = solve_exact_deterministic(profile, deterministic_time_s=5)
        check_result(result, profile)
        assert rounded_to(result) == unit and result.optimal
    three = Profile.uniform(3, 6, 10.0, 10.0, 5.0, delay_ms=(1_000_000.25, 0.0))
    assert plan_adaptra(three).method == "alg2+generator+search+cp-sat optimal to 1 ms"
    longest = Profile.uniform(2, 3, 1.0, 1.0, 1.0, delay_ms=(3_600_000.0,), link_latency_ms=1)
    with pytest.raises(ExactModelError, match="a link's transfer .* of 3600001 ms is longer"):
        solve_exact(longest, time_limit_s=5)
    assert "cp-sat" not in plan_adaptra(longest).method


def test_the_deterministic_solve_gives_the_same_schedule_every_time() -> None:
    # Warm-started as `plan_adaptra` does, 2 workers within 1 s of wall clock reached this
    # optimum by different schedules from run to run (2 in 5 runs; 5 in 5 within 0.5 s).
    profile = Profile(
        num_stages=4, num_microbatches=12, t_f_ms=(18.0, 19.0, 13.0, 13.0),
        t_b_ms=(11.0, 14.0, 14.0, 17.0), t_w_ms=(16.0, 14.0, 10.0, 10.0),
        delay_ms=(0.0, 60.0, 0.0),
    )  # fmt: skip
    warm = plan_adaptra(profile, exact_time_limit_s=0).schedule
    first, *others = (
        solve_exact_deterministic(profile, deterministic_time_s=1.0, warm_start=warm)
        for _ in range(3)
    )
    check_result(first, profile)
    assert first.optimal and first.iteration_time_ms == 590.0
    for other in others:
        assert other.schedule == first.schedule


def test_deterministic_optimum() -> None:
    profile = Profile(
        num_stages=3,
        num_microbatches=6,
        t_f_ms=(3.0, 5.0, 4.0),
        t_b_ms=(6.0, 7.0, 5.0),
        t_w_ms=(2.0, 3.0, 4.0),
        delay_ms=(7.0, 2.0),
        mem_limit=2.0,
    )
    first, second = (solve_exact_deterministic(profile, deterministic_time_s=5) for _ in range(2))
    assert first.optimal and second.optimal
    assert first.iteration_time_ms == second.iteration_time_ms


def _python(code: str) -> list[str]:
    """Run `code` in a fresh interpreter (signals sent there cannot reach the test runner);
    its stdout's words."""
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, (out.returncode, out.stderr)
    return out.stdout.split()


def test_a_solve_leaves_the_processs_sigint_handler_in_place() -> None:
    """CP-SAT's default `catch_sigint_signal` set SIGINT to SIG_DFL at the OS level when a
    solve ended (Python's getsignal still named the old handler), so a later SIGINT killed
    the process (returncode -2) instead of running the handler."""
    code = (
        "import os, signal; from adaptra.exact import solve_exact_deterministic; "
        "from pipeline.profile import Profile; got = []; "
        "signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum)); "
        "r = solve_exact_deterministic(Profile.uniform(2, 2, 1, 1, 1), deterministic_time_s=1); "
        "os.kill(os.getpid(), signal.SIGINT); signal.raise_signal(signal.SIGINT); "
        "print(r.status, got == [signal.SIGINT] * 2)"
    )
    assert _python(code) == ["OPTIMAL", "True"]


_SIGINT_DURING_A_SOLVE = (
    "def interrupt():\n"
    "    while not any(t.name == 'cp-sat' for t in threading.enumerate()): time.sleep(0.01)\n"
    "    time.sleep(0.2); os.kill(os.getpid(), signal.SIGINT)\n"
    "threading.Thread(target=interrupt).start()\n"
    "try: solve_exact(Profile.uniform(8, 32, 10, 10, 10, mem_limit=4.0), time_limit_s=600)\n"
    "except KeyboardInterrupt as err: print('interrupted', err)\n"
    "print([t.name for t in threading.enumerate()])"
)
"""The end of a child's code: SIGINT once CP-SAT searches (a problem it finds nothing for in
seconds, given 600 s); it prints what the solve raised, then the threads left."""


def test_a_signal_during_a_solve_ends_it_at_once() -> None:
    """A handler's exception (Ctrl-C's KeyboardInterrupt) reaches the caller while CP-SAT
    searches (a problem it finds nothing for in seconds, given 600 s), and the search stops
    with it: no solver thread is left running."""
    code = (
        "import os, signal, threading, time; from adaptra.exact import solve_exact; "
        "from pipeline.profile import Profile\n" + _SIGINT_DURING_A_SOLVE
    )
    assert _python(code) == ["interrupted", "['MainThread']"]


def test_a_second_signal_while_the_search_stops_still_stops_it() -> None:
    """A second Ctrl-C as the first one's exception told CP-SAT to stop (here: its first
    `stop_search` raises it) left the search running to its time limit, the process's exit
    waiting for it; now the search is stopped all the same and the second goes up."""
    code = (
        "import os, signal, threading, time; from adaptra.exact import solve_exact; "
        "from ortools.sat.python import cp_model; from pipeline.profile import Profile\n"
        "original, calls = cp_model.CpSolver.stop_search, []\n"
        "def stop_search(self):\n"
        "    calls.append(1)\n"
        "    if len(calls) == 1: raise KeyboardInterrupt('second')\n"
        "    original(self)\n"
        "cp_model.CpSolver.stop_search = stop_search\n" + _SIGINT_DURING_A_SOLVE
    )
    assert _python(code) == ["interrupted", "second", "['MainThread']"]


def test_a_signal_as_the_search_thread_starts_stops_the_search() -> None:
    """SIGINT right after the search's thread had started, before `start` returned (a loaded
    host leaves the caller unscheduled that long): the KeyboardInterrupt came out of `start`,
    before the solve could stop the search, which ran on to its time limit (CI timed out at
    60 s of 600). Now the search stops with it and no solver thread is left."""
    code = (
        "import os, signal, threading; from adaptra.exact import solve_exact; "
        "from pipeline.profile import Profile\n"
        "original = threading.Thread.start\n"
        "def start(self):\n"
        "    original(self)\n"
        "    if self.name == 'cp-sat': os.kill(os.getpid(), signal.SIGINT)\n"
        "threading.Thread.start = start\n"
        "try: solve_exact(Profile.uniform(8, 32, 10, 10, 10, mem_limit=4.0), time_limit_s=20)\n"
        "except KeyboardInterrupt as err: print('interrupted', err)\n"
        "print([t.name for t in threading.enumerate()])"
    )
    assert _python(code) == ["interrupted", "['MainThread']"]


def test_a_schedule_at_the_release_time_bound_is_proven_optimal_at_once() -> None:
    """The model's makespan starts at adaptra.bounds' release-time bound where that is
    higher than its static one, and a schedule meeting the bound is optimal however little
    CP-SAT searched (with the static bound alone, this profile's 1336 ms was 'best found,
    bound 1269 ms' after 0.2 s)."""
    heuristic = plan_adaptra(LATE_LAST_STAGE, exact_time_limit_s=0).schedule  # at 1336 ms
    result = solve_exact_deterministic(
        LATE_LAST_STAGE, deterministic_time_s=1e-4, warm_start=heuristic
    )
    assert iteration_lower_bound_ms(LATE_LAST_STAGE) == 1336.0
    assert (result.optimal, result.iteration_time_ms, result.lower_bound_ms) == (
        True,
        1336.0,
        1336.0,
    )
