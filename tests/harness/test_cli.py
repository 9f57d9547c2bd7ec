"""The machine-readable CLI of docs/design.md, run as a user runs it: in a subprocess."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.policies import noisy_ring_warning
from harness.results import git_revision
from pipeline.profile import Profile
from tests.fidelity import HANG

FIG4_PROFILE = {"stages": 4, "microbatches": 12, "t_f": 10, "t_b": 10, "t_w": 10}


def cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=None if env is None else {**os.environ, **env},
    )


def write_profile(tmp_path: Path, **changes) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({**FIG4_PROFILE, **changes}))
    return path


def test_schedule_json_contract(tmp_path: Path) -> None:
    out = cli(
        "schedule",
        "--profile",
        str(write_profile(tmp_path)),
        "--policy",
        "zb-h2",
        "--format",
        "json",
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert set(data) == {
        "policy",
        "method",
        "warmup",
        "stages",
        "iteration_time_ms",
        "generation_ms",
    }
    assert data["policy"] == "zb-h2"
    assert data["warmup"] == [7, 5, 3, 1]
    assert data["iteration_time_ms"] == 390.0
    assert len(data["stages"]) == 4 and len(data["stages"][0]) == 36
    assert 0 <= data["generation_ms"] < 1000


@pytest.mark.parametrize("command", ["schedule", "simulate", "launch"])
def test_system_is_run_s_and_the_others_say_to_give_policy(tmp_path: Path, command: str) -> None:
    """`run --system adaptra` is a whole system (re-planning, delegates); `--policy adaptra`
    only orders the ops: the other commands do not take --system as its alias."""
    profile = str(write_profile(tmp_path))
    out = cli(command, "--profile", profile, "--system", "adaptra")
    assert out.returncode == 2
    assert f"--system is run's (a policy with its comm and controller); {command} takes " in (
        out.stderr
    )
    assert "--policy adaptra" in out.stderr
    assert "--system" not in cli(command, "--help").stdout


def test_delays_count(tmp_path: Path) -> None:
    out = cli(
        "schedule",
        "--profile",
        str(write_profile(tmp_path, delay_ms=[20, 0, 0])),
        "--policy",
        "1f1b",
        "--format",
        "json",
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["warmup"] == [4, 3, 2, 1]
    assert data["iteration_time_ms"] > 450.0  # the fault-free (N+S-1)(tF+tB+tW)
    simulated = cli(
        "simulate",
        "--profile",
        str(write_profile(tmp_path, delay_ms=[20, 0, 0])),
        "--policy",
        "1f1b",
        "--comm",
        "ideal",
        "--format",
        "json",
    )
    assert json.loads(simulated.stdout)["iteration_time_ms"] == data["iteration_time_ms"]


@pytest.mark.parametrize(
    ("c0", "expected"), [(None, 390), (10, 400), (20, 440), (30, 500), (40, 560)]
)
def test_simulate_the_fig4_fixture(tmp_path: Path, fig4_path: Path, c0, expected) -> None:
    args = ["simulate", "--schedule", str(fig4_path), "--comm", "ideal", "--format", "json"]
    if c0 is not None:  # without --profile, the fixture's own profile (no delay) is used
        args += ["--profile", str(write_profile(tmp_path, delay_ms=[c0, 0, 0]))]
    out = cli(*args)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["iteration_time_ms"] == expected
    assert len(data["stages"]) == 4
    assert set(data["stages"][0]) == {"busy_ms", "idle_ms", "peak_memory"}


def test_simulate_writes_trace_and_plot(tmp_path: Path, fig4_path: Path) -> None:
    trace, plot = tmp_path / "t.json", tmp_path / "g.png"
    out = cli(
        "simulate",
        "--schedule",
        str(fig4_path),
        "--comm",
        "direct",
        "--trace",
        str(trace),
        "--plot",
        str(plot),
    )
    assert out.returncode == 0, out.stderr
    assert "iteration 390 ms" in out.stdout
    assert len(json.loads(trace.read_text())["traceEvents"]) > 144
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_run_sim_json_contract(tmp_path: Path) -> None:
    out = cli(
        "run",
        "--backend",
        "sim",
        "--profile",
        str(write_profile(tmp_path, delay_ms=[40, 0, 0])),
        "--policy",
        "zb-h2",
        "--comm",
        "direct",
        "--iterations",
        "3",
        "--format",
        "json",
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["iteration_times_ms"] == [1050.0] * 3
    assert data["median_iteration_ms"] == data["median_wall_ms"] == 1050.0
    assert data["step_times_ms"] == [0.0] * 3


def test_run_reports_the_time_per_step_where_a_dp_step_follows_the_pipeline(
    tmp_path: Path,
) -> None:
    """With DP replicas the all-reduce and optimizer step follow the pipeline, and a slow DP
    link shows there only: `run` gives the median with the step too (text and JSON), not
    the pipeline's alone."""
    profile = write_profile(tmp_path, dp=2, allreduce_bytes=1 << 20, dp_delay_ms={"dp0:0-1": 300})
    args = ("run", "--backend", "sim", "--profile", str(profile), "--policy", "1f1b")
    data = json.loads(cli(*args, "--iterations", "3", "--format", "json").stdout)
    steps = data["step_times_ms"]
    assert min(steps) > 300.0  # the DP link's delay is in the step
    assert data["median_wall_ms"] == pytest.approx(data["median_iteration_ms"] + steps[1])
    text = cli(*args, "--iterations", "3").stdout
    assert f"({data['median_wall_ms']:.3f} ms with the all-reduce and optimizer step)" in text


