"""The policies a run can name (harness.policies): what each says it did."""

from harness.policies import POLICIES
from pipeline.profile import Profile
from pipeline.schedule import validate_schedule


def test_milp_says_its_proof_is_to_a_microsecond_where_times_are_not_whole_microseconds() -> None:
    """CP-SAT solves in whole microseconds: for op times that are not, its proof is of the
    rounded model (its bound may even pass the schedule's time by a fraction of one), and
    the method says so, as Adaptra's own CP-SAT step does; whole-microsecond times prove
    the optimum itself."""
    for t_f_ms, proof in ((1.0, "cp-sat optimal"), (1.0000004, "cp-sat optimal to 1 us")):
        profile = Profile.uniform(2, 2, t_f_ms, 1.0, 1.0)
        schedule, method = POLICIES["milp"](profile, 20.0)
        validate_schedule(schedule, 2, 2)
        assert method == proof
