"""Faults through `run` and specs, into every engine as faults (the fault model)."""

import csv
import json
import statistics
from pathlib import Path

import pytest

from baselines import one_f_one_b, zb_h2
from harness.experiment import run_experiment
from harness.runner import fixed_plan, run_configuration
from harness.spec import ExperimentSpec
from injectors.fault_files import parse_yaml
from pipeline.profile import Profile
from tests.fidelity import check_fidelity
from tests.harness.test_cli import cli, write_profile

MIXED = """
- {start_iteration: 0, links: ["0-1"], delay_ms: 6, jitter_ms: 4}
- {start_iteration: 0, links: ["1-2"], bandwidth_gbps: 0.2}
- {start_iteration: 1, links: ["1-2"], stall_ms: 15}
"""


@pytest.mark.multiprocess
def test_jitter_a_cap_and_a_stall_agree_in_sim_and_emulated_message_by_message() -> None:
    """The same faults through the simulator and through real worker processes: every
    message gets the same fault_ms, every emulated send lasts at least that long, and the
    iteration times agree within the tests' fidelity band (tests/fidelity.py)."""
    profile = Profile.uniform(3, 6, 4, 4, 4, message_bytes=250_000)  # 10 ms at 0.2 Gbit/s
    faults = parse_yaml(MIXED, seed=11)
    runs = {
        backend: run_configuration(
            fixed_plan(zb_h2(profile), profile),
            backend=backend,
            num_iterations=3,
            num_warmup_iterations=1,
            faults=faults,
        )
        for backend in ("sim", "emulated")
    }
    assert runs["sim"].timeline is not None and runs["emulated"].timeline is not None

    def by_message(timeline):
        return {(m.iteration, m.link, m.direction, m.microbatch): m for m in timeline.messages}

    sim, emulated = by_message(runs["sim"].timeline), by_message(runs["emulated"].timeline)
    assert sim.keys() == emulated.keys() and len(sim) == 4 * 2 * 2 * 6
    assert all(sim[key].fault_ms == emulated[key].fault_ms for key in sim)
    assert all(
        m.send_end_ms - m.send_start_ms >= m.fault_ms for m in emulated.values()
    )  # the hook's sleep is inside the send
    measured = {(k[0], k[1]): m.fault_ms for k, m in sim.items()}
    assert measured[(0, "0-1")] == 0.0 and measured[(0, "1-2")] == 0.0  # warm-up: healthy
    jitter = {m.fault_ms for k, m in sim.items() if k[0] > 0 and k[1] == "0-1"}
    assert len(jitter) > 10 and all(2.0 <= d <= 10.0 for d in jitter)
    capped = sorted(m.fault_ms for k, m in sim.items() if k[0] == 2 and k[1] == "1-2")
    assert capped == [10.0] * 10 + [25.0] * 2  # the stall: once per direction, iteration 1
    check_fidelity(
        statistics.median(runs["emulated"].iteration_times_ms),
        statistics.median(runs["sim"].iteration_times_ms),
    )