def test_torch_csv_format(tmp_path: Path) -> None:
    out = cli(
        "schedule",
        "--profile",
        str(write_profile(tmp_path)),
        "--policy",
        "zb-h1",
        "--format",
        "torch-csv",
    )
    assert out.returncode == 0, out.stderr
    rows = out.stdout.strip().splitlines()
    assert len(rows) == 4
    # ZB-H1's stage 0 runs its W right after its B; I is torch's name for backward-input.
    assert rows[0].split(",")[:7] == ["0F0", "0F1", "0F2", "0F3", "0I0", "0W0", "0F4"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["schedule", "--profile", "{p}", "--policy", "1f1b", "--schedule", "{p}"],
            "give exactly one of --policy and --schedule",
        ),
        (["schedule", "--profile", "{missing}", "--policy", "1f1b"], "cannot read profile"),
        (["schedule", "--profile", "{bad}", "--policy", "1f1b"], "t_f has 2 entries"),
        (["simulate", "--profile", "{p}", "--schedule", "{broken}"], "deadlock: stage 0"),
        (
            [
                "run",
                "--backend",
                "megatron",
                "--model",
                "nope",
                "--profile",
                "{p}",
                "--policy",
                "1f1b",
            ],
            "unknown model 'nope'; valid models: tiny",
        ),
        (
            ["run", "--backend", "megatron", "--model", "tiny"],
            "--backend, --model: without --profile/--policy/--schedule/--system, run runs "
            "the default experiment",
        ),
        (
            ["run", "--backend", "sim", "--model", "tiny", "--profile", "{p}", "--policy", "1f1b"],
            "--model applies to --backend megatron only",
        ),
        (
            ["profile", "--model", "tiny", "--stages", "3", "--out", "{missing}"],
            "which 3 stages cannot split evenly; valid stage counts: 1, 2, 4, 8",
        ),
        (["schedule", "--profile", "{tight}", "--policy", "zb-h2"], "mem_limit is 3"),
    ],
)
def test_errors_are_one_line_and_non_zero(
    tmp_path: Path, fig4_fixture: dict, args: list[str], message: str
) -> None:
    paths = {
        "p": write_profile(tmp_path),
        "missing": tmp_path / "missing.json",
        "bad": tmp_path / "bad.json",
        "broken": tmp_path / "broken.json",
        "tight": tmp_path / "tight.json",
    }
    paths["bad"].write_text(json.dumps({**FIG4_PROFILE, "t_f": [1, 2]}))
    paths["tight"].write_text(json.dumps({**FIG4_PROFILE, "mem_limit": 3}))
    # Stage 0 waits for BW0's gradient before sending F1, which stage 1 needs first.
    stage_0 = ["F0", "BW0"] + [f"F{m}" for m in range(1, 12)] + [f"BW{m}" for m in range(1, 12)]
    paths["broken"].write_text(json.dumps({"stages": [stage_0, *fig4_fixture["stages"][1:]]}))
    out = cli(*[a.format(**{k: str(v) for k, v in paths.items()}) for a in args])
    assert out.returncode == 1
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("name", ["1f1b\nzb", "1f1b\u2028zb", "1f1b\rzb"])
def test_an_error_quoting_an_input_s_line_break_stays_one_line(tmp_path: Path, name: str) -> None:
    """A refused value with a line break in it (a YAML string's "\\n"), quoted as it is by the
    error (an unknown system, spec key or model field), is one line still: the break is
    written escaped, as repr writes it, so nothing after it looks like a line of its own."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({"name": "x", "models": ["gpt2-7b"], "systems": [name]}))
    out = cli("run", "--spec", str(spec))
    assert out.returncode == 1
    (line,) = out.stderr.splitlines()
    assert line.startswith("error: ") and f"unknown system {repr(name)[1:-1]};" in line


def test_a_long_usage_error_is_cut_before_the_help_it_names() -> None:
    """A usage error quoting a 3,000-character value: its message is cut after 2,000
    characters, saying how long it was, and the help to read still ends the line (it was
    cut off with the rest)."""
    out = cli("run", "--backend", "x" * 3000)
    assert out.returncode == 2
    (line,) = out.stderr.splitlines()
    assert line.endswith(" characters in all) (see adaptra-bench run --help)")
    assert len(line) < 2000 + 100


def test_torch_csv_imports_back(tmp_path: Path) -> None:
    profile = str(write_profile(tmp_path, delay_ms=[10, 0, 0]))
    exported = cli("schedule", "--profile", profile, "--policy", "zb-h1", "--format", "torch-csv")
    direct = cli("simulate", "--profile", profile, "--policy", "zb-h1", "--format", "json")
    for name in ("zb_h1.csv", "zb_h1.torch-csv"):  # known by its content, not its name
        csv_path = tmp_path / name
        csv_path.write_text(exported.stdout)
        via_csv = cli(
            "simulate", "--profile", profile, "--schedule", str(csv_path), "--format", "json"
        )
        assert via_csv.returncode == 0, via_csv.stderr
        assert (
            json.loads(via_csv.stdout)["iteration_time_ms"]
            == json.loads(direct.stdout)["iteration_time_ms"]
        )


@pytest.mark.parametrize(
    ("policy", "extra", "method", "time_ms"),
    [
        # The search meets the lower bound: optimal, so no CP-SAT even with a time limit (it
        # said only "alg2+generator+search", where `milp` said it was proven)
        ("adaptra", [], "alg2+generator+search: at the lower bound, optimal", 410.0),
        (
            "adaptra",
            ["--time-limit", "20"],
            "alg2+generator+search: at the lower bound, optimal",
            410.0,
        ),
        (
            "milp",
            ["--time-limit", "20"],
            "adaptra's, proven optimal (alg2+generator+search): no solve",
            410.0,
        ),
        ("adaptra-initial", [], "alg1+generator", 410.0),
        ("zb", [], "automatic heuristic, fault-free order", 470.0),
    ],
)
def test_scheduler_policies(tmp_path: Path, policy, extra, method, time_ms) -> None:
    out = cli(
        "schedule",
        "--profile",
        str(write_profile(tmp_path, delay_ms=[20, 0, 0])),
        "--policy",
        policy,
        *extra,
        "--format",
        "json",
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert (data["policy"], data["method"], data["iteration_time_ms"]) == (policy, method, time_ms)
    assert data["generation_ms"] > 0


@pytest.mark.parametrize(
    ("policy", "header"),
    [
        (
            "1f1b",
            "policy 1f1b (megatron warm-up), warm-up [4, 3, 2, 1], ideal iteration time 450 ms",
        ),
        ("zb-h1", "policy zb-h1 (handcrafted), warm-up [4, 3, 2, 1], ideal iteration time 390 ms"),
        ("zb-h2", "policy zb-h2 (handcrafted), warm-up [7, 5, 3, 1], ideal iteration time 390 ms"),
        (
            "zb",
            "policy zb (automatic heuristic, fault-free order), warm-up [7, 5, 3, 1], "
            "ideal iteration time 390 ms",
        ),
        (
            "adaptra-initial",
            "policy adaptra-initial (alg1+generator), warm-up [7, 5, 3, 1], "
            "ideal iteration time 390 ms",
        ),
    ],
)
def test_the_text_header_names_the_policy_once(tmp_path: Path, policy: str, header: str) -> None:
    """Not `policy zb-h2 (zb-h2 (handcrafted))`: the parentheses say how it was made."""
    profile = str(write_profile(tmp_path))
    out = cli("schedule", "--profile", profile, "--policy", policy, "--format", "text")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == header


def test_the_text_header_of_a_given_schedule_names_its_file(tmp_path: Path) -> None:
    profile = str(write_profile(tmp_path))
    exported = cli("schedule", "--profile", profile, "--policy", "zb-h2", "--format", "json")
    given = tmp_path / "zb_h2.json"
    given.write_text(exported.stdout)
    out = cli("schedule", "--profile", profile, "--schedule", str(given), "--format", "text")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == (
        f"schedule file {given}, warm-up [7, 5, 3, 1], ideal iteration time 390 ms"
    )


@pytest.mark.multiprocess
def test_run_emulated_json_contract(tmp_path: Path) -> None:
    profile = write_profile(
        tmp_path, stages=2, microbatches=4, t_f=5, t_b=5, t_w=5, delay_ms=[10], message_bytes=4096
    )
    out = cli(
        "run",
        "--backend",
        "emulated",
        "--profile",
        str(profile),
        "--policy",
        "1f1b",
        "--iterations",
        "2",
        "--format",
        "json",
        "--trace",
        str(tmp_path / "trace.json"),
        "--plot",
        str(tmp_path / "gantt.png"),
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    # The simulator's trace and Gantt code read the real run: 3 iterations (1 warm-up) x 16 ops.
    spans = [
        e
        for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
        if e["ph"] == "X" and e["pid"] == 0
    ]
    assert len(spans) == 3 * 2 * 4 * 2
    assert (tmp_path / "gantt.png").read_bytes()[:4] == b"\x89PNG"
    simulated = json.loads(
        cli(
            "run",
            "--backend",
            "sim",
            "--profile",
            str(profile),
            "--policy",
            "1f1b",
            "--iterations",
            "1",
            "--format",
            "json",
        ).stdout
    )
    predicted = simulated["median_iteration_ms"]
    assert len(data["iteration_times_ms"]) == 2
    times = data["iteration_times_ms"]  # load only adds: the fastest bounded, not each
    assert all(t >= predicted for t in times) and min(times) < HANG * predicted, times


def test_launch_prints_one_torchrun_command_per_node(tmp_path: Path) -> None:
    profile = write_profile(tmp_path)  # 4 stages
    out = cli(
        "launch",
        "--profile",
        str(profile),
        "--policy",
        "zb-h1",
        "--nodes",
        "2",
        "--master-addr",
        "10.1.2.3",
        "--out",
        "launch",  # relative to where it runs: the commands name it whole, for every node
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    commands = out.stdout.strip().splitlines()
    assert len(commands) == 2
    folder = (tmp_path / "launch").resolve()
    for node_rank, command in enumerate(commands):
        assert "-m torch.distributed.run --nnodes=2 --nproc-per-node=2" in command
        assert f"--node-rank={node_rank} --master-addr=10.1.2.3" in command
        assert "-m pipeline.runtime.torchrun" in command
        # its logs and its workers' output in OUT, not a temporary folder left on each node
        assert f"--log-dir={folder / 'torchrun-logs'} --tee=3 " in command
        assert f"--profile {folder / 'profile.json'} " in command
        assert "--warmup-iterations 1 --iterations 3 --timeout 60.0 " in command
    assert out.stderr.strip() == (
        f"(wrote the profile and schedule they read to {folder}: every node needs them at "
        "that path)"
    )
    saved = json.loads((tmp_path / "launch" / "schedule.json").read_text())
    assert len(saved["stages"]) == 4
    uneven = cli(
        "launch",
        "--profile",
        str(profile),
        "--policy",
        "zb-h1",
        "--nodes",
        "3",
        "--out",
        str(tmp_path / "launch"),
    )
    assert uneven.returncode == 1 and "do not split evenly over 3 nodes" in uneven.stderr
    no_master = cli("launch", "--profile", str(profile), "--policy", "zb-h1", "--nodes", "2")
    assert no_master.returncode == 1 and "--nodes 2 needs --master-addr" in no_master.stderr


def test_launch_refuses_a_delay_its_workers_would_time_out_on(tmp_path: Path) -> None:
    """The workers wait 60 s for one message unless --timeout says otherwise: a longer
    delay was launched (and its receiver timed out); now it is refused before anything is
    written or run, and --timeout reaches the workers."""
    profile = write_profile(tmp_path, stages=2, microbatches=2, delay_ms=[61000])
    out_dir = tmp_path / "launch"
    for mode in ([], ["--run"]):
        refused = cli(
            "launch", "--profile", str(profile), "--policy", "1f1b", *mode,
            "--out", str(out_dir),
        )  # fmt: skip
        assert refused.returncode == 1
        assert refused.stderr.strip() == (
            "error: a delay of 61000 ms is not shorter than the workers' 60 s timeout for one "
            "message: raise the timeout (--timeout, a spec's transport_timeout_s) or lower the "
            "delay"
        )
        assert refused.stdout == "" and not out_dir.exists()
    raised = cli(
        "launch", "--profile", str(profile), "--policy", "1f1b", "--timeout", "61.5",
        "--out", str(out_dir),
    )  # fmt: skip
    assert raised.returncode == 0, raised.stderr
    (command,) = raised.stdout.strip().splitlines()
    assert " --iterations 3 --timeout 61.5 --out " in command
    spec = cli("launch", "--spec", "s.yaml", "--timeout", "61.5", cwd=tmp_path)
    assert spec.returncode == 1 and "error: --timeout: --spec takes" in spec.stderr


def test_launch_s_time_limit_is_an_option_of_run_said_in_the_help(tmp_path: Path) -> None:
    """It was a fixed 600 s, said nowhere (its stopping is in test_signals)."""
    help_text = " ".join(cli("launch", "--help").stdout.split())
    assert "--run-timeout-s" in help_text and "[default: 600.0;" in help_text
    profile = write_profile(tmp_path, stages=2, microbatches=2)
    printed = cli(
        "launch", "--profile", str(profile), "--policy", "1f1b", "--run-timeout-s", "5",
        "--out", str(tmp_path / "launch"),
    )  # fmt: skip
    assert printed.returncode == 1
    assert printed.stderr.strip() == "error: --run-timeout-s: it limits a launch with --run"


@pytest.mark.multiprocess
def test_launch_runs_under_torchrun_here(tmp_path: Path) -> None:
    profile = write_profile(
        tmp_path, stages=2, microbatches=4, t_f=5, t_b=5, t_w=5, delay_ms=[10], message_bytes=4096
    )
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    out = cli(
        "launch",
        "--profile",
        str(profile),
        "--policy",
        "1f1b",
        "--run",
        "--iterations",
        "2",
        "--out",
        str(tmp_path / "run"),
        env={"TMPDIR": str(scratch)},
    )
    assert out.returncode == 0, out.stderr
    assert list(scratch.iterdir()) == []  # torchrun's log folder is gone with the run
    data = json.loads(out.stdout)
    assert len(data["iteration_times_ms"]) == 2
    times = data["iteration_times_ms"]  # sim: 125 ms; load only adds: the fastest bounded
    assert all(t >= 125.0 for t in times) and min(times) < HANG * 125.0, times
    timeline = json.loads(Path(data["timeline"]).read_text())
    assert len(timeline["ops"]) == 2 * 2 * 4 * 2  # 2 iterations x 2 stages x (F, BW) x N


def test_a_failed_launch_says_what_its_workers_said(tmp_path: Path) -> None:
    """torchrun's output ends in its summary banner: the error line was a row of "="."""
    profile = write_profile(tmp_path, stages=2, microbatches=2)
    out = cli(
        "launch", "--profile", str(profile), "--policy", "1f1b", "--run",
        "--out", str(tmp_path / "run"), env={"GLOO_SOCKET_IFNAME": "no-such-nic"},
    )  # fmt: skip
    assert out.returncode != 0
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("error: torchrun failed with exit code 1: RuntimeError: ")
    assert line.endswith("Unable to find address for: no-such-nic")


