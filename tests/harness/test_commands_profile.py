"""`profile` warns, and `calibrate` notes, when their stages outnumber the CPU cores."""

from harness.commands_profile import shared_cores_note, shared_cores_warning


def test_more_stages_than_cores_is_a_warning_and_as_many_is_none() -> None:
    assert shared_cores_warning(2, 2) is None
    assert shared_cores_warning(1, 16) is None
    assert shared_cores_warning(4, 2) == (
        "warning: 4 stages on 2 CPU core(s): the workers share cores, so the times measured "
        "include waiting for one (not results; use --stages 2 or fewer, or a larger machine)"
    )


def test_calibrate_notes_shared_cores_without_calling_its_costs_no_results() -> None:
    """`calibrate`'s default (4 stages) on the 2 cores it is documented for warned "not
    results; use --stages 2 or fewer", against its own help: calibrate with as many stages
    as the runs to predict (whose costs include the same waiting)."""
    assert shared_cores_note(4, 4) is None
    assert shared_cores_note(4, 2) == (
        "note: 4 stages on 2 CPU core(s): the costs measured include waiting for a core, as "
        "those of the 4-stage runs they predict here"
    )
