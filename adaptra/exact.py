"""The exact schedule solver: a CP-SAT model of the `ideal` problem (docs/paper.md).

It gives the project its honest optimality gap: every heuristic is measured against a
schedule that CP-SAT proves optimal (or against the proven lower bound when time runs out).

The model, per stage i and microbatch m, has fixed-size intervals F(i,m), B(i,m), W(i,m):
- F(i+1,m) starts >= end F(i,m) + transfer(i); B(i,m) starts >= end B(i+1,m) + transfer(i)
  for i < S-1 and >= end F(i,m) everywhere; W(i,m) starts >= end B(i,m);
- one NoOverlap per stage (zero-size intervals count too: a sequence exists, see CP-SAT);
- with `mem_limit`, per F(i,m) a count of the B, W ended by its start (`_add_memory`);
- objective: the makespan, measured from t = 0 when stage 0 may start.
Times are integers: every duration and transfer time is scaled by 1, 10, 100 or 1000.

Symmetry breaking (per stage and kind, microbatch m runs before m+1) is sound because every
constraint links two "families" (one kind on one stage, all ops of equal duration) by
microbatch, as start X(m) >= end Y(m) + const. Relabelling each family by start rank keeps
every such constraint: if a bijection satisfies x >= y + c, the sorted matching does too
(the N-k+1 largest ends are matched to distinct starts >= y_(k) + c, so x_(k) >= y_(k) + c).
NoOverlap, memory and makespan depend only on each family's multiset of intervals. So some
optimal solution has ordered microbatches on every stage and kind.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Sequence

from ortools.sat.python import cp_model

from adaptra.bounds import iteration_lower_bound_ms, meets_bound
from pipeline.checks import MAX_DURATION_MS
from pipeline.errors import ScheduleError
from pipeline.metrics import compute_metrics
from pipeline.ops import Op, OpKind
from pipeline.profile import Profile
from pipeline.schedule import Schedule, check_memory, validate_schedule
from pipeline.signals import held_signals
from pipeline.simulator import CommMode, simulate

__all__ = ["ExactModelError", "ExactResult", "solve_exact", "solve_exact_deterministic"]

_SCALES = (1, 10, 100, 1000)
_KINDS = (OpKind.F, OpKind.B, OpKind.W)
_RANDOM_SEED = 0


@dataclasses.dataclass(frozen=True, slots=True)
class ExactResult:
    """What the solver found and what it proved."""

    schedule: Schedule
    iteration_time_ms: float
    """The schedule re-simulated in `ideal` mode under the real (unscaled) profile."""
    lower_bound_ms: float
    """Proven bound on the optimum (of the scaled model; see `exact_in_ms`)."""
    optimal: bool
    """Proven optimal: CP-SAT proved the model's optimum (status OPTIMAL), or, where the
    model's times are the profile's exactly, the schedule meets the lower bound."""
    solve_ms: float
    """In-process time of the whole call: scaling, model building, search, re-simulation."""
    status: str
    """CP-SAT's status name (OPTIMAL, FEASIBLE, UNKNOWN)."""
    exact_in_ms: bool = True
    """False when times had to be rounded (to `unit_ms`): bound and optimality refer to that
    model."""
    unit_ms: float = 0.001
    """The model's time unit: 1 us, or more where the profile's longest time in 1 us units
    would be longer than a profile's times may be (`_choose_scale`)."""


class ExactModelError(ScheduleError):
    """The profile's longest time (a link's delay with its wire time) is longer than the exact
    model's times may be, MAX_DURATION_MS in whole ms: the model cannot hold it."""


def rounded_to(result: ExactResult) -> str:
    """What an inexact model's proof is of, for a method's text: "" where its times are the
    profile's exactly, else " to 1 us" (or the coarser unit it rounded to)."""
    if result.exact_in_ms:
        return ""
    unit = {0.001: "1 us", 0.01: "10 us", 0.1: "100 us"}.get(result.unit_ms, "1 ms")
    return f" to {unit}"