@pytest.mark.multiprocess
def test_a_launch_that_fails_after_start_up_says_which_rank_said_what(tmp_path: Path) -> None:
    """Once the process group exists, torch prefixes a worker's lines with "[rankN]: ": the
    reason was torchrun's banner of "=". Rank 0 fails as it writes the timeline (a folder
    is in its place), after the iteration ran."""
    profile = write_profile(tmp_path, stages=2, microbatches=2)
    (tmp_path / "run" / "timeline.json").mkdir(parents=True)
    out = cli(
        "launch", "--profile", str(profile), "--policy", "1f1b", "--run", "--iterations", "1",
        "--warmup-iterations", "0", "--out", str(tmp_path / "run"),
    )  # fmt: skip
    assert out.returncode == 1
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("error: torchrun failed with exit code 1: rank 0: IsADirectoryError: ")
    assert line.endswith(f"-> '{tmp_path / 'run' / 'timeline.json'}'")


def test_run_with_a_fault_timeline(tmp_path: Path) -> None:
    faults = tmp_path / "faults.txt"
    faults.write_text("1;0_1;0.02 3;0_1;0\n")  # 20 ms on link 0-1 in iterations 1 and 2
    out = cli(
        "run",
        "--profile",
        str(write_profile(tmp_path, delay_ms=[20, 0, 0])),
        "--policy",
        "zb-h2",
        "--iterations",
        "4",
        "--faults",
        str(faults),
        "--format",
        "json",
    )
    assert out.returncode == 0, out.stderr
    # 20 ms from the profile, 40 ms while the timeline adds its 20 (ZB-H2 over direct).
    assert json.loads(out.stdout)["iteration_times_ms"] == [710.0, 1050.0, 1050.0, 710.0]
    faults.write_text("9;0_1;0.02\n")
    late = cli(
        "run",
        "--profile",
        str(write_profile(tmp_path)),
        "--policy",
        "zb-h2",
        "--iterations",
        "4",
        "--faults",
        str(faults),
    )
    assert late.returncode == 1
    assert "fault row 1: starts at iteration 9 but the run has 4" in late.stderr


