"""The policies a run can name (harness.policies): what each says it did."""

from harness.policies import POLICIES
from pipeline.metrics import compute_metrics
from pipeline.profile import Profile
from pipeline.schedule import validate_schedule
from pipeline.simulator import simulate


def _unbalanced(t_f_last_ms: float, num_microbatches: int) -> Profile:
    """4 stages of unequal ops, 5 ms on link 0-1, memory for 3 microbatches."""
    return Profile(
        num_stages=4,
        num_microbatches=num_microbatches,
        t_f_ms=(9.0, 7.0, 10.0, t_f_last_ms),
        t_b_ms=(5.0, 19.0, 12.0, 6.0),
        t_w_ms=(6.0, 5.0, 7.0, 8.0),
        delay_ms=(5.0, 0.0, 0.0),
        mem_limit=3.0,
    )


def test_milp_says_its_proof_is_to_a_microsecond_where_times_are_not_whole_microseconds() -> None:
    """CP-SAT solves in whole microseconds: for op times that are not, its proof is of the
    rounded model (its bound may even pass the schedule's time by a fraction of one), and
    the method says so, as Adaptra's own CP-SAT step does; whole-microsecond times prove
    the optimum itself. (13 microbatches: too many ops for `adaptra`'s own solve, so
    `milp`'s runs.) Its limit is wall-clock time, and the proof takes about 2 s here: 300 s
    is a hang bound (with 20 s, a CI run under load ended with "cp-sat best found in 20 s")."""
    for t_f_ms, proof in ((7.0, "cp-sat optimal"), (7.0000028, "cp-sat optimal to 1 us")):
        profile = _unbalanced(t_f_ms, 13)
        schedule, method = POLICIES["milp"](profile, 300.0)
        validate_schedule(schedule, 4, 13)
        assert method == proof


def test_milp_starts_from_adaptras_plan_and_keeps_its_proof() -> None:
    """`milp` is never worse than `adaptra`, whatever its time limit: it starts from
    `adaptra`'s plan with its own short solve, and where that plan is proven optimal it is
    the answer (warm-started from the heuristic alone, 10 ms gave 463 ms, not 438)."""
    profile = _unbalanced(7.0, 12)
    adaptra, adaptra_method = POLICIES["adaptra"](profile, None)
    schedule, method = POLICIES["milp"](profile, 0.01)
    assert schedule == adaptra
    assert adaptra_method == "alg2+generator+search+cp-sat optimal"
    assert method == f"adaptra's, proven optimal ({adaptra_method}): no solve"
    assert compute_metrics(simulate(schedule, profile)).iteration_time_ms == 438.0