@dataclasses.dataclass(frozen=True, slots=True)
class _Scaled:
    """The problem in integer time units (1/scale ms), as the model and hints see it."""

    scale: int
    exact: bool
    durations: dict[OpKind, tuple[int, ...]]
    transfer: tuple[int, ...]
    profile: Profile
    """A profile with these integer times, so that `simulate` times hints exactly."""


def _choose_scale(values: Sequence[float]) -> tuple[int, bool]:
    """The smallest scale making every value integral (1e-9), else the largest and rounding,
    of those at which every value is at most MAX_DURATION_MS (the scaled problem is a
    profile: a delay of 3600.001 ms at 1000 was refused as a delay over an hour, naming a
    value no input gave); ExactModelError where none is."""
    longest = max(values, default=0.0)
    scales = [scale for scale in _SCALES if longest * scale <= MAX_DURATION_MS]
    if not scales:
        raise ExactModelError(
            f"the exact model takes times of at most {MAX_DURATION_MS:.0f} ms, and a link's "
            f"transfer (its delay and wire time) of {longest:.10g} ms is longer (the adaptra "
            "policy plans it without the exact model)"
        )
    for scale in scales:
        if all(abs(v * scale - round(v * scale)) <= 1e-9 * max(1.0, v * scale) for v in values):
            return scale, True
    return scales[-1], False


def _scale_problem(profile: Profile) -> _Scaled:
    num_stages = profile.num_stages
    transfer_ms = [profile.transfer_ms(i) for i in range(num_stages - 1)]
    times = {OpKind.F: profile.t_f_ms, OpKind.B: profile.t_b_ms, OpKind.W: profile.t_w_ms}
    scale, exact = _choose_scale([*transfer_ms, *(t for ts in times.values() for t in ts)])
    durations = {k: tuple(round(t * scale) for t in ts) for k, ts in times.items()}
    transfer = tuple(round(t * scale) for t in transfer_ms)
    scaled_profile = Profile(
        num_stages=num_stages,
        num_microbatches=profile.num_microbatches,
        t_f_ms=tuple(map(float, durations[OpKind.F])),
        t_b_ms=tuple(map(float, durations[OpKind.B])),
        t_w_ms=tuple(map(float, durations[OpKind.W])),
        delay_ms=tuple(map(float, transfer)),
    )
    return _Scaled(scale, exact, durations, transfer, scaled_profile)


def _split_fused(schedule: Schedule) -> Schedule:
    """BW -> B, W in place: the gradient leaves earlier, so ideal times never get later."""
    stages = []
    for ops in schedule.stages:
        split: list[Op] = []
        for op in ops:
            if op.kind is OpKind.BW:
                split += [Op(OpKind.B, op.microbatch), Op(OpKind.W, op.microbatch)]
            else:
                split.append(op)
        stages.append(tuple(split))
    return Schedule(tuple(stages))


def _one_f_one_b_split(num_stages: int, num_microbatches: int, cap: int) -> Schedule:
    """1F1B with split backward and warm-up min(S - i, cap): peak memory <= cap, so it is
    feasible whenever the model is: the default hint, and its makespan bounds the horizon."""
    stages = []
    for i in range(num_stages):
        warmup = max(1, min(num_stages - i, cap, num_microbatches))
        ops = [Op(OpKind.F, m) for m in range(warmup)]
        for m in range(num_microbatches):
            ops += [Op(OpKind.B, m), Op(OpKind.W, m)]
            if m + warmup < num_microbatches:
                ops.append(Op(OpKind.F, m + warmup))
        stages.append(tuple(ops))
    return Schedule(tuple(stages))


def _makespan(schedule: Schedule, profile: Profile) -> float:
    return compute_metrics(simulate(schedule, profile, CommMode.IDEAL)).iteration_time_ms