@pytest.mark.parametrize("run_id", ["../escaped", "/tmp/absolute", "a/b", "..", "a\nb"])
def test_a_run_id_is_one_folder_inside_out(tmp_path: Path, run_id: str) -> None:
    out = cli("run", "--out", str(tmp_path / "results"), "--run-id", run_id, cwd=tmp_path)
    assert out.returncode == 2, out.stderr  # a usage error
    assert "--run-id" in out.stderr
    assert "single path component" in out.stderr or "control character '\\n'" in out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written, anywhere


def test_a_spec_name_is_one_folder_inside_out(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "name: ../../escaped\nmodel: m\nsystems: [1f1b]\n"
        "profile: {stages: 2, microbatches: 2, t_f: 1, t_b: 1, t_w: 1}\n"
    )
    out = cli("run", "--spec", str(spec), "--out", str(tmp_path / "a" / "results"))
    assert out.returncode == 1
    assert "spec name '../../escaped' must be a single path component" in out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_that_an_extension_turned_into_another_error_still_ends_the_command(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    stop: signal.Signals,
) -> None:
    """A shutdown signal whose exception a C extension's import met and raised another
    from (matplotlib's `_image`: `ImportError: initialization failed`, seen under load): the
    command ends as the signal ends it, one line and 128 + n, not as an internal error (exit
    3, "a bug")."""
    from harness.cli import main

    def met_by_an_extension(*args: object, **kwargs: object) -> None:
        try:
            os.kill(os.getpid(), stop)  # its handler raises at the next bytecode
            time.sleep(30)  # (a hang bound: it came before)
        except BaseException as err:
            raise ImportError("initialization failed") from err

    monkeypatch.setattr("harness.commands_schedule.resolve", met_by_an_extension)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))  # no crash log may be written
    with pytest.raises(SystemExit) as exited:
        main(["schedule", "--profile", str(write_profile(tmp_path)), "--policy", "1f1b"])
    assert exited.value.code == 128 + stop
    said = "interrupted (SIGINT)" if stop == signal.SIGINT else "terminated (SIGTERM)"
    assert capsys.readouterr().err.splitlines() == [said]
    assert list(tmp_path.glob("adaptra-bench-internal-error-*")) == []


