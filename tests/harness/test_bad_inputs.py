"""Every command and every input file, given bad input of each class (missing, empty, invalid
syntax, wrong types, negative/zero/NaN/huge numbers, wrong lengths, unknown names, path
traversal, options the command would ignore): one error line on stderr, exit status 1 (a
refused input) or 2 (a usage error), and nothing written. A traceback, an internal error
(exit 3), exit 0 or a leftover file fails the case."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.cli import main
from harness.results import ITERATIONS_COLUMNS, RUNS_COLUMNS

PROFILE = {"stages": 3, "microbatches": 6, "t_f": 10, "t_b": 10, "t_w": 5}
SMALL = {"stages": 2, "microbatches": 4, "t_f": 1, "t_b": 1, "t_w": 1}


def profile(**changes: object) -> str:
    return json.dumps({**PROFILE, **changes})


def spec(**changes: object) -> str:
    return json.dumps({"name": "s", "model": "m", "profile": SMALL, "systems": ["1f1b"], **changes})


def row(**fields: object) -> str:
    """One YAML fault-timeline row."""
    return json.dumps([{"start_iteration": 0, "links": ["0-1"], "delay_ms": 5, **fields}])


NIC_DELAY = json.dumps(  # a NIC down and repaired, then a NIC delay
    [
        {"start_iteration": 0, "end_iteration": 1, "nic": "host1:rnic0", "delay_ms": "inf"},
        {"start_iteration": 90, "nic": "host1:rnic0", "delay_ms": 5},
    ]
)
NIC_RUN = ["--faults", "f.yaml", "--iterations", "100"]
P = {"p.json": profile()}
RUN_P = ["run", "--profile", "p.json", "--system", "1f1b"]
LAUNCH_P = ["launch", "--profile", "p.json", "--policy", "1f1b", "--out", "job"]
RUN_SPEC = ["run", "--spec", "s.yaml", "--out", "out"]
RESUME = [*RUN_SPEC, "--run-id", "s"]
COMPARE = ["compare", "a.csv", "b.csv"]
RUN_MEGATRON = ["run", "--profile", "p.json", "--policy", "1f1b", "--backend", "megatron",
                "--faults", "f.yaml"]  # fmt: skip


def cap(link: str) -> str:
    """A fault timeline of one 1 Mbit/s cap on `link`."""
    return json.dumps([{"start_iteration": 0, "links": [link], "bandwidth_gbps": 0.001}])


DP_CAP = cap("dp0:0-1")

# (name, files to write, argv, what the error line must contain)
REPORT = ["report", "out/s"]
_MESSAGES = "out/s/messages.csv cannot be read ("
CASES: list[tuple[str, dict[str, str], list[str], str]] = [
    # output files: suffix and folder, checked before any work
    (
        "plot bad suffix",
        P,
        ["schedule", "--profile", "p.json", "--policy", "1f1b", "--plot", "x.txt"],
        "must end in .png",
    ),
    (
        "plot only a suffix",  # was "'.png' must end in .png"
        P,
        ["simulate", "--profile", "p.json", "--policy", "1f1b", "--plot", ".png"],
        "'.png' names no file: give a name ending in .png, e.g. out.png",
    ),
    ("plot missing folder", P, [*RUN_P, "--plot", "no/x.png"], "the folder 'no' does not exist"),
    ("trace bad suffix", P, [*RUN_P, "--trace", "x.png"], "must end in .json"),
    (
        "trace missing folder",
        P,
        ["simulate", "--profile", "p.json", "--policy", "1f1b", "--trace", "no/t.json"],
        "the folder 'no' does not exist",
    ),
    # a folder that cannot be written: found after the whole run, its results lost
    ("trace folder unwritable", P, [*RUN_P, "--trace", "/proc/t.json"], "'/proc' cannot be"),
    ("calibrate out unwritable", {}, ["calibrate", "--out", "/proc/c.json"], "cannot be written"),
    ("profile out suffix", {}, ["profile", "--stages", "2", "--out", "p.txt"], "end in .json"),
    ("profile out folder", {}, ["profile", "--stages", "2", "--out", "no/p.json"], "'no' does"),
    (
        "profile out is a dir",
        {"d/x": ""},
        ["profile", "--stages", "2", "--out", "d"],
        "is a directory",
    ),
    ("calibrate out suffix", {}, ["calibrate", "--out", "c.txt"], "must end in .json"),
    ("calibrate out folder", {}, ["calibrate", "--out", "no/c.json"], "'no' does not exist"),
    # profiles
    (
        "profile missing",
        {},
        ["schedule", "--profile", "p.json", "--policy", "1f1b"],
        "cannot read profile p.json",
    ),
    (
        "no profile and no schedule",  # said "the schedule file has no 'profile' key"
        {},
        ["simulate", "--policy", "1f1b"],
        "--profile is required: give the profile file",
    ),
    (
        "no profile and a schedule without one",
        {"s.json": json.dumps({"stages": [["F0"]] * 3})},
        ["simulate", "--schedule", "s.json"],
        "--profile is required: the schedule file s.json has no 'profile' key",
    ),
    (
        "a torch CSV schedule without a profile",  # said it "has no 'profile' key"
        {"s.txt": "0F0,0I0,0W0\n"},  # known by its text, as it is read, not its suffix
        ["simulate", "--schedule", "s.txt"],
        "--profile is required: the schedule file s.txt is a torch CSV, which carries no profile",
    ),
    (
        "a JSON schedule named .csv without a profile",
        {"s.csv": json.dumps({"stages": [["F0"]] * 3})},
        ["simulate", "--schedule", "s.csv"],
        "--profile is required: the schedule file s.csv has no 'profile' key",
    ),
    # an empty path: "cannot read profile : Is a directory"; --spec "" ran the default
    # experiment and --faults "" ran no faults
    ("profile path empty", {}, ["run", "--profile", "", "--policy", "1f1b"], "the path is empty"),
    ("spec path empty", {}, ["run", "--spec", ""], "'--spec': the path is empty: give a file"),
    ("faults path empty", P, [*RUN_P, "--faults", ""], "'--faults': the path is empty"),
    (
        "calibration path empty",
        P,
        ["simulate", "--profile", "p.json", "--policy", "1f1b", "--calibration", ""],
        "'--calibration': the path is empty",
    ),
    (
        "profile empty",
        {"p.json": ""},
        ["schedule", "--profile", "p.json", "--policy", "1f1b"],
        "profile p.json is not valid JSON",
    ),
    (
        "profile syntax",
        {"p.json": "{"},
        ["simulate", "--profile", "p.json", "--policy", "1f1b"],
        "not valid JSON",
    ),
    (
        "profile binary",
        {"p.json": "\udcff"},
        ["schedule", "--profile", "p.json", "--policy", "1f1b"],
        "is not text",
    ),
    (
        "profile a list",
        {"p.json": "[1]"},
        ["schedule", "--profile", "p.json", "--policy", "zb"],
        "a profile must be a JSON object",
    ),
    ("profile unknown key", {"p.json": profile(colour=1)}, RUN_P, "unknown profile key(s) colour"),
    ("profile stages 0", {"p.json": profile(stages=0)}, RUN_P, "stages must be in 1..512"),
    ("profile stages float", {"p.json": profile(stages=2.5)}, RUN_P, "stages must be an integer"),
    (
        "profile huge microbatches",
        {"p.json": profile(microbatches=10**9)},
        RUN_P,
        "microbatches must be in 1..4096",
    ),
    ("profile NaN time", {"p.json": profile(t_f=float("nan"))}, RUN_P, "t_f must be finite"),
    ("profile huge time", {"p.json": profile(t_b=1e300)}, RUN_P, "t_b must be finite and in"),
    ("profile string time", {"p.json": profile(t_w="5")}, RUN_P, "t_w must be a number"),
    (
        "profile a whole number past a float",  # an internal error (OverflowError)
        {"p.json": profile(mem_limit=10**400)},
        RUN_P,
        "profile p.json: 10000000000000000000... (401 digits) is too large a number",
    ),
    (
        "spec a whole number past a float",  # an internal error (OverflowError)
        {"s.yaml": spec(restart_ms=10**400)},
        RUN_SPEC,
        "spec s.yaml is not valid YAML at line 1, column ",
    ),
    (
        "profile short delays",
        {"p.json": profile(delay_ms=[1])},
        RUN_P,
        "delay_ms has 1 entry; 3 stages have 2 links",
    ),
    (
        "profile huge delay",
        {"p.json": profile(delay_ms=[1e12, 0])},
        RUN_P,
        "delay_ms[0] must be finite and in 0..3600000 ms",
    ),
    ("profile negative delay", {"p.json": profile(delay_ms=[-1, 0])}, RUN_P, "delay_ms[0]"),
    ("profile dp 0", {"p.json": profile(dp=0)}, RUN_P, "dp must be in 1..1024"),
    # schedules
    (
        "schedule syntax",
        {**P, "s.json": "{"},
        ["simulate", "--profile", "p.json", "--schedule", "s.json"],
        "schedule s.json is not valid JSON",
    ),
    (
        "schedule stages",
        {**P, "s.json": json.dumps({"stages": [["F0"]]})},
        ["simulate", "--profile", "p.json", "--schedule", "s.json"],
        "schedule has 1 stage but the profile has 3",
    ),
    (
        "schedule unknown op",
        {**P, "s.json": json.dumps({"stages": [["X0"]] * 3})},
        ["run", "--profile", "p.json", "--schedule", "s.json"],
        "cannot read op 'X0'",
    ),
    (
        "schedule missing ops",  # its order's errors name the file too
        {**P, "s.json": json.dumps({"stages": [["F0"]] * 3})},
        ["simulate", "--profile", "p.json", "--schedule", "s.json"],
        "error: schedule s.json: stage 0: ",
    ),
    (
        "torch csv garbage",
        {**P, "s.csv": "1,2,3\n"},
        ["simulate", "--profile", "p.json", "--schedule", "s.csv"],
        "torch CSV line 1 (rank 0), cell 1 '1'",
    ),
    (
        "schedule and policy",
        {**P, "s.json": json.dumps({"stages": [["F0"]] * 3})},
        ["simulate", "--profile", "p.json", "--schedule", "s.json", "--policy", "1f1b"],
        "give exactly one of --policy and --schedule",
    ),
    (
        "run with a comm and no plan",
        P,
        ["run", "--profile", "p.json", "--comm", "delegated"],
        "give one of --system, --policy and --schedule",
    ),
    # numbers on the command line
    (
        "time limit NaN",
        P,
        ["schedule", "--profile", "p.json", "--policy", "milp", "--time-limit", "nan"],
        "'--time-limit': nan is not a finite number",
    ),
    (
        "time limit unused",
        P,
        ["schedule", "--profile", "p.json", "--policy", "1f1b", "--time-limit", "3"],
        "--time-limit is for the exact solver",
    ),
    ("time limit with system", P, [*RUN_P, "--time-limit", "3"], "not --system"),
    (
        "time limit with a schedule, run",
        P,
        ["run", "--profile", "p.json", "--schedule", "s.json", "--time-limit", "3"],
        "--time-limit: a --schedule is run as given, nothing is solved",
    ),
    (
        "time limit with a schedule, simulate",
        P,
        ["simulate", "--profile", "p.json", "--schedule", "s.json", "--time-limit", "3"],
        "--time-limit: a --schedule is run as given, nothing is solved",
    ),
    (
        "time limit with a schedule, schedule",
        P,
        ["schedule", "--profile", "p.json", "--schedule", "s.json", "--time-limit", "3"],
        "--time-limit: a --schedule is run as given, nothing is solved",
    ),
    ("timeout 0", P, [*RUN_P, "--backend", "emulated", "--timeout", "0"], "--timeout"),
    (
        "timeout NaN",
        P,
        [*RUN_P, "--backend", "emulated", "--timeout", "nan"],
        "'--timeout': nan is not a finite number",
    ),
    ("iterations 0", P, [*RUN_P, "--iterations", "0"], "--iterations"),
    ("negative seed", P, [*RUN_P, "--seed", "-1"], "--seed"),
    ("seed changing nothing", P, [*RUN_P, "--seed", "3"], "this run has neither"),
    (
        "time limit negative",
        P,
        ["schedule", "--profile", "p.json", "--policy", "milp", "--time-limit", "-1"],
        "--time-limit",
    ),
    ("seed past 32 bits", P, [*RUN_P, "--seed", str(2**32)], "--seed"),
    ("seed with a spec", P, [*RUN_SPEC, "--seed", "1"], "--seed"),
    ("unknown system", P, ["run", "--profile", "p.json", "--system", "warp"], "'warp'"),
    (
        "megatron with other gradient bytes",
        {"p.json": json.dumps({**SMALL, "dp": 2, "allreduce_bytes": 8})},
        ["run", "--profile", "p.json", "--system", "falcon", "--backend", "megatron"],
        "are not model 'tiny''s gradients at 2 stage(s), [636672, 633088]: give those or 0",
    ),
    (
        "megatron with another state",
        {"p.json": json.dumps({**SMALL, "dp": 2, "state_bytes": 8})},
        ["run", "--profile", "p.json", "--system", "falcon", "--backend", "megatron"],
        "state_bytes [8, 8] are not what model 'tiny''s workers hold at 2 stage(s), "
        "[636672, 633088]: give those or none",
    ),
    (
        "megatron with other message bytes",
        {"p.json": json.dumps({**SMALL, "message_bytes": 4096})},
        ["run", "--profile", "p.json", "--system", "falcon", "--backend", "megatron"],
        "message_bytes 4096 are not model 'tiny''s activations, 8192 (16 x 2 x 64 elements",
    ),
    # a cap priced at the bytes it holds: tiny's 8192-B activation at 1 Mbit/s is 65.5 ms
    (
        "megatron cap on a PP link",
        {"p.json": json.dumps(SMALL), "f.yaml": cap("0-1")},
        [*RUN_MEGATRON, "--timeout", "0.05"],
        "a delay of 65.536 ms is not shorter than the workers' 0.05 s timeout",
    ),
    (  # stage 0's chunk: half its 636,672-B gradient
        "megatron cap on a DP link",
        {"p.json": json.dumps({**SMALL, "dp": 2}), "f.yaml": DP_CAP},
        [*RUN_MEGATRON, "--timeout", "1.5"],
        "a delay of 2546.69 ms is not shorter than the workers' 1.5 s timeout",
    ),
    (
        "spec megatron cap on a DP link",
        {
            "s.yaml": spec(
                backend="megatron",
                model="tiny",
                profile={**SMALL, "dp": 2},
                faults="f.yaml",
                transport_timeout_s=1.5,
            ),
            "f.yaml": DP_CAP,
        },
        RUN_SPEC,
        "a delay of 2546.69 ms is not shorter than the workers' 1.5 s timeout",
    ),
    (  # half of 1,000,000 B
        "emulated cap on a DP link",
        {"p.json": json.dumps({**SMALL, "dp": 2, "allreduce_bytes": 1_000_000}), "f.yaml": DP_CAP},
        [*RUN_MEGATRON[:5], "--backend", "emulated", "--faults", "f.yaml", "--timeout", "1.5"],
        "a delay of 4000 ms is not shorter than the workers' 1.5 s timeout",
    ),
    ("unknown option", {}, ["run", "--colour"], "No such option '--colour'"),
    ("unknown command", {}, ["fly"], "No such command 'fly'"),
    # options a command would ignore
    ("timeout in sim", P, [*RUN_P, "--timeout", "5"], "--timeout is the runtime workers'"),
    (  # refused only as measured iteration 90 ran, on the testbed
        "network NIC delay",
        {"p.json": json.dumps(SMALL), "f.yaml": NIC_DELAY},
        [*RUN_P, "--backend", "emulated", "--inject", "network", *NIC_RUN],
        "error: fault timeline f.yaml: fault row 2: --inject network takes a NIC down, not "
        "another effect on a NIC (host1:rnic0); replay it with --inject hook (line 1)",
    ),
    (
        "spec network NIC delay",
        {
            "s.yaml": spec(
                backend="emulated", injection="network", faults="f.yaml", num_iterations=100
            ),
            "f.yaml": NIC_DELAY,
        },
        RUN_SPEC,
        "f.yaml: fault row 2: --inject network takes a NIC down, not another effect on a NIC "
        "(host1:rnic0); replay it with --inject hook (line 1)",
    ),
    ("model in sim", P, [*RUN_P, "--model", "tiny"], "--model applies to --backend megatron"),
    (
        "unknown megatron model",
        P,
        [*RUN_P, "--backend", "megatron", "--model", "gpt5"],
        "unknown model 'gpt5'",
    ),
    (
        "faults without profile",
        {"f.yaml": row()},
        ["run", "--faults", "f.yaml"],
        "--faults: without --profile",
    ),
    ("emulated without profile", {}, ["run", "--backend", "emulated"], "--backend: without"),
    (
        "spec and profile",
        {"s.yaml": spec(), **P},
        [*RUN_SPEC, "--profile", "p.json"],
        "--profile: --spec runs an experiment",
    ),
    (
        "spec and iterations",
        {"s.yaml": spec()},
        [*RUN_SPEC, "--iterations", "3"],
        "--iterations: --spec runs an experiment",
    ),
    ("out for one run", P, [*RUN_P, "--out", "o"], "one configuration writes no run directory"),
    (
        "delay beyond timeout",
        {"p.json": profile(delay_ms=[5000, 0])},
        [*RUN_P, "--backend", "emulated", "--timeout", "1"],
        "not shorter than the workers' 1 s",
    ),
    (
        "unknown comm",
        P,
        ["simulate", "--profile", "p.json", "--policy", "zb", "--comm", "warp"],
        "Invalid value for '--comm'",
    ),
    # fault timelines
    ("faults missing", P, [*RUN_P, "--faults", "f.yaml"], "cannot read fault timeline f.yaml"),
    (
        "faults redrawn too often",
        {
            **P,
            "f.yaml": json.dumps(
                [
                    {
                        "start_iteration": 0,
                        "links": ["0-1"],
                        "distribution": {
                            "normal": {"mean_ms": 5, "std_ms": 1},
                            "redraw_every_ms": [1e-9, 1e-9],
                        },
                    }
                ]
            ),
        },
        [*RUN_P, "--faults", "f.yaml"],
        "fault row 1: redraw_every_ms needs 1 <= lo <= hi (ms)",
    ),
    (
        "spec ring too large to time",
        {
            "s.yaml": json.dumps(
                {"name": "s", "models": [{"base": "gpt2-7b", "dp": 1000}], "systems": ["1f1b"]}
            )
        },
        RUN_SPEC,
        "the DP all-reduce is 375,624,000 messages an iteration (4 stages' rings of 1000 "
        "replicas, 80,000,000-byte buckets): more than the simulator times (4,000,000)",
    ),
    (
        "spec faults with delays",
        {"s.yaml": spec(faults="f.yaml", delays_ms=[0, 10], links=["1-2"]), "f.yaml": row()},
        RUN_SPEC,
        "faults with links and delays_ms: a fault timeline replaces the link sets x delays",
    ),
    (  # were their default values, ignored: the run went on as if they were not there
        "spec faults with the default links and delays",
        {"s.yaml": spec(faults="f.yaml", delays_ms=[0], links=["0-1"]), "f.yaml": row()},
        RUN_SPEC,
        "spec s.yaml: faults with links and delays_ms: a fault timeline replaces the link sets "
        "x delays scenarios (give one or the other)",
    ),
    (
        "spec faults with the default link sets",
        {"s.yaml": spec(faults="f.yaml", link_sets=[["0-1"]]), "f.yaml": row()},
        RUN_SPEC,
        "spec s.yaml: faults with link_sets: a fault timeline replaces",
    ),
    (  # was read as the paper's trace: "fault timeline p.json: ..." of its first "row"
        "faults of another suffix",
        P,
        [*RUN_P, "--faults", "p.json"],
        "error: fault timeline p.json has suffix '.json': give the paper's trace as .txt or "
        "YAML rows as .yaml or .yml",
    ),
    (
        "faults without a suffix",
        {**P, "trace": "2;0_1;0.02"},
        [*RUN_P, "--faults", "trace"],
        "error: fault timeline trace has no suffix: give the paper's trace as .txt",
    ),
    (
        "spec faults of another suffix",
        {"s.yaml": spec(faults="f.json"), "f.json": row()},
        RUN_SPEC,
        "f.json has suffix '.json': give the paper's trace as .txt or YAML rows as .yaml or .yml",
    ),
    (
        "faults empty yaml",
        {**P, "f.yaml": ""},
        [*RUN_P, "--faults", "f.yaml"],
        "fault timeline f.yaml: a YAML fault timeline is a list",
    ),
    (
        "faults empty trace",
        {**P, "f.txt": "# nothing\n"},
        [*RUN_P, "--faults", "f.txt"],
        "fault timeline f.txt: the timeline has no rows",
    ),
    (
        "faults yaml syntax",
        {**P, "f.yaml": "- {start_iteration: [}"},
        [*RUN_P, "--faults", "f.yaml"],
        "is not valid YAML at line 1",
    ),
    (
        "faults unsorted trace",
        {**P, "f.txt": "3;0_1;0.01\n1;1_2;0.01\n"},
        [*RUN_P, "--faults", "f.txt"],
        "fault row 2 starts before row 1",
    ),
    (
        "faults unknown link",
        {**P, "f.yaml": row(links=["5-6"])},
        [*RUN_P, "--faults", "f.yaml"],
        "link 5-6 does not exist",
    ),
    (
        "faults huge delay",
        {**P, "f.yaml": row(delay_ms=1e12)},
        [*RUN_P, "--faults", "f.yaml"],
        "delay_ms must be in 0..3600000 ms",
    ),
    (
        "faults string delay",
        {**P, "f.yaml": row(delay_ms="abc")},
        [*RUN_P, "--faults", "f.yaml"],
        "delay_ms must be a number or inf, got 'abc'",
    ),
    (  # was read as 5, where a spec refuses a string for a number
        "faults quoted delay",
        {**P, "f.yaml": row(delay_ms="5")},
        [*RUN_P, "--faults", "f.yaml"],
        "error: fault timeline f.yaml: fault row 1: delay_ms must be a number or inf, got '5' "
        "(line 1)",
    ),
    (
        "faults NaN at_ms",
        {**P, "f.yaml": row(at_ms=float("nan"))},
        [*RUN_P, "--faults", "f.yaml"],
        "at_ms must be a number, got 'NaN'",
    ),
    (
        "faults float start",
        {**P, "f.yaml": row(start_iteration=1.5)},
        [*RUN_P, "--faults", "f.yaml"],
        "start iteration must be an integer, got 1.5",
    ),
    (
        "faults past the run",
        {**P, "f.yaml": row(start_iteration=50)},
        [*RUN_P, "--faults", "f.yaml"],
        "fault timeline f.yaml: fault row 1: starts at iteration 50 but the run has 5",
    ),
    (  # named the row only, not the line, as an error found reading the file does
        "faults past the run names the line",
        {
            **P,
            "f.yaml": "# late\n- {start_iteration: 0, links: ['0-1'], delay_ms: 5}\n"
            "- {start_iteration: 50, links: ['0-1'], delay_ms: 0}\n",
        },
        [*RUN_P, "--faults", "f.yaml"],
        "error: fault timeline f.yaml: fault row 2: starts at iteration 50 but the run has 5 "
        "iterations (0..4) (line 3)",
    ),
    (
        "trace link the run lacks names the line",
        {**P, "f.txt": "# late\n0;0_1;0.005\n\n1;5_6;0.005\n"},
        [*RUN_P, "--faults", "f.txt"],
        "error: fault timeline f.txt: fault row 2: link 5-6 does not exist with 3 stages and 1 "
        "replica (PP links i-(i+1) < 3, DP ring links dp<stage>:a-(a+1) and dp<stage>:0-(D-1)) "
        "(line 4)",
    ),
    (
        "faults unknown key",
        {**P, "f.yaml": row(colour=1)},
        [*RUN_P, "--faults", "f.yaml"],
        "unknown key(s) colour",
    ),
    # experiment specs
    ("spec missing", {}, RUN_SPEC, "cannot read spec s.yaml"),
    ("spec empty", {"s.yaml": ""}, RUN_SPEC, "an experiment spec is a mapping"),
    ("spec syntax", {"s.yaml": "{[}"}, RUN_SPEC, "spec s.yaml is not valid YAML at line 1"),
    ("spec a list", {"s.yaml": "[1, 2]"}, RUN_SPEC, "an experiment spec is a mapping"),
    ("spec unknown key", {"s.yaml": spec(colour=1)}, RUN_SPEC, "unknown spec key(s) colour"),
    (
        "spec number key",
        {"s.yaml": spec()[:-1] + ", 1: 2}"},  # YAML reads the key as a number
        RUN_SPEC,
        "unknown spec key(s) 1; valid keys",
    ),
    (
        "spec float iterations",
        {"s.yaml": spec(num_iterations=2.5)},
        RUN_SPEC,
        "num_iterations must be an integer, got 2.5",
    ),
    ("spec bool repeats", {"s.yaml": spec(num_repeats=True)}, RUN_SPEC, "num_repeats must be an"),
    ("spec string seed", {"s.yaml": spec(seed="x")}, RUN_SPEC, "seed must be an integer"),
    ("spec seed past 32 bits", {"s.yaml": spec(seed=2**32)}, RUN_SPEC, "seed must be in 0.."),
    ("spec no delays", {"s.yaml": spec(delays_ms=[])}, RUN_SPEC, "delays_ms is empty"),
    # the refused value quoted whole: a 100,000-character line
    ("spec a long bad list", {"s.yaml": spec(model=[[1]] * 20000)}, RUN_SPEC, "in all)"),
    (
        "spec YAML 1e999",
        {
            "s.yaml": "name: s\nmodel: m\nprofile: {stages: 2, microbatches:"
            " 4, t_f: 1, t_b: 1, t_w: 1}\nsystems: [1f1b]\ndelays_ms: [1e999]\n"
        },
        RUN_SPEC,
        "line 5, column 13: '1e999' is too large a number",
    ),
    ("spec huge delay", {"s.yaml": spec(delays_ms=[1e12])}, RUN_SPEC, "delays_ms[0] must be"),
    (
        "spec NaN timeout",
        {
            "s.yaml": "name: s\nmodel: m\nprofile: {stages: 2, microbatches: 4, "
            "t_f: 1, t_b: 1, t_w: 1}\nsystems: [1f1b]\ntransport_timeout_s: .nan\n"
        },
        RUN_SPEC,
        "transport_timeout_s must be in (0, 86400] s, got nan",
    ),
    ("spec unknown system", {"s.yaml": spec(systems=["warp"])}, RUN_SPEC, "unknown system warp"),
    # (it said "unknown system (none)")
    ("spec no system", {"s.yaml": spec(systems=[])}, RUN_SPEC, "no system given; valid: 1f1b"),
    # (it said "which takes these from its file": a spec has no format)
    (
        "spec with --format",
        {"s.yaml": spec()},
        [*RUN_SPEC, "--format", "json"],
        "--format: --spec runs an experiment, which takes only --out and --run-id (its file "
        "sets the rest; --format, --trace and --plot are a single configuration's)",
    ),
    (
        "spec megatron part-element buckets",
        {"s.yaml": spec(profile={**SMALL, "dp_bucket_bytes": 6}, model="tiny", backend="megatron")},
        RUN_SPEC,
        "dp_bucket_bytes 6 must be a multiple of 4",
    ),
    (
        "spec unknown model",
        {"s.yaml": json.dumps({"name": "s", "models": ["gpt2-9b"], "systems": ["1f1b"]})},
        RUN_SPEC,
        "unknown model 'gpt2-9b'",
    ),
    (
        "spec unknown link",
        {"s.yaml": spec(links=["7-8"], delays_ms=[10])},
        RUN_SPEC,
        "link 7-8 does not exist",
    ),
    (
        "spec name traversal",
        {"s.yaml": spec(name="../x")},
        RUN_SPEC,
        "must be a single path component",
    ),
    (  # 100 characters passed, then the run directory failed with ENAMETOOLONG
        "spec name too many bytes",
        {"s.yaml": spec().replace('"s"', '"' + "\\U0001F600" * 100 + '"')},  # YAML's escape
        RUN_SPEC,
        "is 400 bytes long as a file name (UTF-8); at most 224",
    ),
    (  # made a path first: "fault timeline DIR/5 has no suffix"
        "spec faults a number",
        {"s.yaml": spec(faults=5)},
        RUN_SPEC,
        "faults must be a file name, got 5",
    ),
    (  # "cannot read calibration DIR/['a']"
        "spec calibration a list",
        {"s.yaml": spec(calibration=["a"])},
        RUN_SPEC,
        "calibration must be a file name, got ['a']",
    ),
    (
        "spec faults missing",
        {"s.yaml": spec(faults="none.yaml")},
        RUN_SPEC,
        "cannot read fault timeline",
    ),
    ("spec twice a system", {"s.yaml": spec(systems=["zb", "zb"])}, RUN_SPEC, "systems[1] repeats"),
    ("spec twice a delay", {"s.yaml": spec(delays_ms=[0, 5, 5.0])}, RUN_SPEC, "delays_ms[2] rep"),
    (
        "spec twice a link set",
        {"s.yaml": spec(link_sets=[["0-1"], ["first"]], delays_ms=[5])},
        RUN_SPEC,
        # which model, and what both resolved to: `first` is 0-1 there
        "link_sets[1] repeats link_sets[0] in model m (both 0-1); list each once",
    ),
    (
        "spec twice a model",
        {"s.yaml": json.dumps({"name": "s", "models": ["gpt2-7b"] * 2, "systems": ["1f1b"]})},
        RUN_SPEC,
        "models[1] repeats models[0]",
    ),
    (
        "spec empty link set",
        {"s.yaml": spec(link_sets=[[]], delays_ms=[5])},
        RUN_SPEC,
        "link_sets[0] is empty",
    ),
    (
        "spec ops of no time",
        {"s.yaml": spec(profile={**SMALL, "t_f": 0, "t_b": 0, "t_w": 0})},
        RUN_SPEC,
        "every op time of the profile is 0",
    ),
    (
        "spec profile with delays",
        {"s.yaml": spec(profile={**SMALL, "delay_ms": [20]})},
        RUN_SPEC,
        "a spec's profile takes no delay_ms",
    ),
    ("spec link sets a number", {"s.yaml": spec(link_sets=5)}, RUN_SPEC, "a list of link lists"),
    # a flat list under link_sets was a scenario per link, under links one slowing them all
    ("spec link sets flat", {"s.yaml": spec(link_sets=["0-1"])}, RUN_SPEC, "got '0-1' in it"),
    ("spec links nested", {"s.yaml": spec(links=[["0-1"]])}, RUN_SPEC, "links is one set"),
    ("spec too many iterations", {"s.yaml": spec(num_iterations=100_001)}, RUN_SPEC, "1..100000"),
    ("run too many iterations", P, [*RUN_P, "--iterations", "100001"], "1<=x<=100000"),
    (
        "spec models saved to one file",
        {
            "s.yaml": json.dumps(
                {
                    "name": "s",
                    "systems": ["1f1b"],
                    "models": [
                        {"base": "gpt2-7b", "name": "x:1"},
                        {"base": "gpt2-7b", "name": "x-1", "dp": 2},
                    ],
                }
            )
        },
        RUN_SPEC,
        "would save their timelines to the same file x-1_1f1b_fault-free_r0.json",
    ),
    ("spec long model name", {"s.yaml": spec(model="m" * 101)}, RUN_SPEC, "at most 100"),
    (
        "spec fractional hidden",
        {
            "s.yaml": json.dumps(
                {"name": "s", "models": [{"base": "gpt2-7b", "hidden": 1.5}], "systems": ["1f1b"]}
            )
        },
        RUN_SPEC,
        "hidden must be an integer, got 1.5",
    ),
    (
        "simulate calibration ideal",
        {
            **P,
            "c.json": json.dumps(
                {
                    "schema_version": 3,
                    "send_ms_by_bytes": [],
                    "receive_lag_ms_by_bytes": [],
                    "op_overhead_ms": 1,
                }
            ),
        },
        ["simulate", "--profile", "p.json", "--policy", "zb", "--calibration", "c.json"],
        "ideal takes none",
    ),
    (
        "run calibration falling curve",
        {
            **P,
            "c.json": json.dumps(
                {
                    "schema_version": 3,
                    "send_ms_by_bytes": [[0, 5.0], [1048576, 0.1]],
                    "receive_lag_ms_by_bytes": [],
                    "op_overhead_ms": 1,
                }
            ),
        },
        ["run", "--profile=p.json", "--policy=zb", "--comm=delegated", "--calibration=c.json"],
        "send_ms_by_bytes falls from 5.0 ms at 0 bytes",
    ),
    (
        "given schedule over mem_limit",
        {
            "p.json": json.dumps({**SMALL, "microbatches": 3, "mem_limit": 1}),
            "s.json": json.dumps(
                {
                    "stages": [
                        ["F0", "F1", "B0", "W0", "F2", "B1", "W1", "B2", "W2"],
                        ["F0", "B0", "F1", "B1", "W0", "F2", "B2", "W1", "W2"],
                    ]
                }
            ),
        },
        ["simulate", "--profile", "p.json", "--schedule", "s.json"],
        "the schedule in s.json needs 2 microbatches",
    ),
    ("run id traversal", {}, ["run", "--run-id", "../x"], "must be a single path component"),
    ("run id empty", {}, ["run", "--run-id", ""], "the run id is empty"),
    ("run id too many bytes", {}, ["run", "--run-id", "\U0001f600" * 100], "400 bytes long"),
    ("run id a file", {"x": ""}, ["run", "--out", ".", "--run-id", "x"], "a file is in the way"),
    ("run out under a file", {"x": ""}, ["run", "--out", "x/y"], "x/y cannot hold run dir"),
    ("run out empty", {}, ["run", "--out", ""], "the path is empty: give a folder"),
    ("launch out empty", P, ["launch", "--profile", "p.json", "--out", ""], "give a folder"),
    # resuming and reporting a damaged run directory (made by the fixture below)
    ("resume truncated runs.csv", {"@": "truncate runs.csv"}, RESUME, "out/s/runs.csv"),
    (
        "resume short row",
        {"@": "short row"},
        RESUME,
        f"line 2 does not have {len(RUNS_COLUMNS)} fields",
    ),
    ("resume garbage spec.json", {"@": "garbage spec.json"}, RESUME, "is not valid JSON"),
    ("resume other schema", {"@": "schema 999"}, RESUME, "schema version 999"),
    ("resume other experiment", {"@": "other spec"}, RESUME, "holds a different experiment"),
    ("report damaged runs.csv", {"@": "truncate runs.csv"}, ["report", "out/s"], "runs.csv"),
    # messages.csv that no harness wrote: an internal error (exit 3) in both
    ("report latin-1 messages.csv", {"@": "latin-1 in messages.csv"}, REPORT, _MESSAGES),
    ("resume latin-1 messages.csv", {"@": "latin-1 in messages.csv"}, RESUME, _MESSAGES),
    ("resume huge field messages.csv", {"@": "huge field in messages.csv"}, RESUME, _MESSAGES),
    ("report a word for a number", {"@": "word in runs.csv"}, ["report", "out/s"], "not a num"),
    (
        "report an empty number",
        {"@": "empty number in runs.csv"},
        ["report", "out/s"],
        "out/s/runs.csv line 2: median_wall_ms is empty, not a number",
    ),
    (
        "resume an empty number",
        {"@": "empty number in runs.csv"},
        RESUME,
        "out/s/runs.csv line 2: median_wall_ms is empty, not a number",
    ),
    (
        "report an empty number in iterations.csv",
        {"@": "empty number in iterations.csv"},
        ["report", "out/s"],
        "out/s/iterations.csv line 2: step_time_ms is empty, not a number",
    ),
    *[
        (f"{verb} {name}", {"@": damage}, argv, message)
        for verb, argv in (("resume", RESUME), ("report", ["report", "out/s"]))
        for name, damage, message in (
            (
                "without iterations.csv",
                "no iterations.csv",
                "out/s/iterations.csv is missing, but runs.csv has m 1f1b fault-free (repeat 0): "
                "damaged?",
            ),
            (
                "a row gone from iterations.csv",
                "a row gone from iterations.csv",
                "out/s/iterations.csv has 4 rows of m 1f1b fault-free (repeat 0), but runs.csv "
                "says it ran 5 iterations: damaged?",
            ),
            (
                "a row twice in iterations.csv",
                "a row twice in iterations.csv",
                "out/s/iterations.csv has 6 rows of m 1f1b fault-free (repeat 0)",
            ),
            (
                "a row twice in runs.csv",
                "a row twice in runs.csv",
                "out/s/runs.csv line 3 repeats line 2's configuration, m 1f1b fault-free "
                "(repeat 0): damaged?",
            ),
            (
                "a row of iterations.csv in place of the next",
                "a row of iterations.csv in place of the next",
                "out/s/iterations.csv line 3 repeats iteration 0 of m 1f1b fault-free (repeat 0) "
                "(line 2), which runs.csv says no restart ran again: damaged?",
            ),
        )
    ],
    (
        "report no spec.json",
        {"out/s/runs.csv": ""},
        ["report", "out/s"],
        "out/s is not a run directory: it has no spec.json",
    ),
    (
        "report a spec.json field of the wrong type",
        {"@": "a string count in spec.json"},
        ["report", "out/s"],
        "error: out/s/spec.json: num_iterations must be an integer, got '5'",
    ),
    (
        "report an unknown op kind in a saved timeline",
        {"@": "an op kind X in the saved timeline"},
        ["report", "out/s"],
        "out/s/timelines/m_1f1b_fault-free_r0.json: timeline ops[0]: kind is 'X', not an op "
        "kind F, B, W or BW: damaged?",
    ),
    (
        "report a saved timeline without iterations",
        {"@": "no iteration in the saved timeline"},
        ["report", "out/s"],
        "out/s/timelines/m_1f1b_fault-free_r0.json: holds no iteration: damaged?",
    ),
    ("report missing", {}, ["report", "none"], "Directory 'none' does not exist"),
    # compare
    ("compare missing", {}, COMPARE, "'a.csv' does not exist"),
    ("compare empty", {"a.csv": "", "b.csv": ""}, COMPARE, "holds no results"),
    (
        "compare no columns",
        {"a.csv": "x,y\n1,2\n", "b.csv": "x,y\n1,2\n"},
        COMPARE,
        "is not a runs.csv",
    ),
    ("compare NaN tolerance", {"@": "compare"}, [*COMPARE, "--tolerance", "nan"], "not nan"),
    (
        "compare unknown metric",
        {"@": "compare"},
        [*COMPARE, "--metric-tolerance", "x=3"],
        "no metric x",
    ),
    # launch
    (
        "launch nodes without address",
        P,
        [*LAUNCH_P, "--nodes", "3"],
        "--master-addr",
    ),
    (
        "launch empty address",
        P,
        [*LAUNCH_P, "--nodes", "3", "--master-addr", ""],
        "--master-addr is empty",
    ),
    (
        "launch uneven nodes",
        P,
        [*LAUNCH_P, "--nodes", "2", "--master-addr", "10.0.0.1"],
        "3 ranks do not split evenly over 2 nodes",
    ),
    (
        "launch spec with nodes",
        {"s.yaml": spec()},
        ["launch", "--spec", "s.yaml", "--out", "job", "--nodes", "2", "--iterations", "2"],
        "--nodes, --iterations: --spec takes the configurations",
    ),
    (
        "launch profile with gpus per node",
        P,
        [*LAUNCH_P, "--gpus-per-node", "4"],
        "--gpus-per-node: it is the Slurm script's (with --spec)",
    ),
    (
        "launch profile with job time",
        P,
        [*LAUNCH_P, "--job-time", "02:00:00"],
        "--job-time: it is the Slurm script's (with --spec)",
    ),
    (
        "launch spec bad job time",
        {"s.yaml": spec()},
        ["launch", "--spec", "s.yaml", "--out", "job", "--job-time", "2h"],
        "job time '2h' is not one sbatch --time takes",
    ),
    (
        "launch NaN timeout",
        P,
        [*LAUNCH_P, "--timeout", "nan"],
        "'--timeout': nan is not a finite number",
    ),
    (
        "launch infinite run timeout",
        P,
        [*LAUNCH_P, "--run", "--run-timeout-s", "inf"],
        "'--run-timeout-s': inf is not in the range 0<x<=86400",
    ),
    (
        "launch spec syntax",
        {"s.yaml": "{"},
        ["launch", "--spec", "s.yaml", "--out", "job"],
        "not valid YAML",
    ),
    # calibrate: bounded before any process starts
    (
        "calibrate many stages",
        {},
        ["calibrate", "--out", "c.json", "--stages", "64"],
        "64 is not in the range 2<=x<=16",
    ),
    (
        "calibrate long ops",
        {},
        ["calibrate", "--out", "c.json", "--op-ms", "1e9"],
        "is not in the range 0<x<=60000",
    ),
    # profile (the command)
    (
        "profile too many stages",
        {},
        ["profile", "--stages", "50", "--out", "p.json"],
        "which 50 stages cannot split evenly",
    ),
    (
        "profile unknown model",
        {},
        ["profile", "--stages", "2", "--model", "gpt5", "--out", "p.json"],
        "unknown model 'gpt5'",
    ),
]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished experiment's run directory (out/s) beside its spec file (s.yaml)."""
    root = tmp_path_factory.mktemp("finished")
    (root / "s.yaml").write_text(spec())
    with pytest.raises(SystemExit) as done:
        _in(root, lambda: main([*RESUME]))
    assert done.value.code in (None, 0)
    return root