def _static_lower_bound(sc: _Scaled, num_microbatches: int) -> int:
    """Per stage: release dates of its F and B ops plus the work that must follow them.

    CP-SAT finds such bounds itself eventually; stating them closes uniform cases at once.
    """
    tf, tb, tw = (sc.durations[k] for k in _KINDS)
    num_stages, n = len(tf), num_microbatches
    best = 0
    for i in range(num_stages):
        release_f = sum(tf[j] + sc.transfer[j] for j in range(i))
        round_trip = sum(tf[j] + tb[j] for j in range(i + 1, num_stages))
        round_trip += 2 * sum(sc.transfer[i:])
        release_b = release_f + tf[i] + round_trip
        best = max(
            best,
            release_f + n * (tf[i] + tb[i] + tw[i]),
            release_b + n * (tb[i] + tw[i]),
            release_f + n * tf[i] + round_trip + tb[i] + tw[i],
        )
    return best


def _lower_bound(sc: _Scaled, num_microbatches: int) -> int:
    """The makespan's least value, in the model's units: the static bound above, or the
    release-time bound of adaptra.bounds on the model's own integer times, whichever is
    higher (the latter closed, on its own, profiles whose static bound left CP-SAT 5 %
    short of a schedule it could not prove optimal in 0.2 s)."""
    release_bound = iteration_lower_bound_ms(sc.profile)  # sums of whole units: exact
    return max(_static_lower_bound(sc, num_microbatches), math.floor(release_bound + 1e-6))


_Starts = dict[tuple[OpKind, int, int], cp_model.IntVar]


def _build_model(
    sc: _Scaled, num_microbatches: int, horizon: int, mem_cap: int | None
) -> tuple[cp_model.CpModel, _Starts, cp_model.IntVar]:
    """Intervals, dependencies, NoOverlap, symmetry breaking, memory and the objective."""
    model = cp_model.CpModel()
    num_stages, n = len(sc.transfer) + 1, num_microbatches
    starts: _Starts = {}
    for i in range(num_stages):
        intervals = []
        for kind in _KINDS:
            size = sc.durations[kind][i]
            for m in range(n):
                start = model.new_int_var(0, horizon - size, f"{kind.value}{m}@{i}")
                starts[kind, i, m] = start
                intervals.append(model.new_fixed_size_interval_var(start, size, f"i{start}"))
        model.add_no_overlap(intervals)

    def end(kind: OpKind, i: int, m: int) -> cp_model.LinearExprT:
        return starts[kind, i, m] + sc.durations[kind][i]

    for i in range(num_stages):
        for m in range(n):
            if i + 1 < num_stages:
                model.add(starts[OpKind.F, i + 1, m] >= end(OpKind.F, i, m) + sc.transfer[i])
                model.add(starts[OpKind.B, i, m] >= end(OpKind.B, i + 1, m) + sc.transfer[i])
            model.add(starts[OpKind.B, i, m] >= end(OpKind.F, i, m))
            model.add(starts[OpKind.W, i, m] >= end(OpKind.B, i, m))
            for kind in _KINDS:  # symmetry breaking: see the module docstring
                if m + 1 < n:
                    model.add(starts[kind, i, m + 1] >= end(kind, i, m))
        if mem_cap is not None:
            _add_memory(model, sc, i, n, starts, mem_cap)
    makespan = model.new_int_var(_lower_bound(sc, n), horizon, "makespan")
    for i in range(num_stages):  # W(i, N-1) ends last on stage i, by the ordering above
        model.add(makespan >= end(OpKind.W, i, n - 1))
    model.minimize(makespan)
    if _memory_binds(mem_cap, n):  # list scheduling: earliest op first, at its earliest time
        model.add_decision_strategy(
            list(starts.values()), cp_model.CHOOSE_LOWEST_MIN, cp_model.SELECT_MIN_VALUE
        )
    return model, starts, makespan