def test_a_bug_is_an_internal_error_with_a_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 3 and one line naming a log with the traceback; refused input stays exit 1."""
    from harness.cli import main

    def planner_bug(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("a planner bug")

    monkeypatch.setattr("harness.commands_schedule.resolve", planner_bug)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    profile = str(write_profile(tmp_path))
    with pytest.raises(SystemExit) as exited:
        main(["schedule", "--profile", profile, "--policy", "1f1b"])
    assert exited.value.code == 3
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("internal error: ZeroDivisionError: a planner bug (a bug; traceback in")
    log = Path(line.removesuffix(")").rsplit(" ", 1)[-1])
    assert log.parent == tmp_path and log.name.startswith("adaptra-bench-internal-error-")
    text = log.read_text()
    assert text.startswith(f"adaptra-bench schedule --profile {profile} --policy 1f1b\n")
    assert "Traceback" in text and "in planner_bug" in text
    monkeypatch.undo()
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(["schedule", "--profile", str(tmp_path / "missing.json"), "--policy", "1f1b"])
    assert exited.value.code == 1  # a refused input
    assert capsys.readouterr().err.startswith("error: cannot read profile ")
    with pytest.raises(SystemExit) as exited:
        main(["schedule", "--profile", profile, "--policy", "1f1b", "--colour", "red"])
    assert exited.value.code == 2  # a usage error


@pytest.mark.multiprocess
def test_calibrate_then_simulate_a_real_host(tmp_path: Path) -> None:
    """`calibrate` measures real worker processes (no timing is asserted: only that the
    costs are there); `simulate`/`run --calibration` then add them to the direct model."""
    host = tmp_path / "host.json"
    out = cli(
        "calibrate", "--out", str(host), "--repeats", "1", "--op-ms", "3", "--stages", "2",
        "--format", "json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "8388608 B, ops of 3 ms: send" in out.stderr  # measured with the ops asked for
    costs = json.loads(host.read_text())
    assert costs == json.loads(out.stdout) and costs["schema_version"] == 5
    # what the runs to predict must match: the ops asked for, the stages, the code
    assert (costs["op_ms"], costs["num_stages"]) == (3.0, 2)
    assert costs["git_revision"] == git_revision()
    from pipeline.runtime.calibrate import RING_CHUNK_SIZES, SEND_SIZES

    delegated = ("copy_out_ms_by_bytes", "delegate_transfer_ms_by_bytes", "copy_in_ms_by_bytes")
    for name in ("send_ms_by_bytes", *delegated):
        assert [size for size, _ in costs[name]] == list(SEND_SIZES), name  # each measured
    for name in ("ring_lag_ms_by_rings", "delegated_ring_lag_ms_by_rings"):
        assert [rings for rings, _ in costs[name]] == [1, 2], name  # 1 to 2 at once
        for _, by_bytes in costs[name]:  # each at every chunk size
            assert [size for size, _ in by_bytes] == list(RING_CHUNK_SIZES), name
    assert all(ms > 0 for _, ms in costs["send_ms_by_bytes"])  # a real send takes time
    assert costs["copy_out_ms_by_bytes"][-1][1] > 0  # measured: a copy of 8 MiB
    assert costs["delegate_transfer_ms_by_bytes"][-1][1] > 0  # and its way to the receiver
    assert costs["op_overhead_ms"] >= 0 and costs["delegate_pickup_ms"] >= 0
    profile = str(write_profile(tmp_path, message_bytes=1 << 20))

    def simulated_ms(*extra: str) -> float:
        done = cli("simulate", "--profile", profile, "--policy", "1f1b", "--format", "json", *extra)
        assert done.returncode == 0, done.stderr
        return float(json.loads(done.stdout)["iteration_time_ms"])

    free, calibrated = (
        simulated_ms("--comm", "direct"),
        simulated_ms("--comm", "direct", "--calibration", str(host)),
    )
    assert calibrated >= free == 450.0
    ideal = cli("simulate", "--profile", profile, "--policy", "1f1b", "--calibration", str(host))
    assert ideal.returncode == 1  # ideal, the paper's model, takes no host costs: refused
    assert "--calibration adds this host's runtime costs to comm direct" in ideal.stderr
    ran = cli(
        "run", "--profile", profile, "--policy", "1f1b", "--format", "json",
        "--calibration", str(host),
    )  # fmt: skip
    assert ran.returncode == 0
    assert json.loads(ran.stdout)["median_iteration_ms"] == pytest.approx(calibrated)
    assert (
        "warning: the calibration ran 2 stages with 3 ms ops, this run 4 with 10 ms forwards"
        in ran.stderr
    )
    refused = cli(
        "run", "--backend", "emulated", "--profile", profile, "--policy", "1f1b",
        "--calibration", str(host),
    )  # fmt: skip
    assert refused.returncode == 1 and "a calibration is for the simulator" in refused.stderr
    assert "warning" not in refused.stderr  # refused before its file's warnings


def test_a_delay_past_the_worker_timeout_is_refused_up_front(tmp_path: Path) -> None:
    profile = str(write_profile(tmp_path, stages=2, microbatches=2, delay_ms=[2500]))
    common = ["run", "--profile", profile, "--policy", "1f1b"]
    late = cli(*common, "--backend", "emulated", "--timeout", "2")
    assert late.returncode == 1
    assert "a delay of 2500 ms is not shorter than the workers' 2 s timeout" in late.stderr
    sim = cli(*common, "--timeout", "2")
    assert sim.returncode == 1 and "--timeout is the runtime workers'" in sim.stderr
    bad = cli(*common, "--backend", "emulated", "--timeout", "0")
    assert bad.returncode == 2 and "--timeout" in bad.stderr
    faults = tmp_path / "faults.yaml"
    faults.write_text('[{start_iteration: 1, links: ["0-1"], delay_ms: 900, jitter_ms: 200}]\n')
    quiet = str(write_profile(tmp_path, stages=2, microbatches=2, delay_ms=[0]))
    timeline = ["run", "--profile", quiet, "--policy", "1f1b", "--backend", "emulated"]
    late = cli(*timeline, "--faults", str(faults), "--timeout", "1")
    assert late.returncode == 1  # 900 + 200 ms of the timeline's, before any worker starts
    assert "a delay of 1100 ms is not shorter than the workers' 1 s timeout" in late.stderr
    # Kinds on one target add up on a message: 600 ms of delay and 600 of stall hold 1200.
    faults.write_text(
        '[{start_iteration: 1, links: ["0-1"], delay_ms: 600},'
        ' {start_iteration: 1, links: ["0-1"], stall_ms: 600}]\n'
    )
    late = cli(*timeline, "--faults", str(faults), "--timeout", "1")
    assert late.returncode == 1
    assert "a delay of 1200 ms is not shorter than the workers' 1 s timeout" in late.stderr


@pytest.mark.multiprocess
def test_a_temporary_folder_too_deep_for_the_fork_server_s_socket_is_one_clear_line(
    tmp_path: Path,
) -> None:
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    profile = write_profile(tmp_path, stages=2, microbatches=2)
    out = cli(
        "run", "--backend", "emulated", "--profile", str(profile), "--policy", "1f1b",
        "--iterations", "1", env={"TMPDIR": str(deep)},
    )  # fmt: skip
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f"error: the temporary folder {deep} has too long a path for the worker fork server's "
        "socket (108 bytes in all): set TMPDIR to a shorter one"
    ]
    assert list(deep.iterdir()) == []  # nothing left behind


def test_run_s_seed_draws_the_fault_timeline_s_jitter(tmp_path: Path) -> None:
    """`run --seed` seeds a timeline's draws: another seed, other iteration times; the same
    seed, the same ones (the simulator: exact)."""
    profile = str(write_profile(tmp_path, stages=2, microbatches=4))
    faults = tmp_path / "faults.yaml"
    faults.write_text('[{start_iteration: 0, links: ["0-1"], delay_ms: 20, jitter_ms: 10}]\n')
    common = ["run", "--profile", profile, "--policy", "1f1b", "--faults", str(faults)]
    runs = {}
    for name, seed in (("a", "7"), ("b", "7"), ("c", "8")):
        out = cli(*common, "--seed", seed, "--format", "json")
        assert out.returncode == 0, out.stderr
        runs[name] = json.loads(out.stdout)
    assert runs["a"]["seed"] == 7 and runs["c"]["seed"] == 8
    assert runs["a"]["iteration_times_ms"] == runs["b"]["iteration_times_ms"]
    assert runs["a"]["iteration_times_ms"] != runs["c"]["iteration_times_ms"]


def test_adaptra_warns_where_its_detector_has_no_healthy_link(tmp_path: Path) -> None:
    """A 2-stage pipeline's one PP link delayed from the start: Adaptra's detector has
    nothing to compare it with (it runs ZB's plan over direct throughout); the run says so
    before it starts, and runs. A system that reads no measurement is not warned."""
    profile = str(write_profile(tmp_path, stages=2, microbatches=4, delay_ms=[30]))
    common = ["run", "--profile", profile, "--iterations", "2", "--format", "json"]
    adaptra = cli(*common, "--system", "adaptra")
    assert adaptra.returncode == 0, adaptra.stderr
    assert adaptra.stderr.startswith(
        "warning: adaptra finds slow links by comparing them with healthy ones, and every PP "
        "link here is delayed from the first iteration: it will see none slow"
    )
    assert all(not i["detected_ms"] for i in json.loads(adaptra.stdout)["iterations"])
    zb = cli(*common, "--system", "zb")
    assert zb.returncode == 0 and zb.stderr == ""


def test_report_on_a_folder_that_is_no_run_directory_leaves_it_as_it_was(
    tmp_path: Path,
) -> None:
    """One line, exit 1, and no lock file left behind in the user's folder."""
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "a.txt").write_text("mine\n")
    out = cli("report", str(folder))
    assert out.returncode == 1
    assert out.stderr == f"error: {folder} is not a run directory: it has no spec.json\n"
    assert [p.name for p in folder.iterdir()] == ["a.txt"]


