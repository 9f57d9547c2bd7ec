"""Small experiment specs the harness tests share."""

from pathlib import Path

from harness.spec import ExperimentSpec
from pipeline.profile import Profile


def nic_down_spec(folder: Path, systems: tuple[str, ...]) -> ExperimentSpec:
    """2 stages x 4 microbatches of 1 ms, 3 iterations, host 1's rnic0 down from iteration 1
    (its fault timeline written into `folder`): the direct systems restart, the delegated
    ones fail over."""
    faults = folder / "f.yaml"
    faults.write_text('- {start_iteration: 1, nic: "host1:rnic0", down: true}\n')
    return ExperimentSpec(
        name="a",
        models=("m",),
        profile=Profile.uniform(2, 4, 1, 1, 1),
        systems=systems,
        num_iterations=3,
        faults=str(faults),
    )