def _add_memory(
    model: cp_model.CpModel, sc: _Scaled, i: int, n: int, starts: _Starts, mem_cap: int
) -> None:
    """At each F(i,m) start s: 2(m+1) - #{B, W of microbatches < m ended by s} <= mem_cap.

    Half-units; the level only rises at an F, so checking there suffices. This is exact for
    the order `_extract` returns, zero-length ops included: the B, W before F(i,m) in it are
    those of microbatches < m that end by s (ties at one instant go by microbatch). It is a
    relaxation of any other order (there, a B or W before F(i,m) also ends by s and, its F
    being earlier, has a microbatch < m), so optimality is never overstated. A reservoir
    (+2 at F start, -1 at B and W ends) sums equal-time events: exact when every op takes
    time, not with zero-length ops, and 3-10x slower here. Ordered microbatches make it a
    window: B(m - cap//2) and W(m + 1 - cap) must have ended, and about 1.5 cap literals
    decide the rest.
    """
    for m in range(n):
        need = 2 * (m + 1) - mem_cap
        if need <= 0:
            continue
        forced = {OpKind.B: (need + 1) // 2, OpKind.W: max(0, need - m)}  # #W <= #B <= m
        lits: list[cp_model.IntVar] = []
        for kind, first in forced.items():
            ends = [starts[kind, i, j] + sc.durations[kind][i] for j in range(m)]
            if first > 0:  # the order makes all those before it end first too
                model.add(starts[OpKind.F, i, m] >= ends[first - 1])
            previous = None
            for j in range(first, m):
                lit = model.new_bool_var(f"{kind.value}{j}<F{m}@{i}")
                model.add(starts[OpKind.F, i, m] >= ends[j]).only_enforce_if(lit)
                if previous is not None:
                    model.add_implication(lit, previous)
                previous = lit
                lits.append(lit)
        if need > sum(forced.values()):
            model.add(sum(lits) >= need - sum(forced.values()))


def _add_hints(
    model: cp_model.CpModel,
    starts: _Starts,
    makespan: cp_model.IntVar,
    sc: _Scaled,
    warm: Schedule,
) -> None:
    """The warm start's ideal times (scaled), relabelled by start rank per stage and kind,
    which keeps them feasible (the symmetry argument) and meets the ordering."""
    timeline = simulate(warm, sc.profile, CommMode.IDEAL, validate=False)
    families: dict[tuple[OpKind, int], list[int]] = {}
    for record in timeline.ops:
        families.setdefault((record.kind, record.stage), []).append(round(record.start_ms))
    for (kind, i), values in families.items():
        for m, value in enumerate(sorted(values)):
            model.add_hint(starts[kind, i, m], value)
    model.add_hint(makespan, round(max(r.end_ms for r in timeline.ops)))


def _extract(solver: cp_model.CpSolver, starts: _Starts, sc: _Scaled) -> Schedule:
    """Each stage's ops by (start, end, microbatch, depth). Sorting by (start, end) gives a
    NoOverlap sequence; equal keys only occur for zero-length ops at one instant, and every
    dependency stays in its microbatch with a smaller depth (F: i, B: 2S-1-i, W: 2S), so a
    predecessor always sorts first and the order cannot deadlock."""
    num_stages = len(sc.transfer) + 1
    depth = {OpKind.F: 0, OpKind.B: 2 * num_stages - 1, OpKind.W: 2 * num_stages}
    sign = {OpKind.F: 1, OpKind.B: -1, OpKind.W: 0}
    stages: list[list[tuple[int, int, int, int, Op]]] = [[] for _ in range(num_stages)]
    for (kind, i, m), var in starts.items():
        start = solver.value(var)
        rank = depth[kind] + sign[kind] * i
        stages[i].append((start, start + sc.durations[kind][i], m, rank, Op(kind, m)))
    return Schedule(tuple(tuple(entry[-1] for entry in sorted(ops)) for ops in stages))


def _memory_binds(mem_cap: int | None, num_microbatches: int) -> bool:
    return mem_cap is not None and mem_cap < 2 * num_microbatches


@dataclasses.dataclass(frozen=True, slots=True)
class _Limit:
    """How long CP-SAT may search: wall-clock seconds on `num_workers` workers, or CP-SAT's
    deterministic time (its own work measure, in about seconds) on one worker."""

    wall_s: float | None
    deterministic_s: float | None
    num_workers: int

    def describe(self) -> tuple[str, str]:
        """How much, and which argument sets it."""
        if self.deterministic_s is not None:
            return f"{self.deterministic_s:g} s of deterministic time", "deterministic_time_s"
        return f"{self.wall_s:g} s", "time_limit_s"


def _solve(
    model: cp_model.CpModel, limit: _Limit, memory_binds: bool
) -> tuple[cp_model.CpSolver, cp_model.CpSolverStatus]:
    """Defaults, except where measured worse (S=8, N=32, 2 cores). A hint makes the default
    search stay near it (30 s instead of 1 s to the optimum from a 1F1B hint), so a hint
    only becomes the first solution (hint_conflict_limit 0). With a binding memory limit,
    presolve probing of the memory literals takes 15 s, so it is off, and a list-scheduling
    search ("fixed", earliest op at its earliest time) runs next to the LP-based one:
    with defaults, mem_limit=4 ended 30 s at 6485 ms (optimum 3302 ms). One worker has no
    "next to": it runs the list-scheduling search alone (FIXED_SEARCH), which proved all 7
    memory-bound S=4 N=12 profiles measured in 1 s of deterministic time, the default
    search 5."""
    solver = cp_model.CpSolver()
    params = solver.parameters
    # CP-SAT's own SIGINT handler (on by default) sets SIGINT to SIG_DFL when the solve
    # ends, not back to the process's handler: a later Ctrl-C then killed `run` with no
    # cleanup. Signals are the caller's; `_search` lets them interrupt the search.
    params.catch_sigint_signal = False
    if limit.wall_s is not None:
        params.max_time_in_seconds = max(0.0, limit.wall_s)
    if limit.deterministic_s is not None:
        params.max_deterministic_time = max(0.0, limit.deterministic_s)
    params.num_workers = max(1, limit.num_workers)
    params.random_seed = _RANDOM_SEED
    params.hint_conflict_limit = 0  # take a complete hint as is, but do not search near it
    if memory_binds:
        params.cp_model_probing_level = 0
        if params.num_workers == 1:
            params.search_branching = cp_model.FIXED_SEARCH
        else:
            params.extra_subsolvers.append("fixed")
            params.num_full_subsolvers = max(2, params.num_workers)
    return solver, _search(solver, model)


def _search(solver: cp_model.CpSolver, model: cp_model.CpModel) -> cp_model.CpSolverStatus:
    """`solver.solve(model)` in a thread of its own (it releases the GIL), so the main
    thread still runs Python's signal handlers while CP-SAT searches: an exception from one
    (KeyboardInterrupt, the CLI's Terminated) stops the search, waits for it to end, and
    goes on up at once, instead of after the time limit (`--time-limit` up to a day)."""
    outcome: list[cp_model.CpSolverStatus | BaseException] = []
    ended = threading.Event()

    def search() -> None:
        try:
            outcome.append(solver.solve(model))
        except BaseException as err:  # handed to the caller's thread below
            outcome.append(err)
        finally:
            ended.set()

    thread = threading.Thread(target=search, name="cp-sat")
    try:
        # A signal as the thread starts goes up once it has started, where the search stops
        # with it: raised from `start`, it left the search running to its time limit (600 s
        # in a test on a loaded host), the process's exit waiting for it.
        with held_signals():
            thread.start()
        ended.wait()  # not thread.join(): interrupted, 3.11's marks a running thread stopped
    except BaseException:
        if thread.ident is None:  # it never started
            raise
        try:
            _stop_search(solver, ended)
        finally:
            thread.join()
        raise
    thread.join()
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def _stop_search(solver: cp_model.CpSolver, ended: threading.Event) -> None:
    """Stop the search and wait until it has ended, whatever signal comes meanwhile (a second
    Ctrl-C left it searching to its time limit, the process's exit waiting for it); a later
    signal's exception goes up once it has."""
    late: BaseException | None = None
    while not ended.is_set():
        try:
            solver.stop_search()  # nothing until solve has begun: again until it ends
            ended.wait(0.01)
        except BaseException as err:
            late = err
    if late is not None:
        raise late


def _prepare_warm_start(warm_start: Schedule | None, profile: Profile) -> Schedule | None:
    if warm_start is None:
        return None
    validate_schedule(warm_start, profile.num_stages, profile.num_microbatches)
    check_memory(warm_start, profile.mem_limit, "the warm start")
    return _split_fused(warm_start)


def _memory_cap(profile: Profile) -> int | None:
    """mem_limit in half-microbatch units (>= 2: Profile refuses a limit below 1)."""
    if profile.mem_limit is None:
        return None
    return math.floor(2 * profile.mem_limit + 1e-9)


def solve_exact(
    profile: Profile,
    *,
    time_limit_s: float = 10.0,
    warm_start: Schedule | None = None,
    num_workers: int = 2,
) -> ExactResult:
    """The best schedule CP-SAT finds within `time_limit_s`, with its proven lower bound.

    A warm start (any valid schedule; BW ops are split) is passed as a hint, and the result
    is never worse than it. Without one, 1F1B with split backward (within mem_limit) is the
    hint, and CP-SAT finding no solution in time (not even loading that) is a ScheduleError.
    The seed is fixed, but with several workers and a time limit CP-SAT's parallel search
    may still return different schedules (never a different proven optimum) between runs,
    and more load means less search: `solve_exact_deterministic` is the reproducible one.
    """
    return _solve_exact(profile, _Limit(time_limit_s, None, num_workers), warm_start)


def solve_exact_deterministic(
    profile: Profile, *, deterministic_time_s: float, warm_start: Schedule | None = None
) -> ExactResult:
    """As `solve_exact`, but reproducible: one worker, a fixed seed and CP-SAT's
    deterministic time limit (a count of its own work, about seconds on one core) instead of
    a clock, so the same profile gives the same schedule on any load. Only `solve_ms`
    varies."""
    return _solve_exact(profile, _Limit(None, deterministic_time_s, 1), warm_start)


def _solve_exact(profile: Profile, limit: _Limit, warm_start: Schedule | None) -> ExactResult:
    began = time.perf_counter()
    mem_cap = _memory_cap(profile)
    warm = _prepare_warm_start(warm_start, profile)
    sc = _scale_problem(profile)
    n = profile.num_microbatches
    cap = profile.num_stages if mem_cap is None else mem_cap // 2
    candidates = [_one_f_one_b_split(profile.num_stages, n, cap)]
    candidates += [] if warm is None else [warm]
    horizon = round(max(_makespan(s, sc.profile) for s in candidates))
    model, starts, makespan = _build_model(sc, n, horizon, mem_cap)
    _add_hints(model, starts, makespan, sc, warm or candidates[0])
    solver, status = _solve(model, limit, _memory_binds(mem_cap, n))
    if status in (cp_model.INFEASIBLE, cp_model.MODEL_INVALID):
        raise ScheduleError(f"the exact model is {solver.status_name(status)}; this is a bug")
    solved = None
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        solved = _extract(solver, starts, sc)
        validate_schedule(solved, profile.num_stages, n)  # by construction; a bug otherwise
        check_memory(solved, profile.mem_limit, "the exact solver's order (a bug)")
    options = [s for s in (solved, warm) if s is not None]
    if not options:
        amount, argument = limit.describe()
        raise ScheduleError(
            f"CP-SAT found no schedule for S={profile.num_stages}, N={n} within {amount} "
            f"(status {solver.status_name(status)}); raise {argument} "
            "or pass a warm_start (e.g. a 1F1B or ZB order) to start from"
        )
    times = [_makespan(s, profile) for s in options]
    best = min(range(len(options)), key=times.__getitem__)  # ties: the solver's schedule
    bound = max(solver.best_objective_bound, _lower_bound(sc, n))
    return ExactResult(
        schedule=options[best],
        iteration_time_ms=times[best],
        lower_bound_ms=bound / sc.scale,
        optimal=(status == cp_model.OPTIMAL and solved is not None)
        or (sc.exact and meets_bound(times[best], bound / sc.scale)),  # a schedule at a bound
        solve_ms=(time.perf_counter() - began) * 1e3,
        status=solver.status_name(status),
        exact_in_ms=sc.exact,
        unit_ms=1 / sc.scale,
    )