def test_run_s_help_says_where_every_experiment_writes_and_lists_the_options_whole() -> None:
    """--out said "Where the default experiment writes its run directory" (a --spec one
    writes there too), and the description read "--policy/ --schedule"."""
    from click.testing import CliRunner

    from harness.commands_run import run

    help_text = " ".join(CliRunner().invoke(run, ["--help"]).output.split())
    assert "Where an experiment (--spec, or the default one) writes its run directory" in help_text
    assert "with none of --profile, --policy, --schedule and --system." in help_text
    assert "/ " not in help_text


def test_adaptra_warns_where_its_rings_chunks_are_too_large_to_judge_on_a_runtime(
    tmp_path: Path,
) -> None:
    """A 16 MiB gradient per stage in one bucket over 2 replicas: 8 MiB chunks, whose time on
    a loaded host moves by more than the detector's onset (a fault-free run of the README's
    example profile then had healthy rings called slow and swapped). Said before an emulated
    run starts; not for the simulator (no host), nor chunks of 2 MiB, nor a system that
    reads no ring."""

    def profile(allreduce_mib: int, bucket_mib: int = 80) -> Profile:
        return Profile.uniform(
            2, 4, 1, 1, 1, num_replicas=2, allreduce_bytes=allreduce_mib << 20,
            dp_bucket_bytes=bucket_mib << 20,
        )  # fmt: skip

    warning = noisy_ring_warning("adaptra-cpu", profile(16), "emulated")
    assert warning is not None and warning.startswith(
        "warning: adaptra-cpu's detector compares the DP rings' chunk times with each other, "
        "and chunks this large (up to 8 MiB) vary on a loaded host by more than its onset"
    )
    assert noisy_ring_warning("adaptra", profile(16, bucket_mib=4), "megatron") is None  # 2 MiB
    assert noisy_ring_warning("adaptra", profile(16), "sim") is None
    assert noisy_ring_warning("zb", profile(16), "emulated") is None
    path = tmp_path / "dp2.json"
    path.write_text(json.dumps({**profile(16).to_dict(), "dp_bucket_bytes": 80 << 20}))
    run = cli("run", "--backend", "emulated", "--profile", str(path), "--system", "adaptra",
              "--iterations", "1", cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stderr.startswith("warning: adaptra's detector compares the DP rings' chunk")


def test_run_shows_the_workers_a_rank_swap_moved(tmp_path: Path) -> None:
    """Adaptra-CPU moves a slow DP ring link onto a PP edge by a rank swap: `run` said nothing
    of it, in its text, its JSON or its trace (only a saved timeline had it). Now a line
    after the median, each iteration's `moved_workers`, a slice per moved worker on the
    track of the position it took, and each message's injected delay in its args."""
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({
        "stages": 4, "microbatches": 8, "t_f": 2, "t_b": 2, "t_w": 2, "dp": 2,
        "message_bytes": 4096, "allreduce_bytes": 750000, "dp_bucket_bytes": 250000,
    }))  # fmt: skip
    faults = tmp_path / "f.yaml"
    faults.write_text('- {start_iteration: 2, links: ["dp1:0-1"], delay_ms: 20}\n')
    common = ["run", "--profile", str(profile), "--system", "adaptra-cpu", "--faults"]
    common += [str(faults), "--iterations", "6"]
    text = cli(*common, "--trace", str(tmp_path / "t.json"))
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines()[1] == (
        "rank swaps moved 2 worker(s): 2 at the start of iteration 5 (--trace shows them)"
    )
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    moves = [e for e in events if e.get("cat") == "swap"]
    swaps = [(e["name"], e["tid"], e["args"]["iteration"]) for e in moves]
    # positions replica x 4 + stage: stage 1 of replica 1 (5) and stage 2 of replica 0 (2)
    assert sorted(swaps) == [
        ("swap from stage 1 replica 1", 2, 6),  # iteration 5 after the warm-up one
        ("swap from stage 2 replica 0", 5, 6),
    ]
    delayed = {e["args"]["fault_ms"] for e in events if e.get("name", "").startswith("c")}
    assert delayed == {0.0, 20.0}  # the ring's chunks, those over the slow pair 20 ms late
    data = json.loads(cli(*common, "--format", "json").stdout)
    assert [i["moved_workers"] for i in data["iterations"]] == [0, 0, 0, 0, 0, 2]
    # Falcon swaps too, and restarts where a link fails: a restart places the workers anew
    # in its first iteration, which is no rank swap (its line says the restart).
    faults.write_text(
        '- {start_iteration: 2, links: ["dp1:0-1"], delay_ms: 20}\n'
        '- {start_iteration: 6, links: ["dp0:0-1"], down: true}\n'
    )
    falcon = ["run", "--profile", str(profile), "--system", "falcon", "--faults", str(faults)]
    trace = tmp_path / "restart.json"
    ran = cli(*falcon, "--iterations", "9", "--format", "json", "--trace", str(trace))
    data = json.loads(ran.stdout)
    moved = [(i["iteration"], i["moved_workers"]) for i in data["iterations"] if i["moved_workers"]]
    assert (data["restarts"], moved) == (1, [(5, 2)])
    (cause,) = data["restart_causes"]  # and what it followed, as the text says it
    assert cause.startswith("LinkFailure: iteration 6: ") and "dp0:0-1" in cause
    # the trace marks it, with its cause, where the run goes on from its checkpoint (the
    # warm-up's end: measured iteration 0 is the trace's 1)
    events = json.loads(trace.read_text())["traceEvents"]
    (restart,) = [e for e in events if e.get("cat") == "restart"]
    assert restart["args"] == {
        "cause": cause,
        "runs again from measured iteration": 0,
        "runs again from iteration (as ops' args: warm-ups first)": 1,
    }
    text = cli(*falcon, "--iterations", "9").stdout
    assert f"  restarted after {cause}\n" in text
    # its medians are over every iteration run: it said "over 9 iterations" (a user review)
    assert text.splitlines()[0].endswith(
        f" over {len(data['iteration_times_ms'])} iterations run (9 measured, "
        f"{data['lost_iterations']} run again after a restart)"
    )
    assert data["lost_iterations"] > 0


