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


def _quick_start_blocks() -> list[str]:
    """The YAML blocks of the README's "Quick start", in order."""
    text = README.read_text()
    section = text[text.index("## Quick start") : text.index("## What it does")]
    return re.findall(r"```yaml\n(.*?)```", section, re.S)


def test_the_quick_start_s_slow_link_gives_the_headline_it_quotes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its first spec, as saved, in the (deterministic) simulator: the slowdowns and the
    speed-up the README quotes."""
    spec = tmp_path / "slow-link.yaml"
    spec.write_text(_quick_start_blocks()[0])
    main(["run", "--spec", str(spec), "--out", str(tmp_path), "--run-id", "quick"])
    capsys.readouterr()
    report = (tmp_path / "quick" / "report.md").read_text()
    text = README.read_text()
    for quoted, line in [
        ("1F1B 4.41x", "gpt2-7b 1f1b 4.41x (2-3@60ms)"),
        ("ZB 4.28x", "gpt2-7b zb 4.28x (2-3@60ms)"),
        ("Adaptra 1.16x", "gpt2-7b adaptra 1.16x (2-3@60ms)"),
        ("Adaptra 3.67x faster than ZB", "2-3@60ms 3.67x over zb"),
    ]:
        assert quoted in text and line in report, (quoted, report)


def test_the_quick_start_s_runtime_specs_and_fault_row_are_valid(tmp_path: Path) -> None:
    """The emulated specs (not run here: 20 s and 13 s) read as the README gives them, the
    dead NIC's with its fault row saved as `nic-down.yaml`: one NIC event from iteration 2."""
    from harness.spec import load_spec

    slow, row, dead = _quick_start_blocks()[1:]
    (tmp_path / "slow.yaml").write_text(slow)
    (tmp_path / "nic-down.yaml").write_text(row)
    (tmp_path / "dead.yaml").write_text(dead)
    spec = load_spec(tmp_path / "slow.yaml")
    assert (spec.backend, spec.systems) == ("emulated", ("1f1b", "zb", "adaptra"))
    assert len(spec.configurations()) == 6
    spec = load_spec(tmp_path / "dead.yaml")
    assert (spec.backend, spec.systems) == ("emulated", ("zb", "adaptra-cpu", "adaptra"))
    (scenario,) = {config.scenario for config in spec.configurations()}
    assert scenario.name == "trace:nic-down"
    (event,) = scenario.faults.events
    assert (event.start_iteration, event.target.nic, event.target.hosts[0]) == (2, "rnic0", 1)
    assert event.effect.down
