"""`profile` and `calibrate` say when their stages outnumber the CPU cores."""

from harness.commands_profile import shared_cores_warning


def test_more_stages_than_cores_is_a_warning_and_as_many_is_none() -> None:
    assert shared_cores_warning(2, 2) is None
    assert shared_cores_warning(1, 16) is None
    assert shared_cores_warning(4, 2) == (
        "warning: 4 stages on 2 CPU core(s): the workers share cores, so the times measured "
        "include waiting for one (not results; use --stages 2 or fewer, or a larger machine)"
    )
