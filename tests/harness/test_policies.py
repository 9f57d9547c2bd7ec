"""The policies a run can name (harness.policies): what each says it did, and what a run of
one warns of."""

import csv
import json
import subprocess
import sys
from pathlib import Path

from harness.policies import POLICIES, sub_onset_delay_warning
from injectors.fault_files import parse_yaml
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


def test_a_delay_under_the_detectors_onset_is_warned_of_and_is_not_seen(tmp_path: Path) -> None:
    """The detector's onset (8 ms) is set against a loaded host's noise, not by what a delay
    costs: 6 ms on one PP link of 0.1 ms ops made Adaptra's iteration 24x the fault-free
    one, on the direct path, with nothing said (a review). The run says so; at 9 ms it
    delegates and says nothing."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "name: sub-onset\nmodel: tiny-ops\n"
        "profile: {stages: 4, microbatches: 12, t_f: 0.1, t_b: 0.1, t_w: 0.1}\n"
        'systems: [adaptra, adaptra-cpu]\nlinks: ["1-2"]\ndelays_ms: [0, 6, 9]\n'
        "num_iterations: 3\nbackend: sim\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--spec", str(spec), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    (run_dir,) = (p for p in tmp_path.iterdir() if p.is_dir())
    rows = {
        r["system"] + " " + r["scenario"]: r for r in csv.DictReader((run_dir / "runs.csv").open())
    }
    assert rows["adaptra 1-2@6ms"]["comm"] == "direct"
    slowdown = float(rows["adaptra 1-2@6ms"]["median_iteration_ms"]) / float(
        rows["adaptra fault-free"]["median_iteration_ms"]
    )
    assert slowdown > 20
    assert rows["adaptra 1-2@9ms"]["comm"] == "delegated"
    warning = (
        "tiny-ops 1-2@6ms: warning: adaptra's detector calls a link slow from 8 ms of "
        "extra delay (its onset, set clear of a loaded host's noise) and never sees 6 ms on "
        "1-2: it runs them on its fault-free plan, whatever they cost there (adaptra-oracle "
        "plans for the delays it is told)"
    )
    assert json.loads((run_dir / "spec.json").read_text())["warnings"] == [warning]
    assert warning in out.stderr
    # adaptra-cpu reads the DP rings only: a PP delay is none of its detector's
    profile = Profile.uniform(4, 12, 0.1, 0.1, 0.1).with_delays([0.0, 6.0, 0.0], {})
    assert sub_onset_delay_warning("adaptra-cpu", profile) is None
    assert sub_onset_delay_warning("zb", profile) is None


def test_a_fault_timelines_delay_under_the_onset_is_named_by_its_row() -> None:
    profile = Profile.uniform(4, 12, 0.1, 0.1, 0.1)
    faults = parse_yaml(
        """
- {start_iteration: 1, links: ["0-1"], delay_ms: 30}
- start_iteration: 2
  links: ["dp0:0-1"]
  distribution: {normal: {mean_ms: 5, std_ms: 1}, redraw_every_ms: [10, 20]}
- {start_iteration: 3, hosts: [1, 2], delay_ms: 2, jitter_ms: 2}
- {start_iteration: 4, links: ["1-2"], bandwidth_gbps: 1}
"""
    )
    dp = Profile.uniform(4, 12, 0.1, 0.1, 0.1, num_replicas=2)
    assert sub_onset_delay_warning("adaptra", dp, faults) == (
        "warning: adaptra's detector calls a link slow from 8 ms of extra delay (its onset, "
        "set clear of a loaded host's noise) and never sees 5 ms on dp0:0-1 (the timeline's "
        "row 2); 2 ms on hosts 1-2 (the timeline's row 3): it runs them on its fault-free "
        "plan, whatever they cost there (adaptra-oracle plans for the delays it is told)"
    )
    assert sub_onset_delay_warning("falcon", profile, faults) is None


def test_adaptra_uses_as_many_delegates_as_its_detected_delay_needs() -> None:
    """S=4, 12 microbatches of 10 ms ops; link 0-1 slowed 30 ms from measured iteration 2,
    60 ms from 5: 6 delegates are started (provisioned for the longest delay, as the paper's
    artifact did), and Adaptra's detector-driven plans use 3 of them from the iteration
    after it sees the 30 ms (the paper's rule: a message holds its delegate 30 ms, one is
    made every 10 ms), 6 from the one after it sees the 60 ms; the oracle the same from
    each onset; Adaptra-CPU every started one throughout; none goes over delegates before
    it is needed. (With all 6 from the first detection, its iterations were 0, 0, 0, 6,
    6, 6, 6, 6, 6.)"""
    from harness.policies import system_controller
    from harness.runner import run_configuration

    profile = Profile.uniform(4, 12, 10, 10, 10, message_bytes=1 << 20)
    faults = parse_yaml(
        '[{start_iteration: 2, end_iteration: 5, links: ["0-1"], delay_ms: 30},'
        ' {start_iteration: 5, links: ["0-1"], delay_ms: 60}]'
    )
    used = {}
    for system in ("adaptra", "adaptra-oracle", "adaptra-cpu"):
        controller = system_controller(system, profile, faults)
        result = run_configuration(controller, num_iterations=9, faults=faults)
        used[system] = [d.num_delegates for d in result.decisions]
    assert used == {
        "adaptra": [0, 0, 0, 3, 3, 3, 6, 6, 6],
        "adaptra-oracle": [0, 0, 3, 3, 3, 6, 6, 6, 6],
        "adaptra-cpu": [6] * 9,
    }