def _damage(root: Path, how: str) -> None:
    run_dir = root / "out" / "s"
    runs, record = run_dir / "runs.csv", run_dir / "spec.json"
    if how == "truncate runs.csv":
        runs.write_text(runs.read_text()[:40])
    elif how == "short row":
        header = ",".join(RUNS_COLUMNS)
        runs.write_text(f"{header}\n{','.join(['x'] * 5)}\n")
    elif how == "word in runs.csv":
        header, first, *rest = runs.read_text().splitlines()
        fields = first.split(",")
        fields[RUNS_COLUMNS.index("median_wall_ms")] = "abc"
        runs.write_text("\n".join([header, ",".join(fields), *rest]) + "\n")
    elif how == "empty number in runs.csv":
        header, first, *rest = runs.read_text().splitlines()
        fields = first.split(",")
        fields[RUNS_COLUMNS.index("median_wall_ms")] = ""
        runs.write_text("\n".join([header, ",".join(fields), *rest]) + "\n")
    elif how == "empty number in iterations.csv":
        steps = run_dir / "iterations.csv"
        header, first, *rest = steps.read_text().splitlines()
        fields = first.split(",")
        fields[ITERATIONS_COLUMNS.index("step_time_ms")] = ""
        steps.write_text("\n".join([header, ",".join(fields), *rest]) + "\n")
    elif how == "no iterations.csv":
        (run_dir / "iterations.csv").unlink()
    elif how == "a row gone from iterations.csv":
        steps = run_dir / "iterations.csv"
        header, _, *rest = steps.read_text().splitlines()
        steps.write_text("\n".join([header, *rest]) + "\n")
    elif how == "a row twice in iterations.csv":
        steps = run_dir / "iterations.csv"
        header, first, *rest = steps.read_text().splitlines()
        steps.write_text("\n".join([header, first, first, *rest]) + "\n")
    elif how == "a row twice in runs.csv":
        header, first, *rest = runs.read_text().splitlines()
        runs.write_text("\n".join([header, first, first, *rest]) + "\n")
    elif how == "a row of iterations.csv in place of the next":
        steps = run_dir / "iterations.csv"
        header, first, _, *rest = steps.read_text().splitlines()
        steps.write_text("\n".join([header, first, first, *rest]) + "\n")
    elif how in ("an op kind X in the saved timeline", "no iteration in the saved timeline"):
        (saved,) = (run_dir / "timelines").glob("*.json")
        data = json.loads(saved.read_text())
        if how == "no iteration in the saved timeline":
            data["iterations"] = []
        else:
            data["ops"][0][2] = "X"
        saved.write_text(json.dumps(data))
    elif how == "garbage spec.json":
        record.write_text("{garb")
    elif how == "a string count in spec.json":
        data = json.loads(record.read_text())
        record.write_text(json.dumps({**data, "spec": {**data["spec"], "num_iterations": "5"}}))
    elif how == "schema 999":
        record.write_text(json.dumps({**json.loads(record.read_text()), "schema_version": 999}))
    elif how == "other spec":
        (root / "s.yaml").write_text(spec(num_iterations=3))
    elif how in ("latin-1 in messages.csv", "huge field in messages.csv"):
        messages = run_dir / "messages.csv"
        header, first, *rest = messages.read_bytes().splitlines(keepends=True)
        bad = b"caf\xe9" if how.startswith("latin") else b'"' + b"x" * 200_000 + b'"'
        messages.write_bytes(b"".join([header, first.replace(b",", b"," + bad + b",", 1), *rest]))
    elif how == "compare":
        shutil.copy(runs, root / "a.csv")
        shutil.copy(runs, root / "b.csv")
    else:
        raise AssertionError(how)


def _in(directory: Path, call: Callable[[], None]) -> None:
    """`call` run with `directory` as the working directory (the CLI's relative paths)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(directory)
        call()
        raise SystemExit(0)  # main returned: exit 0


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and p.name != ".lock"  # the lock names its holder: not an output
    }


@pytest.mark.parametrize(("name", "files", "argv", "message"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_clear_line_and_writes_nothing(
    name: str,
    files: dict[str, str],
    argv: list[str],
    message: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if "@" in files:
        shutil.copytree(request.getfixturevalue("finished_run"), tmp_path, dirs_exist_ok=True)
        _damage(tmp_path, files["@"])
    for relative, text in files.items():
        if relative != "@":
            (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / relative).write_bytes(text.encode(errors="surrogateescape"))
    before = _files(tmp_path)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:  # any other exception is a traceback: it fails
        _in(tmp_path, lambda: main(argv))
    err = capsys.readouterr().err
    assert exit_.value.code in (1, 2), (exit_.value.code, err)  # not 0, not 3 (a bug)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert message in lines[0] and len(lines[0]) < 2100, lines[0]
    assert _files(tmp_path) == before  # nothing written, nothing changed