def test_run_says_which_iterations_falcon_ran_on_a_rebalanced_split(tmp_path: Path) -> None:
    """20 ms on replica 1's PP link 1-2 in iterations 3-13: Falcon gives replica 0 12 of the
    16 microbatches from iteration 6 until the link is fast again; `run` said nothing of it
    (its JSON records did: `microbatches`)."""
    profile = write_profile(
        tmp_path, stages=4, microbatches=8, t_f=5, t_b=5, t_w=5, message_bytes=4096, dp=2,
        allreduce_bytes=3_000_000, dp_bucket_bytes=125_000,
    )  # fmt: skip
    faults = tmp_path / "f.yaml"
    faults.write_text(
        '- {start_iteration: 3, end_iteration: 14, links: ["pp1:1-2"], delay_ms: 20}\n'
    )
    falcon = ["run", "--profile", str(profile), "--system", "falcon", "--faults", str(faults)]
    lines = cli(*falcon, "--iterations", "20").stdout.splitlines()
    assert lines[1] == (
        "the global batch rebalanced over the DP replicas in 9 iteration(s): 6-14 as 12+4"
    )
    assert "rebalanced" not in cli(*falcon, "--iterations", "5").stdout  # not yet
    # a link down in iteration 9 restarts the run from its start: Falcon keeps its split,
    # and the iterations run again are listed again but counted once
    with faults.open("a") as more:
        more.write('- {start_iteration: 9, end_iteration: 10, links: ["dp0:0-1"], down: true}\n')
    lines = cli(*falcon, "--iterations", "20").stdout.splitlines()
    assert lines[-2] == (
        "the global batch rebalanced over the DP replicas in 10 iteration(s): 6-8 as 12+4, "
        "0 as 12+4, 6-14 as 12+4"
    )