def test_run_faults_with_system_adaptra_replans_like_the_spec(tmp_path: Path) -> None:
    faults = tmp_path / "faults.txt"
    faults.write_text("1;0_1;0.02 3;0_1;0\n")  # 20 ms on link 0-1 in iterations 1 and 2
    profile = write_profile(tmp_path)
    out = cli(
        "run", "--profile", str(profile), "--system", "adaptra", "--iterations", "4",
        "--faults", str(faults), "--format", "json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert (data["system"], data["controller"], data["policy"]) == (
        "adaptra",
        "detector",
        "adaptra",
    )
    records = data["iterations"]
    assert [r["iteration"] for r in records] == [0, 1, 2, 3]
    # The detector sees iteration 1's slow messages; iteration 2 runs the plan for them.
    assert [r["detected_ms"] for r in records[:2]] == [{}, {}]
    assert records[2]["detected_ms"] == {"0-1": pytest.approx(20.0, abs=1e-6)}
    assert [r["policy"] for r in records] == ["adaptra"] * 4  # (no delay planned in 0 and 1)
    assert records[1]["comm"] == {"0-1": "direct", "1-2": "direct", "2-3": "direct"}
    assert set(records[2]["comm"].values()) == {"delegated"}
    assert data["comm"] == "direct+delegated"  # what its iterations ran over, in order
    # its delegates, provisioned for the timeline's longest delay (not detected): 20 ms over
    # the 10 ms ops, 2 a link direction, said beside the comm they carried
    assert data["num_delegates"] == 2
    oracle = cli(
        "run", "--profile", str(profile), "--system", "adaptra-oracle", "--iterations", "4",
        "--faults", str(faults), "--format", "json",
    )  # fmt: skip
    assert oracle.returncode == 0, oracle.stderr
    known = json.loads(oracle.stdout)
    assert known["controller"] == "oracle" and known["iterations"][1]["detected_ms"] == {"0-1": 20}
    fixed = cli(
        "run", "--profile", str(profile), "--policy", "adaptra", "--iterations", "4",
        "--faults", str(faults), "--format", "json",
    )  # fmt: skip
    assert fixed.returncode == 0, fixed.stderr
    assert json.loads(fixed.stdout)["controller"] == "fixed"
    assert "num_delegates" not in json.loads(fixed.stdout)  # ran direct: started none
    spec = ExperimentSpec.from_dict(
        {
            "name": "replan",
            "models": ["fig4"],
            "profile": json.loads(profile.read_text()),
            "systems": ["adaptra"],
            "faults": str(faults),
            "num_iterations": 4,
        }
    )
    run_dir = run_experiment(spec, tmp_path / "run")
    with (run_dir / "iterations.csv").open() as rows:
        spec_times = [float(r["iteration_time_ms"]) for r in csv.DictReader(rows)]
    assert data["iteration_times_ms"] == spec_times
    # Re-planned for the slow link it beats the fault-free plan run under it: the oracle from
    # iteration 1, the detector once it has seen it.
    slow = json.loads(fixed.stdout)["iteration_times_ms"]
    assert known["iteration_times_ms"][1] < slow[1] and known["iteration_times_ms"][0] == slow[0]
    assert data["iteration_times_ms"][:2] == slow[:2] and data["iteration_times_ms"][2] < slow[2]
    both = cli("run", "--profile", str(profile), "--system", "adaptra", "--policy", "zb")
    assert both.returncode == 1 and "give no --policy, --schedule or --comm" in both.stderr


def test_a_fault_on_one_replica_s_pp_link_slows_that_replica_only_in_sim() -> None:
    """`pp1:0-1` is replica 1's link only: its messages take the delay, replica 0's do not,
    and the DP step waits for the slower replica."""
    profile = Profile.uniform(2, 4, 1, 1, 1, num_replicas=2, allreduce_bytes=(1024, 1024))
    faults = parse_yaml('[{start_iteration: 0, links: ["pp1:0-1"], delay_ms: 30}]')
    run = run_configuration(
        fixed_plan(one_f_one_b(profile), profile),
        num_iterations=1,
        num_warmup_iterations=0,
        faults=faults,
    )
    assert run.timeline is not None
    fault_ms = {r: {m.fault_ms for m in run.timeline.messages if m.replica == r} for r in (0, 1)}
    assert fault_ms == {0: {0.0}, 1: {30.0}}
    ends = {r: max(op.end_ms for op in run.timeline.ops if op.replica == r) for r in (0, 1)}
    assert ends[1] >= ends[0] + 30.0
    assert run.timeline.iterations[0].end_ms >= ends[1]


def test_a_run_shows_its_failovers_in_json_text_and_trace(tmp_path: Path) -> None:
    """host2:rnic0 fails in measured iteration 2: adaptra-cpu's delegates of stage 2's four
    link directions fail over to rnic1 then (the trace numbers iterations as run, so with one
    warm-up they are its iteration 3)."""
    faults = tmp_path / "nic.yaml"
    faults.write_text("- {start_iteration: 2, nic: 'host2:rnic0', down: true}\n")
    profile = write_profile(tmp_path, microbatches=8)
    trace = tmp_path / "trace.json"
    common = ["run", "--profile", str(profile), "--system", "adaptra-cpu", "--iterations", "4"]
    common += ["--faults", str(faults)]
    out = cli(*common, "--format", "json", "--trace", str(trace))
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert (data["restarts"], [r["failovers"] for r in data["iterations"]]) == (0, [0, 0, 4, 0])
    events = json.loads(trace.read_text())["traceEvents"]
    moves = [e for e in events if e.get("cat") == "failover"]
    assert len(moves) == 4 and {e["name"] for e in moves} == {"failover rnic0 -> rnic1"}
    assert {(e["args"]["iteration"], e["args"]["cause"]) for e in moves} == {(3, "fault hook")}
    text = cli(*common)
    assert text.returncode == 0, text.stderr
    assert "4 failover(s) to another NIC: 4 in iteration 2 (--trace shows when and why)" in (
        text.stdout.splitlines()
    )
