"""The README's fault-timeline example runs as the README says, and each of its rows acts on
its example profile."""

import json
import re
from pathlib import Path
from typing import Any

import pytest

from harness.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"


def _example(tmp_path: Path) -> tuple[Path, Path]:
    """trace.yaml and dp2.json, from the README's blocks after "saved as `trace.yaml`"."""
    text = README.read_text()
    after = text[text.index("saved as `trace.yaml`") :]
    timeline = re.search(r"```yaml\n(.*?)```", after, re.S)
    profile = re.search(r"```json\n(.*?)```", after, re.S)
    assert timeline is not None and profile is not None
    (tmp_path / "trace.yaml").write_text(timeline.group(1))
    (tmp_path / "dp2.json").write_text(profile.group(1))
    return tmp_path / "trace.yaml", tmp_path / "dp2.json"


def _run(capsys: pytest.CaptureFixture[str], profile: Path, faults: Path) -> dict[str, Any]:
    argv = ["run", "--profile", str(profile), "--system", "1f1b", "--iterations", "10"]
    main([*argv, "--faults", str(faults), "--format", "json"])
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def _kept_steps_ms(result: dict[str, Any]) -> list[float]:
    """Each iteration's step (pipeline and all-reduce), the run's last try of it (a restart
    runs the lost ones again)."""
    steps = {
        record["iteration"]: pipeline + ring
        for record, pipeline, ring in zip(
            result["iterations"], result["iteration_times_ms"], result["step_times_ms"], strict=True
        )
    }
    return [steps[k] for k in sorted(steps)]


def test_the_readme_s_fault_timeline_example_acts_in_every_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """1F1B in the simulator on the README's timeline and profile, against the profile
    without its message and gradient sizes: the same until the cap (iteration 4 at 100 ms),
    slower from there (the cap holds messages and ring chunks; from iteration 6 the ring
    link's delay has a ring to delay); the NIC down in iteration 9 restarts both. Without
    the sizes the cap and the ring link's delay changed nothing, and nothing said so."""
    faults, profile = _example(tmp_path)
    sized = _run(capsys, profile, faults)
    fields = json.loads(profile.read_text())
    assert fields["message_bytes"] > 0 and fields["allreduce_bytes"] > 0
    unsized_profile = tmp_path / "unsized.json"
    del fields["message_bytes"], fields["allreduce_bytes"]
    unsized_profile.write_text(json.dumps(fields))
    unsized = _run(capsys, unsized_profile, faults)
    assert sized["restarts"] == unsized["restarts"] == 1
    with_sizes, without = _kept_steps_ms(sized), _kept_steps_ms(unsized)
    assert with_sizes[:4] == pytest.approx(without[:4])
    slower = [k for k, (a, b) in enumerate(zip(with_sizes, without, strict=True)) if a > b]
    # (in iteration 5 the stall's 200 ms on link 2-3 of replica 1 is the longer path either way)
    assert slower == [4, 6, 7, 8, 9], (with_sizes, without)