@pytest.mark.multiprocess
def test_a_worker_s_timeout_counts_measured_iterations_and_names_the_holds(
    tmp_path: Path,
) -> None:
    """2 s on link 0-1 passes the check against a 3.5 s timeout (one message's hold), but
    Adaptra-CPU's delegate sends do not block: stage 0's wait for B0 spans F0's hold and
    B0's, and times out. The error read as a dead link, and counted the warm-up in its
    iteration, where the fault timeline and the results count from the first measured."""
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"stages": 2, "microbatches": 2, "t_f": 1, "t_b": 1, "t_w": 1}))
    faults = tmp_path / "f.yaml"
    faults.write_text('- {start_iteration: 0, links: ["0-1"], delay_ms: 2000}\n')
    # 3.5 s is gloo's connect timeout at the start too: room for a loaded host
    out = cli(
        "run", "--backend", "emulated", "--profile", str(profile), "--system", "adaptra-cpu",
        "--faults", str(faults), "--iterations", "2", "--timeout", "3.5",
    )  # fmt: skip
    assert out.returncode == 1
    (line,) = out.stderr.splitlines()
    assert line.startswith("error: rank ") and ", iteration 0, op " in line, line
    assert line.endswith(
        "nothing came within 3.5 s; this run holds a message up to 2000 ms, and one wait can "
        "span several held ones (a chain of slow links, a delegate's send that does not "
        "block, the testbed's handshake): raise the timeout (--timeout, a spec's "
        "transport_timeout_s) above the longest wait"
    ), line


def test_the_command_line_starts_without_torch() -> None:
    """Every command imports the CLI; torch (about 1 s) only where a command needs it: the
    torch-free launch helpers once sat in pipeline.runtime, whose package imports torch, and
    `--help` took 1.3 s instead of 0.24 s."""
    probe = "import sys, harness.cli, harness.collect, harness.slurm; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr


def test_run_sim_times_the_delays_as_the_injection_named_does(tmp_path: Path) -> None:
    """`--inject network` with the simulator: a delay propagates and a cap queues the bytes,
    holding no sender, as on the testbed (257.2 ms measured there for this profile, 258.4 ms
    through the fault hook, which imposes no bandwidth); `--inject hook`, the default: the
    hook's sleep before each send holds the sender for the delay and the bytes."""
    profile = tmp_path / "p.json"
    profile.write_text(
        json.dumps(
            {
                "stages": 2, "microbatches": 4, "t_f": 10, "t_b": 10, "t_w": 10,
                "delay_ms": [20], "message_bytes": 65536, "link_bandwidth_gbps": 0.1,
            }
        )
    )  # fmt: skip
    medians = []
    for injection in ("network", "hook"):
        out = cli(
            "run", "--backend", "sim", "--inject", injection, "--profile", str(profile),
            "--policy", "1f1b", "--iterations", "1", "--format", "json",
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        medians.append(json.loads(out.stdout)["median_iteration_ms"])
    assert medians == pytest.approx([250.97152, 276.2144])
