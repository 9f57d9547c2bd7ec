import csv
import dataclasses
import json
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness import experiment
from harness.cli import main
from harness.experiment import new_run_dir, run_experiment
from harness.report import _calibration_note
from harness.results import (
    ITERATIONS_COLUMNS,
    MESSAGES_COLUMNS,
    RESULTS_SCHEMA_VERSION,
    RUNS_COLUMNS,
    read_csv_rows,
    read_spec_record,
)
from harness.spec import (
    ExperimentSpec,
    Target,
    default_experiment,
    load_spec,
    spec_from_record,
)
from pipeline.allreduce import messages_per_link_direction
from pipeline.cost_model import MODELS, model_cost
from pipeline.errors import ConfigError
from pipeline.host_costs import HostCosts
from pipeline.profile import Profile
from tests.harness.specs import nic_down_spec


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


def test_default_run_end_to_end(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "harness", "run", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    (run_dir,) = tmp_path.iterdir()
    assert f"results written to {run_dir}" in out.stdout
    assert "[16/16]" in out.stderr  # progress
    runs = _rows(run_dir / "runs.csv")
    assert tuple(runs[0]) == RUNS_COLUMNS
    assert len(runs) == 4 * 4
    by_key = {(r["system"], float(r["delay_ms"])): float(r["median_iteration_ms"]) for r in runs}
    assert by_key[("1f1b", 0.0)] == 450.0 and by_key[("zb", 0.0)] == 390.0
    # Fig. 5: the adapted order pays only the delay; ZB's fixed order pays head-of-line
    # blocking on the direct path, and only dependency bubbles over delegates.
    assert [by_key[("adaptra", d)] for d in (10.0, 20.0, 40.0)] == [400.0, 410.0, 430.0]
    assert by_key[("zb", 40.0)] > by_key[("adaptra-cpu", 40.0)] > by_key[("adaptra", 40.0)]
    comms = {(r["system"], float(r["delay_ms"])): (r["policy"], r["comm"]) for r in runs}
    assert comms[("adaptra", 0.0)] == ("adaptra", "direct")  # no straggler seen yet
    assert comms[("adaptra", 40.0)] == ("adaptra", "delegated")
    assert comms[("adaptra-cpu", 40.0)] == ("zb", "delegated")
    assert len(_rows(run_dir / "iterations.csv")) == 16 * 5
    # every measured iteration's link directions: 3 links x 2 directions, 12 messages each
    messages = _rows(run_dir / "messages.csv")
    assert len(messages) == 16 * 5 * 3 * 2 and {r["num_messages"] for r in messages} == {"12"}
    assert len(list((run_dir / "timelines").iterdir())) == 16
    spec = json.loads((run_dir / "spec.json").read_text())
    assert spec["spec"]["seed"] == 0 and spec["git_revision"]
    pngs = ["iteration_time_vs_delay.png", "slowdown.png", "gantt_1f1b.png", "gantt_adaptra.png"]
    for png in pngs:
        assert (run_dir / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (
        "| fig4-uniform-10ms | adaptra | delegated | detector | 0-1@40ms | 430.0 |"
        in (run_dir / "report.md").read_text()
    )


def test_interrupted_run_resumes_without_duplicates(tmp_path: Path) -> None:
    spec = ExperimentSpec(
        name="t",
        models=("m",),
        profile=Profile.uniform(2, 4, 1, 1, 1),
        systems=("1f1b", "zb-h1"),
        delays_ms=(0.0, 5.0),
        num_iterations=2,
    )
    run_dir = run_experiment(spec, tmp_path / "run")
    complete = _rows(run_dir / "runs.csv")
    messages = _rows(run_dir / "messages.csv")
    timelines = {p.name: p.read_text() for p in (run_dir / "timelines").iterdir()}
    assert len(messages) == 4 * 2 * 2 and len(timelines) == 4  # link 0-1, both ways
    # Simulate an interruption after the first configuration: keep its row only (and leave
    # a half-written timeline of another behind).
    with (run_dir / "runs.csv").open() as handle:
        lines = handle.readlines()
    (run_dir / "runs.csv").write_text("".join(lines[:2]))
    (run_dir / "timelines" / "m_zb-h1_fault-free_r0.json").write_text("{")
    (run_dir / ".messages.csv.k1lled_x.tmp").write_text("m,zb-h1")  # as mkstemp names it
    seen: list[str] = []
    run_experiment(spec, run_dir, progress=seen.append)
    assert len(seen) == 3  # only the three missing configurations ran again

    def key(row: dict[str, str]) -> tuple[str, ...]:
        return tuple(row.values())

    assert sorted(_rows(run_dir / "runs.csv"), key=key) == sorted(complete, key=key)
    assert len(_rows(run_dir / "iterations.csv")) == 4 * 2
    # The unfinished configurations' messages were dropped, then written again: no duplicates.
    again = _rows(run_dir / "messages.csv")
    assert tuple(again[0]) == MESSAGES_COLUMNS
    assert sorted(again, key=key) == sorted(messages, key=key)
    assert {p.name: p.read_text() for p in (run_dir / "timelines").iterdir()} == timelines
    assert not list(run_dir.glob(".*.tmp"))


def test_a_run_that_fails_before_its_first_file_leaves_no_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spec of 10^9 repeats ran out of memory building its configurations and left its
    new run directory behind holding only `.lock`, one per attempt."""
    spec = ExperimentSpec(
        name="t", models=("m",), profile=Profile.uniform(2, 4, 1, 1, 1), systems=("1f1b",)
    )

    def out_of_memory(self: ExperimentSpec) -> None:
        raise MemoryError

    monkeypatch.setattr(ExperimentSpec, "configurations", out_of_memory)
    made = new_run_dir(tmp_path / "out", "t")  # what `run --spec` makes
    for run_dir in (made, tmp_path / "out" / "named"):  # and what `--run-id named` does
        with pytest.raises(MemoryError):
            run_experiment(spec, run_dir)
        assert not run_dir.exists()
    kept = tmp_path / "out" / "kept"
    (kept / "notes.txt").parent.mkdir()
    (kept / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="holds 'notes.txt' but no spec.json"):
        run_experiment(spec, kept)  # a folder of someone's files: refused, and it stays
    assert sorted(p.name for p in kept.iterdir()) == ["notes.txt"]


def test_a_run_id_naming_a_folder_of_other_files_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    """`run --spec S --out . --run-id NOTES` ran into a folder of the user's files: its
    spec.json, CSVs, timelines/, plots and report.md went among them, over their report.md,
    where `collect` refuses a folder that is not empty. A folder without a spec.json is
    refused now unless it holds nothing but a lock and a killed write's temporary file."""
    spec = ExperimentSpec(
        name="t", models=("m",), profile=Profile.uniform(2, 4, 1, 1, 1), systems=("1f1b",)
    )
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "report.md").write_text("my notes")
    (mine / "figures").mkdir()
    with pytest.raises(ConfigError) as refused:
        run_experiment(spec, mine)
    assert str(refused.value) == (
        f"{mine} holds 'figures' and 1 more but no spec.json: not a run directory (a run "
        "writes spec.json first); pick a new run id, or an empty folder"
    )
    assert sorted(p.name for p in mine.iterdir()) == ["figures", "report.md"]
    assert (mine / "report.md").read_text() == "my notes"
    killed = tmp_path / "killed"  # as it wrote its spec.json: a run of it goes on
    killed.mkdir()
    (killed / ".lock").write_text("")
    (killed / ".spec.json.k3x_q0ab.tmp").write_text("{")
    run_experiment(spec, killed)
    assert (killed / "spec.json").is_file() and (killed / "report.md").is_file()


def test_a_resume_refuses_results_that_are_not_this_run_s(tmp_path: Path) -> None:
    """A folder holding another run's runs.csv and iterations.csv, but no spec.json, was
    resumed: nothing ran, exit 0, and report.md mixed the other experiment's rows in."""
    spec = ExperimentSpec(
        name="t",
        models=("m",),
        profile=Profile.uniform(2, 4, 1, 1, 1),
        systems=("1f1b",),
        delays_ms=(0.0, 5.0),
        num_iterations=2,
    )
    other = run_experiment(spec, tmp_path / "other")
    copied = tmp_path / "out" / "m"
    copied.mkdir(parents=True)
    for name in ("runs.csv", "iterations.csv"):
        shutil.copy(other / name, copied / name)
    with pytest.raises(ConfigError) as refused:
        run_experiment(spec, copied)
    assert str(refused.value) == (
        f"{copied} has runs.csv, iterations.csv but no spec.json: not a run directory of "
        "this experiment (a run writes spec.json first); pick a new run id"
    )
    # refused before its hold: no `.lock` left among them (it was)
    assert sorted(p.name for p in copied.iterdir()) == ["iterations.csv", "runs.csv"]
    # With a spec.json of its own, rows of another run id are not its own either ...
    mine = run_experiment(spec, tmp_path / "mine")
    for name in ("runs.csv", "iterations.csv"):
        shutil.copy(other / name, mine / name)
    with pytest.raises(ConfigError) as refused:
        run_experiment(spec, mine)
    assert str(refused.value) == (
        f"{mine / 'runs.csv'} line 2 (m 1f1b fault-free (repeat 0)) is of run 'other', not "
        "this run's 'mine': damaged?"
    )
    # ... nor rows of a configuration the spec lacks.
    for name in ("runs.csv", "iterations.csv"):
        text = (other / name).read_text().replace("other", "mine").replace("@5ms", "@7ms")
        (mine / name).write_text(text)
    with pytest.raises(ConfigError) as refused:
        run_experiment(spec, mine)
    assert str(refused.value) == (
        f"{mine / 'runs.csv'} line 3 (m 1f1b 0-1@7ms (repeat 0)) is not a configuration of "
        "the experiment: damaged?"
    )


def test_resuming_with_another_spec_is_refused(tmp_path: Path) -> None:
    spec = default_experiment()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    record = {"schema_version": RESULTS_SCHEMA_VERSION, "spec": {"name": "other"}}
    (run_dir / "spec.json").write_text(json.dumps(record))
    with pytest.raises(ConfigError, match="holds a different experiment"):
        run_experiment(spec, run_dir)
    (run_dir / "spec.json").write_text(json.dumps({**record, "schema_version": 1}))
    with pytest.raises(
        ConfigError, match=f"schema version 1; this version reads {RESULTS_SCHEMA_VERSION} only"
    ):
        run_experiment(spec, run_dir)


_FAULTS_SPEC = """name: t
model: m
profile: {stages: 2, microbatches: 4, t_f: 1, t_b: 1, t_w: 1}
systems: [1f1b]
faults: f.yaml
calibration: host.json
num_iterations: 2
"""


def _faults_run(tmp_path: Path) -> Path:
    """A finished experiment under f.yaml's fault timeline and host.json's calibration."""
    (tmp_path / "s.yaml").write_text(_FAULTS_SPEC)
    (tmp_path / "f.yaml").write_text("- {start_iteration: 1, links: ['0-1'], delay_ms: 5}\n")
    (tmp_path / "host.json").write_text(json.dumps(HostCosts(op_overhead_ms=0.5).to_dict()))
    return run_experiment(load_spec(tmp_path / "s.yaml"), tmp_path / "out" / "a")


@pytest.mark.parametrize(
    ("file", "old", "new", "changed"),
    [
        ("f.yaml", "delay_ms: 5", "delay_ms: 50", "faults_text"),
        ("host.json", '"op_overhead_ms": 0.5', '"op_overhead_ms": 0.25', "calibration_costs"),
    ],
)
def test_resuming_after_the_fault_timeline_or_calibration_changed_is_refused(
    tmp_path: Path, file: str, old: str, new: str, changed: str
) -> None:
    """spec.json keeps what the files held, not only their paths: an edited file is another
    experiment, whose results must not be mixed with the first's."""
    run_dir = _faults_run(tmp_path)
    record = json.loads((run_dir / "spec.json").read_text())
    assert record["spec_version"] == 2
    assert record["spec"]["faults_text"] == (tmp_path / "f.yaml").read_text()
    assert record["spec"]["calibration_costs"]["op_overhead_ms"] == 0.5
    run_experiment(load_spec(tmp_path / "s.yaml"), run_dir)  # unchanged: resumes (done)
    path = tmp_path / file
    path.write_text(path.read_text().replace(old, new))
    with pytest.raises(ConfigError, match=f"holds a different experiment \\({changed} changed\\)"):
        run_experiment(load_spec(tmp_path / "s.yaml"), run_dir)


def test_a_spec_s_profile_may_be_a_profile_file_s_path(tmp_path: Path) -> None:
    """`profile: p.json` (what `adaptra-bench profile` writes), relative to the spec as
    `faults:` is, runs as the same profile given inline; spec.json keeps its values, so an
    edited file is another experiment; a missing one is named."""
    profile = {"stages": 2, "microbatches": 4, "t_f": 1, "t_b": 2, "t_w": 1}
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "p.json").write_text(json.dumps(profile))
    text = "name: t\nmodel: m\nsystems: [1f1b]\nnum_iterations: 2\nprofile: "
    (tmp_path / "specs" / "s.yaml").write_text(text + "p.json\n")
    (tmp_path / "inline.yaml").write_text(text + json.dumps(profile) + "\n")
    from_file, inline = (
        load_spec(tmp_path / "specs" / "s.yaml"),
        load_spec(tmp_path / "inline.yaml"),
    )
    assert from_file.profile == inline.profile and from_file.profile is not None
    assert from_file.profile.t_b_ms == (2.0, 2.0)
    run_dir = run_experiment(from_file, tmp_path / "out" / "a")
    record = json.loads((run_dir / "spec.json").read_text())
    assert record["spec"]["profile"]["t_b"] == [2.0, 2.0]
    run_experiment(load_spec(tmp_path / "specs" / "s.yaml"), run_dir)  # unchanged: resumes
    (tmp_path / "specs" / "p.json").write_text(json.dumps({**profile, "t_b": 3}))
    with pytest.raises(ConfigError, match="holds a different experiment"):
        run_experiment(load_spec(tmp_path / "specs" / "s.yaml"), run_dir)
    (tmp_path / "specs" / "p.json").unlink()
    with pytest.raises(ConfigError, match=r"spec .*s\.yaml: cannot read profile .*p\.json"):
        load_spec(tmp_path / "specs" / "s.yaml")


def test_report_rebuilds_from_spec_json_without_the_fault_timeline_file(tmp_path: Path) -> None:
    """A run directory copied elsewhere, its fault timeline and calibration gone: report
    rebuilds from what spec.json kept."""
    run_dir = _faults_run(tmp_path)
    moved = tmp_path / "moved"
    shutil.copytree(run_dir, moved)
    (tmp_path / "f.yaml").unlink()
    (tmp_path / "host.json").unlink()
    (moved / "report.md").unlink()
    main(["report", str(moved)])  # an error would exit (SystemExit)
    report = (moved / "report.md").read_text()
    assert "| m | 1f1b | direct | fixed | trace:f |" in report
    # a calibrated run's numbers read like the cost-free model's: the report says which
    assert (
        "; git revision" in report
        and report.count(". The simulator ran with a host's measured costs (`calibrate`).") == 1
    )  # the file gives no host, time or shape
    spec = spec_from_record(read_spec_record(moved))
    assert spec.host_costs().op_overhead_ms == 0.5
    said = HostCosts(
        op_overhead_ms=0.5, host="h1", measured_at="2026-12-06T10:00", op_ms=10.0, num_stages=4
    )
    calibrated = dataclasses.replace(spec, calibration_costs=said.to_dict())
    assert _calibration_note(calibrated) == (
        " The simulator ran with a host's measured costs (`calibrate`: host `h1`, measured "
        "2026-12-06T10:00, 4 stages, 10 ms ops)."
    )
    (scenario,) = spec.scenarios(spec.targets()[0])
    assert scenario.faults is not None and scenario.faults.events[0].effect.delay_ms == 5


def test_a_spec_json_of_spec_version_1_is_read_and_not_resumed_with_a_fault_file(
    tmp_path: Path,
) -> None:
    """An older version's spec.json (no spec_version) kept the fault timeline's path only: a
    report reads the file as it did; a resume cannot tell whether the file changed since."""
    run_dir = _faults_run(tmp_path)
    record = json.loads((run_dir / "spec.json").read_text())
    del record["spec_version"], record["spec"]["faults_text"], record["spec"]["calibration_costs"]
    (run_dir / "spec.json").write_text(json.dumps(record))
    assert (
        spec_from_record(read_spec_record(run_dir)).faults_text
        == "- {start_iteration: 1, links: ['0-1'], delay_ms: 5}\n"
    )
    with pytest.raises(ConfigError, match="written by an older version that kept only the paths"):
        run_experiment(load_spec(tmp_path / "s.yaml"), run_dir)
    (run_dir / "spec.json").write_text(json.dumps({**record, "spec_version": 3}))
    with pytest.raises(ConfigError, match="spec version 3; this version reads 1 to 2"):
        read_spec_record(run_dir)


def test_a_spec_file_may_not_give_what_a_spec_reads_from_its_files(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text("name: t\nmodel: m\nsystems: [1f1b]\nfaults_text: x\n")
    with pytest.raises(ConfigError, match="unknown spec key\\(s\\) faults_text"):
        load_spec(tmp_path / "s.yaml")


def test_a_resume_keeps_the_first_git_revision_and_records_later_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = ExperimentSpec(
        name="t", models=("m",), profile=Profile.uniform(2, 4, 1, 1, 1), systems=("1f1b",)
    )
    run_dir = tmp_path / "run"
    for revision in ("aaa", "bbb", "aaa", "bbb", "ccc"):  # the first run, then four resumes
        monkeypatch.setattr("harness.experiment.git_revision", lambda revision=revision: revision)
        run_experiment(spec, run_dir)
    record = read_spec_record(run_dir)
    assert record["git_revision"] == "aaa"
    assert record["resumed_git_revisions"] == ["bbb", "ccc"]
    assert "git revision `aaa` (resumed at `bbb`, `ccc`)." in (run_dir / "report.md").read_text()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"systems": ("nope",)}, "unknown system nope"),
        ({"link_sets": ((3,),)}, "link 3-4 does not exist with 3 stages"),
        ({"link_sets": (("2-4",),)}, "must join neighbouring stages"),
        ({"link_sets": (("pp0:0-1",),)}, "slows a PP link in every replica"),
        (
            {"link_sets": (("0-1", "1-2", "0-1"),), "delays_ms": (5.0,)},
            r"link_sets\[0\]\[2\] \('0-1'\) repeats link 0-1 \(link_sets\[0\]\[0\], '0-1'\); "
            "list each link once",
        ),
        (
            {"link_sets": (("first", 0),), "delays_ms": (5.0,)},
            r"link_sets\[0\]\[1\] \(0\) repeats link 0-1 \(link_sets\[0\]\[0\], 'first'\)",
        ),
        ({"link_sets": ((-1,),)}, "link -1: a PP link's index is its upstream stage"),
        ({"models": ("gpt2-7b",), "profile": None, "link_sets": (("5-6",),)}, "does not exist"),
        ({"models": ({"base": "gpt2-140b", "pp": 2},), "profile": None}, "does not fit 2 stages"),
        ({"models": ({"base": "gpt2-7b", "pp": 5},), "profile": None}, "do not split evenly"),
        ({"models": ("gpt2-3b",), "profile": None}, "unknown model 'gpt2-3b'"),
        ({"models": ("gpt2-7b",), "profile": None, "backend": "emulated"}, "use backend: sim"),
        ({"delays_ms": (-1.0,)}, r"delays_ms\[0\] must be finite and in 0\.\.3600000 ms"),
        ({"delays_ms": (1e12,)}, r"delays_ms\[0\] must be finite and in 0\.\.3600000 ms"),
        ({"delays_ms": ("1e12",)}, r"delays_ms\[0\] must be a number, got '1e12'"),
        ({"delays_ms": ()}, "delays_ms is empty"),
        (
            {"delays_ms": (0.0, 10.0, 10.0000001)},
            "delays_ms 10.0 and 10.0000001 would both name the scenario 0-1@10ms",
        ),
        ({"delays_ms": (1e-7, 1.00000001e-7)}, "would both name the scenario 0-1@1e-07ms"),
        ({"num_iterations": 0}, "num_iterations must be in 1..100000, got 0"),
        ({"num_iterations": 2.5}, "num_iterations must be an integer, got 2.5"),
        ({"num_repeats": True}, "num_repeats must be an integer, got True"),
        ({"num_repeats": 1_000_000_000}, "num_repeats must be in 1..1000, got 1000000000"),
        (
            {"num_repeats": 1000, "delays_ms": tuple(range(101))},  # 101 x 1000 of them
            "the spec has more than 100,000 configurations",
        ),
        ({"seed": "x"}, "seed must be an integer"),
        ({"restart_ms": "5"}, "restart_ms must be a number"),
        ({"transport_timeout_s": None}, "transport_timeout_s must be a number"),
        ({"systems": (["1f1b"],)}, "systems must be a list of names"),
        ({"transport_timeout_s": 0.0}, r"transport_timeout_s must be in \(0, 86400\] s, got 0\.0"),
        # run --timeout's range (a day): 1e14 s passed, and the workers failed to start
        (
            {"transport_timeout_s": 1e14},
            r"transport_timeout_s must be in \(0, 86400\] s, got 100000000000000\.0",
        ),
        ({"injection": "carrier-pigeon"}, "injection 'carrier-pigeon'"),
        ({"name": "../outside"}, "spec name '../outside' must be a single path component"),
        ({"name": "a/b"}, "must be a single path component"),
        ({"name": ".."}, "must be a single path component"),
        ({"name": ""}, "spec name is empty"),
        ({"name": 7}, "name must be a string, got 7"),
        ({"models": ("m\tx",)}, r"model name 'm\\tx' contains the control character"),
        ({"faults": "/tmp/a\nb.txt"}, r"fault timeline file name 'a\\nb' contains"),
        ({"calibration": "/nonexistent/host.json"}, "cannot read calibration"),
        ({"calibration": "h.json", "backend": "emulated"}, "calibration is for the sim backend"),
    ],
)
def test_bad_specs_are_clear_errors(change: dict, message: str) -> None:
    base = {
        "name": "t",
        "models": ("m",),
        "profile": Profile.uniform(3, 3, 1, 1, 1),
        "systems": ("1f1b",),
    }
    with pytest.raises(ConfigError, match=message):
        ExperimentSpec(**{**base, **change})


def test_a_calibration_with_a_cost_model_model_is_refused_as_simulate_refuses_it(
    tmp_path: Path,
) -> None:
    """A calibration is this host's runtime; a cost-model model is the paper's cluster, whose
    1F1B and ZB send nccl-sleep (no host costs): gpt2-7b's 1F1B stayed 421.9 ms with a 0.5 ms
    op overhead, and adaptra-cpu (delegated, which takes them) went from 412.9 to 431.9 ms.
    A profile's systems all take the costs: that spec is accepted."""
    host = tmp_path / "host.json"
    host.write_text(json.dumps(HostCosts(op_overhead_ms=0.5).to_dict()))
    fields = {"name": "c", "systems": ("1f1b", "adaptra-cpu"), "calibration": str(host)}
    with pytest.raises(
        ConfigError,
        match="calibration: model gpt2-7b comes from the cost model .* send nccl-sleep: a "
        "calibration adds this host's runtime costs to comm direct or delegated; nccl-sleep "
        "takes none",
    ):
        ExperimentSpec(models=("gpt2-7b",), **fields)
    spec = ExperimentSpec(models=("m",), profile=Profile.uniform(2, 4, 1, 1, 1), **fields)
    assert spec.host_costs().op_overhead_ms == 0.5


def test_a_calibration_of_the_failover_alone_is_taken_with_a_cost_model_model(
    tmp_path: Path,
) -> None:
    """A calibration holding only `failover_ms` (bench_failover.py's part 3: the paper's trace
    at 140B with the failover measured here) charges no healthy message of any comm, only the
    delegated path's move to another NIC, which the direct systems never make: accepted with a
    cost-model model. With any other cost beside it, refused as before."""
    host = tmp_path / "host.json"
    fields = {"name": "c", "systems": ("1f1b", "adaptra"), "calibration": str(host)}
    host.write_text(json.dumps(HostCosts(failover_ms=1.79, host="h").to_dict()))
    spec = ExperimentSpec(models=("gpt2-7b",), **fields)
    assert spec.host_costs().failover_ms == 1.79
    host.write_text(json.dumps(HostCosts(failover_ms=1.79, op_overhead_ms=0.5).to_dict()))
    with pytest.raises(ConfigError, match="calibration: model gpt2-7b comes from the cost model"):
        ExperimentSpec(models=("gpt2-7b",), **fields)


def test_a_spec_key_that_would_change_nothing_is_refused_as_run_s_option_is(
    tmp_path: Path,
) -> None:
    """`seed: 5` without a fault timeline (sim) and `hardware: foo` with a profile ran, where
    `run --seed 5` without --faults is refused."""
    base = {
        "name": "t",
        "model": "m",
        "profile": {"stages": 2, "microbatches": 4, "t_f": 1, "t_b": 1, "t_w": 1},
        "systems": ["1f1b"],
    }
    with pytest.raises(ConfigError) as refused:
        ExperimentSpec.from_dict({**base, "seed": 5})
    assert str(refused.value) == (
        "seed seeds a fault timeline's draws (faults) and backend megatron's model: this spec "
        "has neither, so it would change nothing"
    )
    with pytest.raises(ConfigError) as refused:
        ExperimentSpec.from_dict({**base, "hardware": "foo"})
    assert str(refused.value) == (
        "hardware is the cost model's: a spec with a profile, which gives the op times and "
        "message sizes, takes none (it would change nothing)"
    )
    (tmp_path / "f.yaml").write_text(
        json.dumps([{"start_iteration": 0, "links": ["0-1"], "delay_ms": 5, "jitter_ms": 1}])
    )
    seeded = ExperimentSpec.from_dict({**base, "seed": 5, "faults": "f.yaml"}, tmp_path)
    assert seeded.seed == 5
    cost_model = {"name": "t", "models": ["gpt2-7b"], "systems": ["1f1b"]}
    fast = ExperimentSpec.from_dict({**cost_model, "hardware": {"base": "h800-ib400"}})
    assert fast.hardware == {"base": "h800-ib400"}
    # spec.json writes every key: a recorded spec keeps its seed and hardware.
    written = json.loads(json.dumps(default_experiment().to_dict()))
    recorded = spec_from_record({"spec_version": 2, "spec": written})
    assert (recorded.seed, recorded.hardware) == (0, "h800-ib400")


def test_a_runtime_spec_refuses_a_delay_its_workers_would_time_out_on_before_any_work() -> None:
    """It was refused only when its configuration came up, after the others had run; raising
    transport_timeout_s then made a resume refuse the run directory (another experiment)."""
    spec = {
        "name": "t",
        "models": ("m",),
        "profile": Profile.uniform(2, 4, 5, 5, 5),
        "systems": ("1f1b",),
        "delays_ms": (0, 5, 2000),
        "transport_timeout_s": 1,
    }
    with pytest.raises(ConfigError) as refused:
        ExperimentSpec(**spec, backend="emulated")
    assert str(refused.value) == (
        "model m, scenario 0-1@2000ms: a delay of 2000 ms is not shorter than the workers' 1 s "
        "timeout for one message: raise the timeout (--timeout, a spec's transport_timeout_s) "
        "or lower the delay"
    )
    assert len(ExperimentSpec(**spec, backend="sim").configurations()) == 3  # no timeout
    longer = ExperimentSpec(**{**spec, "transport_timeout_s": 2.5}, backend="emulated")
    assert [c.scenario.delay_ms for c in longer.configurations()] == [0.0, 5.0, 2000.0]


def test_a_runtime_run_refuses_a_configuration_of_too_many_processes_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An emulated spec whose adaptra-cpu configuration at a 10 ms delay needs 10 delegates
    per link direction and side (4 workers and 120 delegates at 4 stages of 1 ms ops) ran:
    spec.json written and the configurations before it run, that one failed on
    `run_configuration`'s count of processes, and the rest never ran (a spec of that one
    alone left a run directory of a spec.json). Each configuration's first plan is counted
    before anything is written now; a cluster job of the spec (`launch --spec`) spreads its
    ranks over nodes and is not limited by this host's count."""
    import harness.runner as runner

    monkeypatch.setattr(runner, "max_processes", lambda: 100)
    spec = {"name": "t", "models": ("m",), "profile": Profile.uniform(4, 64, 1, 1, 1)}
    spec |= {"backend": "emulated", "systems": ("1f1b", "adaptra-cpu"), "num_iterations": 1}
    run_dir = tmp_path / "out" / "t"
    with pytest.raises(ConfigError) as refused:
        run_experiment(ExperimentSpec(**spec, delays_ms=(0.0, 10.0)), run_dir)
    assert str(refused.value).startswith(
        "model m, system adaptra-cpu, scenario 0-1@10ms: this run would start 4 worker(s) "
        "and 120 delegate process(es), more than the 100 one host takes here"
    )
    assert not run_dir.exists()
    ExperimentSpec(**spec, delays_ms=(0.0, 5.0)).check_processes_here()  # 4 + 60 processes
    sim = {**spec, "backend": "sim"}
    ExperimentSpec(**sim, delays_ms=(10.0,)).check_processes_here()  # no process at all


def test_changed_copies_of_one_model_need_a_name_each_and_one_listed_twice_is_refused() -> None:
    """Both were labelled gpt2-7b-custom and refused as a model listed twice."""
    base = {"name": "t", "profile": None, "systems": ("1f1b",)}
    dp2, dp4 = {"base": "gpt2-7b", "dp": 2}, {"base": "gpt2-7b", "dp": 4}
    with pytest.raises(ConfigError) as refused:
        ExperimentSpec(**base, models=(dp2, dp4))
    assert str(refused.value) == (
        "models[0] and models[1] differ but are both labelled gpt2-7b-custom; give each its "
        "own `name:`"
    )
    with pytest.raises(ConfigError) as refused:
        ExperimentSpec(**base, models=(dp2, "gpt2-14b", dict(dp2)))
    assert str(refused.value) == "models[2] repeats models[0]; list each once"
    # The same model under another label ran twice ([gpt2-7b, {base: gpt2-7b, dp: 1}]).
    for copy in ({"base": "gpt2-7b", "dp": 1}, {"base": "gpt2-7b", "num_microbatches": 12}):
        with pytest.raises(ConfigError) as refused:
            ExperimentSpec(**base, models=("gpt2-7b", copy))
        assert str(refused.value) == (
            "models[1] (gpt2-7b-custom) is models[0] (gpt2-7b) under another name; list each "
            "model once"
        )
    named = ExperimentSpec(**base, models=(dp2, {**dp4, "name": "gpt2-7b-dp4"}))
    assert [(t.label, t.profile.num_replicas) for t in named.targets()] == [
        ("gpt2-7b-custom", 2),
        ("gpt2-7b-dp4", 4),
    ]


PRESET = Path(__file__).parents[2] / "harness" / "presets" / "fig5_straggler_sweep.yaml"


def test_a_yaml_spec_runs_and_report_rebuilds(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "run",
            "--spec",
            str(PRESET),
            "--out",
            str(tmp_path),
            "--run-id",
            "sweep",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    runs = _rows(tmp_path / "sweep" / "runs.csv")
    assert len(runs) == 4 * 7
    adaptra = {
        float(r["delay_ms"]): float(r["median_iteration_ms"])
        for r in runs
        if r["system"] == "adaptra"
    }
    assert adaptra == {d: 390.0 + d for d in (0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0)}
    (tmp_path / "sweep" / "report.md").unlink()
    rebuilt = subprocess.run(
        [sys.executable, "-m", "harness", "report", str(tmp_path / "sweep")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rebuilt.returncode == 0, rebuilt.stderr
    report = (tmp_path / "sweep" / "report.md").read_text()
    assert "| fig4-uniform-10ms | adaptra | delegated | detector | 0-1@60ms | 450.0 |" in report


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: x\nmodel: m\nsystems: [1f1b]\n", "unknown model 'm'"),
        (
            "name: x\nmodels: [{base: gpt2-140b, pp: 2}]\nsystems: [1f1b]\n",
            "does not fit 2 stages",
        ),
        (
            "name: x\nmodel: m\nprofile: {stages: 2, microbatches: 2, t_f: 1, t_b: 1, t_w: 1}\n"
            "systems: [warp]\n",
            "unknown system warp",
        ),
        (
            "name: x\nmodel: m\nprofile: {stages: 2, microbatches: 2, t_f: 1, t_b: 1, t_w: 1}\n"
            "systems: [1f1b]\nlinks: ['1-2']\n",
            "link 1-2 does not exist",
        ),
        (
            "name: x\nmodel: m\nprofile: {stages: 2, microbatches: 2, t_f: 1, t_b: 1, t_w: 1}\n"
            "systems: [1f1b]\ndelays_ms: [-5]\n",
            "delays_ms[0] must be finite and in 0..3600000 ms, got -5",
        ),
        (
            "name: x\nmodel: m\nprofile: {stages: 2, microbatches: 3, t_f: 1, t_b: 1, t_w: 1}\n"
            "systems: [1f1b]\ncolour: red\n",
            "unknown spec key",
        ),
        (  # accepted, then 1F1B's two configurations ran and zb-h2's stopped the run, naming
            # no configuration, and its resume failed the same way every time
            "name: x\nmodel: p\nprofile: {stages: 2, microbatches: 4, t_f: 1, t_b: 1, t_w: 1, "
            "mem_limit: 2}\nsystems: [1f1b, zb-h2]\ndelays_ms: [0, 5]\n",
            "model p, system zb-h2, scenario fault-free: zb-h2 needs 3 microbatches of "
            "activation memory on stage 0 but mem_limit is 2",
        ),
    ],
)
def test_bad_spec_files_are_one_line_errors_and_write_nothing(
    tmp_path: Path, text: str, message: str
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "run",
            "--spec",
            str(spec),
            "--out",
            str(tmp_path / "results"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert out.stderr.startswith(f"error: spec {spec}:") and message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "results").exists()


def test_a_slow_dp_link_slows_the_step_not_the_pipeline(tmp_path: Path) -> None:
    spec = ExperimentSpec(
        name="dp",
        models=("gpt2-7b-dp2",),
        systems=("zb",),
        link_sets=(("dp1:0-1",),),
        delays_ms=(0.0, 10.0),
        num_iterations=1,
        num_warmup_iterations=0,
    )
    runs = {
        r["scenario"]: r
        for r in read_csv_rows(run_experiment(spec, tmp_path / "r") / "runs.csv", RUNS_COLUMNS)
    }
    healthy, slow = runs["fault-free"], runs["dp1:0-1@10ms"]
    assert slow["links"] == "dp1:0-1"
    assert float(slow["median_iteration_ms"]) == float(healthy["median_iteration_ms"])
    # Every message of stage 1's ring on dp1:0-1 waits 10 ms (3.78 GB of gradients: 48
    # buckets of 80 MB, 2 steps each), less what stage 1's ring was shorter than the longest.
    profile = model_cost(MODELS["gpt2-7b-dp2"]).profile
    messages = messages_per_link_direction(profile.allreduce_bytes[1], profile.dp_bucket_bytes, 2)
    assert messages == 96
    added_ms = float(slow["median_wall_ms"]) - float(healthy["median_wall_ms"])
    assert messages * 10.0 - 50.0 < added_ms <= messages * 10.0 + 1e-6


@pytest.mark.parametrize("num_replicas", [1, 2, 4])
def test_a_profile_s_throughput_counts_every_dp_replica_s_microbatches(
    tmp_path: Path, num_replicas: int
) -> None:
    """A hand-written profile's global batch is num_replicas x num_microbatches samples per
    iteration, as a cost-model model's is its dp x microbatches x microbatch size."""
    profile = Profile.uniform(2, 4, 10, 10, 10, num_replicas=num_replicas)
    assert Target("m", profile, None).samples_per_iteration == 4 * num_replicas
    spec = ExperimentSpec(name="dp", models=("m",), profile=profile, systems=("1f1b",))
    (row,) = read_csv_rows(run_experiment(spec, tmp_path / "r") / "runs.csv", RUNS_COLUMNS)
    step_ms = float(row["median_wall_ms"])  # every step alike: no fault
    assert float(row["throughput_samples_per_s"]) == pytest.approx(
        4 * num_replicas * 1000 / step_ms
    )


def test_links_and_link_sets_read_one_form_each() -> None:
    """`links` is one set of links (a scenario slowing them all), a single link too (`links:
    last`); `link_sets` a list of such sets. A flat list under link_sets made a scenario per
    link, where under links it made one slowing them all."""
    base = {"name": "s", "models": ["gpt2-7b"], "systems": ["zb"]}
    assert ExperimentSpec.from_dict({**base, "links": "last"}).link_sets == (("last",),)
    assert ExperimentSpec.from_dict({**base, "links": ["0-1", "2-3"]}).link_sets == (
        ("0-1", "2-3"),
    )
    sets = ExperimentSpec.from_dict({**base, "link_sets": [["0-1"], ["2-3"]]})
    assert sets.link_sets == (("0-1",), ("2-3",))
    with pytest.raises(ConfigError, match="got '0-1' in it"):
        ExperimentSpec.from_dict({**base, "link_sets": ["0-1", "2-3"]})
    with pytest.raises(ConfigError, match="links is one set of links"):
        ExperimentSpec.from_dict({**base, "links": [["0-1"], ["2-3"]]})


def test_dp_links_must_exist() -> None:
    with pytest.raises(ConfigError, match="link dp1:1-2 does not exist"):
        ExperimentSpec(
            name="dp", models=("gpt2-7b-dp2",), systems=("zb",), link_sets=(("dp1:1-2",),)
        )


@pytest.mark.multiprocess
def test_a_megatron_experiment_records_losses(tmp_path: Path) -> None:
    spec = ExperimentSpec(
        name="mg",
        models=("tiny",),
        profile=Profile.uniform(2, 2, 1, 1, 1),
        systems=("1f1b", "zb"),
        num_iterations=2,
        num_warmup_iterations=0,
        backend="megatron",
    )
    run_dir = run_experiment(spec, tmp_path / "mg")
    losses: dict[str, list[float]] = {}
    for row in read_csv_rows(run_dir / "iterations.csv", ITERATIONS_COLUMNS):
        losses.setdefault(row["system"], []).append(float(row["loss"]))
    assert len(losses["1f1b"]) == 2 and losses["1f1b"][1] < losses["1f1b"][0]
    # The same data and seed under both orders: the same training, to rounding.
    assert losses["zb"] == pytest.approx(losses["1f1b"], rel=1e-5)
    digests = {
        r["system"]: r["params_sha256"] for r in read_csv_rows(run_dir / "runs.csv", RUNS_COLUMNS)
    }
    assert set(digests) == {"1f1b", "zb"} and all(len(d) == 64 for d in digests.values())


def test_a_megatron_spec_needs_a_preset_and_a_profile() -> None:
    with pytest.raises(ConfigError, match="unknown model 'huge'"):
        ExperimentSpec(
            name="mg",
            models=("huge",),
            profile=Profile.uniform(2, 2, 1, 1, 1),
            systems=("1f1b",),
            backend="megatron",
        )
    with pytest.raises(ConfigError, match="backend megatron runs a megatron GPT"):
        ExperimentSpec(name="mg", models=("gpt2-7b",), systems=("1f1b",), backend="megatron")


def test_time_left_follows_the_expected_costs_after_the_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first configuration also starts the pool: after it, the pace is what the others
    took per unit of expected cost (a slow link's configuration costs more)."""
    from harness import experiment

    clock = iter([100.0, 105.0, 107.0, 111.0])  # start; three configurations end
    monkeypatch.setattr(experiment.time, "monotonic", lambda: next(clock))
    pace = experiment._Pace(total=1.0 + 1.0 + 2.0 + 4.0)
    assert pace.done(1.0) == (5.0, 5.0 * 7.0)  # only the first: its pace, pool start included
    assert pace.done(1.0) == (7.0, 2.0 * 6.0)  # 2 s for a cost of 1
    assert pace.done(2.0) == (11.0, 2.0 * 4.0)  # 4 s more for 2 more: still 2 s per unit


def test_a_restarted_configuration_s_rows_run_again_are_reported_and_resumed(
    tmp_path: Path,
) -> None:
    """A link down at measured iteration 3 restarts 1F1B from its checkpoint (iteration 2):
    iterations.csv has a row per iteration run, 5 measured and 1 again, which runs.csv says
    (iterations 5, lost_iterations 1); the report and a resume build on them, and one row
    fewer is refused."""
    (tmp_path / "f.yaml").write_text("- {start_iteration: 3, links: ['0-1'], down: true}\n")
    profile = {"stages": 2, "microbatches": 4, "t_f": 1, "t_b": 1, "t_w": 1}
    spec_file = tmp_path / "s.yaml"
    spec = {"name": "s", "model": "m", "profile": profile, "systems": ["1f1b"]}
    spec_file.write_text(json.dumps({**spec, "faults": "f.yaml", "checkpoint_every": 2}))
    run_dir = run_experiment(load_spec(spec_file), tmp_path / "out" / "r")
    (run,) = read_csv_rows(run_dir / "runs.csv", RUNS_COLUMNS)
    assert (run["iterations"], run["restarts"], run["lost_iterations"]) == ("5", "1", "1")
    steps = read_csv_rows(run_dir / "iterations.csv", ITERATIONS_COLUMNS)
    assert [r["iteration"] for r in steps] == ["0", "1", "2", "2", "3", "4"]
    main(["report", str(run_dir)])  # an error would exit (SystemExit)
    run_experiment(load_spec(spec_file), run_dir)  # resumes: nothing left to run
    header, *rows = (run_dir / "iterations.csv").read_text().splitlines()
    (run_dir / "iterations.csv").write_text("\n".join([header, *rows[:-1]]) + "\n")
    message = (
        "iterations.csv has 5 rows of m 1f1b trace:f \\(repeat 0\\), but runs.csv says it ran 6 "
        "iterations \\(1 of them again after a restart\\): damaged\\?"
    )
    with pytest.raises(ConfigError, match=message):
        run_experiment(load_spec(spec_file), run_dir)


def test_a_yaml_spec_s_whole_number_delays_are_written_as_the_default_experiment_s(
    tmp_path: Path,
) -> None:
    """`delays_ms: [0, 10]` gives runs.csv's 0.0 and 10.0, as the default experiment writes
    them, so the gate compares the two as one measurement."""
    (tmp_path / "s.yaml").write_text(
        "name: t\nmodel: m\nprofile: {stages: 2, microbatches: 4, t_f: 1, t_b: 1, t_w: 1}\n"
        "systems: [1f1b]\ndelays_ms: [0, 10]\nnum_iterations: 1\n"
    )
    spec = load_spec(tmp_path / "s.yaml")
    assert spec.delays_ms == (0.0, 10.0) and all(isinstance(d, float) for d in spec.delays_ms)
    run_dir = run_experiment(spec, tmp_path / "out" / "a")
    with (run_dir / "runs.csv").open() as rows:
        assert [row["delay_ms"] for row in csv.DictReader(rows)] == ["0.0", "10.0"]


def test_an_experiment_warns_once_where_adaptra_s_detector_has_no_healthy_link(
    tmp_path: Path,
) -> None:
    spec = ExperimentSpec(
        name="t",
        models=("m",),
        profile=Profile.uniform(2, 4, 1, 1, 1),
        systems=("adaptra", "zb"),
        delays_ms=(0.0, 10.0),
        num_iterations=1,
        num_repeats=2,
    )
    lines: list[str] = []
    run_dir = run_experiment(spec, tmp_path / "run", progress=lines.append)
    warnings = [line for line in lines if "warning" in line]
    assert warnings == [
        "m 0-1@10ms: warning: adaptra finds slow links by comparing them with healthy ones, and "
        "every PP link here is delayed from the first iteration: it will see none slow (delay "
        "some of the links only, or start the delay later with a fault timeline)"
    ]
    # spec.json and report.md keep them (they went to the terminal only, and report.md said
    # "1.00x over zb" with nothing to qualify it); a resume with nothing left warns no more.
    assert json.loads((run_dir / "spec.json").read_text())["warnings"] == warnings
    report = (run_dir / "report.md").read_text()
    assert f"The run warned:\n\n- {warnings[0]}\n" in report
    assert report.index("The run warned:") > report.index("Adaptra's speed-up")
    lines.clear()
    run_experiment(spec, run_dir, progress=lines.append)
    assert not [line for line in lines if "warning" in line]
    assert json.loads((run_dir / "spec.json").read_text())["warnings"] == warnings
    # A spec.json from before (no `warnings`) reports, with no such section.
    record = json.loads((run_dir / "spec.json").read_text())
    del record["warnings"]
    (run_dir / "spec.json").write_text(json.dumps(record))
    main(["report", str(run_dir)])  # an error would exit (SystemExit)
    assert "The run warned:" not in (run_dir / "report.md").read_text()


def test_a_long_configuration_says_how_far_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A configuration said nothing until it ended (minutes of silence in a long runtime
    run, a user review): now a line at most every `HEARTBEAT_S` (here each iteration)."""
    monkeypatch.setattr("harness.experiment.HEARTBEAT_S", 0.0)
    spec = ExperimentSpec(
        name="t",
        models=("m",),
        profile=Profile.uniform(2, 4, 1, 1, 1),
        systems=("zb",),
        num_iterations=2,
    )
    lines: list[str] = []
    run_experiment(spec, tmp_path / "run", progress=lines.append)
    said = [re.sub(r"\(\d+ s\)", "(N s)", line) for line in lines if line.startswith("  [")]
    assert said == [
        f"  [1/1] m zb fault-free: {which} done (N s)"
        for which in ("warm-up iteration 0 of 0-0", "iteration 0 of 0-1", "iteration 1 of 0-1")
    ]


def test_a_swap_that_cannot_move_a_profile_s_dp_delay_is_warned(tmp_path: Path) -> None:
    """A spec's delay on a DP link is the profile's own, which goes with the logical link
    through a rank swap: adaptra and adaptra-cpu swapped for nothing, report.md saying "2
    workers moved" and 1.00x, and nothing why (a user review). (Falcon never sees a change
    from a profile's delay, and says so.)"""
    spec = ExperimentSpec(
        name="t",
        models=("m",),
        profile=Profile.uniform(2, 4, 1, 1, 1, num_replicas=2, allreduce_bytes=(1 << 20,) * 2),
        systems=("zb", "adaptra-cpu", "adaptra"),
        link_sets=(("dp1:0-1",),),
        delays_ms=(30.0,),
        num_iterations=1,
    )
    lines: list[str] = []
    run_experiment(spec, tmp_path / "run", progress=lines.append)
    assert [line for line in lines if "warning" in line] == [
        f"m dp1:0-1@30ms: warning: {system} moves a DP ring link it finds slow onto a PP edge "
        "(a rank swap), but the profile's own delay on dp1:0-1 goes with the logical link "
        "through a swap: a swap cannot move it, and costs its time (a fault timeline's delay "
        "stays on its hosts: give it as a timeline row to see a swap move it)"
        for system in ("adaptra-cpu", "adaptra")
    ]


def test_a_spec_and_its_files_copied_elsewhere_resume_the_same_run(tmp_path: Path) -> None:
    """The spec, its fault timeline and its calibration in another folder (another checkout):
    the same experiment, resumed, where spec.json keeps what the files held; the same copy
    with a changed timeline is another experiment."""
    run_dir = _faults_run(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name in ("s.yaml", "f.yaml", "host.json"):
        shutil.copy(tmp_path / name, elsewhere / name)
    before = (run_dir / "runs.csv").read_text()
    run_experiment(load_spec(elsewhere / "s.yaml"), run_dir)  # done: nothing runs again
    assert (run_dir / "runs.csv").read_text() == before
    (elsewhere / "f.yaml").write_text("- {start_iteration: 1, links: ['0-1'], delay_ms: 6}\n")
    with pytest.raises(ConfigError, match="holds a different experiment \\(faults_text changed\\)"):
        run_experiment(load_spec(elsewhere / "s.yaml"), run_dir)


def test_a_run_directory_copied_under_another_id_and_resumed_keeps_its_first_run_id(
    tmp_path: Path,
) -> None:
    """An interrupted run copied to a new id and resumed wrote the new id in the rows it
    added and in spec.json, the old one in the rest: it keeps the first, as spec.json says."""
    spec = ExperimentSpec(
        name="t",
        models=("m",),
        profile=Profile.uniform(2, 4, 1, 1, 1),
        systems=("1f1b", "zb-h1"),
        num_iterations=2,
    )
    run_dir = run_experiment(spec, tmp_path / "first")
    runs = run_dir / "runs.csv"
    runs.write_text("".join(runs.read_text().splitlines(keepends=True)[:2]))  # interrupted
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    seen: list[str] = []
    run_experiment(spec, copy, progress=seen.append)
    assert seen[0] == f"{copy} holds run first (copied or renamed): its rows keep that run id"
    assert [r["run_id"] for r in _rows(copy / "runs.csv")] == ["first", "first"]
    assert {r["run_id"] for r in _rows(copy / "iterations.csv")} == {"first"}
    assert read_spec_record(copy)["run_id"] == "first"


def test_spec_json_keeps_what_the_models_resolved_to_and_a_resume_compares_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A preset whose batch changed since the run began is another experiment: its resumed
    rows would count other samples per iteration than the first ones."""
    (tmp_path / "s.yaml").write_text("name: t\nmodels: [gpt2-7b]\nsystems: [1f1b, zb]\n")
    run_dir = run_experiment(load_spec(tmp_path / "s.yaml"), tmp_path / "r")
    assert read_spec_record(run_dir)["resolved"] == {
        "samples_per_iteration": {"gpt2-7b": 12},
        "configurations": [
            ["gpt2-7b", "1f1b", "fault-free", "0"],
            ["gpt2-7b", "zb", "fault-free", "0"],
        ],
    }
    runs = run_dir / "runs.csv"
    runs.write_text("".join(runs.read_text().splitlines(keepends=True)[:2]))  # interrupted
    model = MODELS["gpt2-7b"]
    monkeypatch.setitem(MODELS, "gpt2-7b", dataclasses.replace(model, microbatch_size=2))
    with pytest.raises(ConfigError, match=r"holds a different experiment \(resolved changed\)"):
        run_experiment(load_spec(tmp_path / "s.yaml"), run_dir)
    monkeypatch.setitem(MODELS, "gpt2-7b", model)
    run_experiment(load_spec(tmp_path / "s.yaml"), run_dir)  # as it ran: resumed
    assert len(_rows(runs)) == 2


def test_runs_and_iterations_csv_count_the_failovers(tmp_path: Path) -> None:
    """host2:rnic0 fails in measured iteration 2 under a delegated system: the four link
    directions of stage 2 move their delegates to rnic1 then (no restart), which
    iterations.csv counts in that iteration's row and runs.csv over the configuration's."""
    (tmp_path / "f.yaml").write_text("- {start_iteration: 2, nic: 'host2:rnic0', down: true}\n")
    profile = {"stages": 4, "microbatches": 8, "t_f": 10, "t_b": 10, "t_w": 10}
    spec_file = tmp_path / "s.yaml"
    spec = {"name": "s", "model": "m", "profile": profile, "systems": ["adaptra-cpu"]}
    spec_file.write_text(json.dumps({**spec, "faults": "f.yaml", "num_iterations": 4}))
    run_dir = run_experiment(load_spec(spec_file), tmp_path / "out" / "r")
    (run,) = read_csv_rows(run_dir / "runs.csv", RUNS_COLUMNS)
    assert (run["restarts"], run["failovers"]) == ("0", "4")
    steps = read_csv_rows(run_dir / "iterations.csv", ITERATIONS_COLUMNS)
    assert [r["failovers"] for r in steps] == ["0", "0", "4", "0"]


def test_runs_and_iterations_csv_count_the_workers_rank_swaps_moved(tmp_path: Path) -> None:
    """dp1:0-1 turns 20 ms slow in measured iteration 2: Adaptra-CPU's detector finds it and
    a rank swap moves two workers at the start of iteration 4 (as `run` shows them:
    tests/harness/test_cli.py), which iterations.csv counts in that iteration's row and
    runs.csv over the configuration's."""
    (tmp_path / "f.yaml").write_text('- {start_iteration: 2, links: ["dp1:0-1"], delay_ms: 20}\n')
    profile = {
        "stages": 4, "microbatches": 8, "t_f": 2, "t_b": 2, "t_w": 2, "dp": 2,
        "message_bytes": 4096, "allreduce_bytes": 750000, "dp_bucket_bytes": 250000,
    }  # fmt: skip
    spec = {"name": "s", "model": "m", "profile": profile, "systems": ["adaptra-cpu", "zb"]}
    spec_file = tmp_path / "s.yaml"
    spec_file.write_text(json.dumps({**spec, "faults": "f.yaml", "num_iterations": 6}))
    run_dir = run_experiment(load_spec(spec_file), tmp_path / "out" / "r")
    runs = {r["system"]: r for r in read_csv_rows(run_dir / "runs.csv", RUNS_COLUMNS)}
    assert {system: r["moved_workers"] for system, r in runs.items()} == {
        "adaptra-cpu": "2",
        "zb": "0",
    }
    steps = read_csv_rows(run_dir / "iterations.csv", ITERATIONS_COLUMNS)
    moved = [r["moved_workers"] for r in steps if r["system"] == "adaptra-cpu"]
    assert moved == ["0", "0", "0", "0", "0", "2"]


def test_the_run_plans_nothing_its_spec_s_check_planned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spec's check makes each system's first plan of each configuration with the spec's
    memoised planner, and the run plans with the same one: 1F1B and ZB (which never plan
    again) plan once per delay at load and not at all in the run."""
    import harness.spec

    made: list[tuple[str, float]] = []
    real_plan = harness.spec.plan

    def counted(policy: str, profile: Profile):  # type: ignore[no-untyped-def]
        made.append((policy, profile.delay_ms[0]))
        return real_plan(policy, profile)

    base = default_experiment()
    monkeypatch.setattr(harness.spec, "plan", counted)
    spec = dataclasses.replace(
        base, systems=("1f1b", "zb"), delays_ms=(0.0, 20.0), num_iterations=2
    )
    expected = [(p, d) for p in ("1f1b", "zb") for d in (0.0, 20.0)]
    assert sorted(made) == sorted(expected)  # at load, each once
    made.clear()
    run_experiment(spec, tmp_path / "run", progress=lambda _: None)
    assert made == [] and len(_rows(tmp_path / "run" / "runs.csv")) == 4
    assert "planner" not in json.loads((tmp_path / "run" / "spec.json").read_text())["spec"]


def test_a_spec_pickles_with_the_plans_its_check_made() -> None:
    """A spec goes to another process whole (a user's process pool): its memoised planner
    was a closure, which pickle refused; the copy keeps the plans already made."""
    spec = dataclasses.replace(default_experiment(), systems=("1f1b",), delays_ms=(0.0,))
    copy = pickle.loads(pickle.dumps(spec))
    assert copy == spec
    made = vars(spec.planner)["_cache"]
    assert len(made) == 1 and vars(copy.planner)["_cache"] == made


def test_a_spec_run_says_what_each_restart_followed(tmp_path: Path) -> None:
    """A NIC down from iteration 1 restarts 1F1B: the progress line gave the count alone,
    where `run` says what failed (the spec path's restarts were unexplained)."""
    spec = nic_down_spec(tmp_path, ("1f1b",))
    lines: list[str] = []
    run_experiment(spec, tmp_path / "run", progress=lines.append)
    (counted,) = [i for i, line in enumerate(lines) if "1 restart(s)" in line]
    assert lines[counted + 1].startswith(
        "  restarted after LinkFailure: iteration 1: the forward message of microbatch 0 on "
        "link pp0:0-1 cannot go"
    )


def test_each_configuration_s_csv_rows_are_written_once_not_again_with_every_later_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """runs.csv and iterations.csv grow by a configuration's rows as it ends: the rows before
    are copied, not serialised again (rewriting every row made a run quadratic in its
    configurations: 1,600 took 187 s here, the last 400 of them 65 s), also after a resume,
    which writes the files anew once."""
    written: dict[tuple[str, ...], int] = {}
    writerows = csv.DictWriter.writerows

    def counted(self: csv.DictWriter, rows: Any) -> Any:
        rows = list(rows)
        key = tuple(self.fieldnames)
        written[key] = written.get(key, 0) + len(rows)
        return writerows(self, rows)

    monkeypatch.setattr(csv.DictWriter, "writerows", counted)
    spec = ExperimentSpec(
        name="t",
        models=("m",),
        profile=Profile.uniform(2, 4, 1, 1, 1),
        systems=("1f1b", "zb"),
        delays_ms=(0.0, 5.0, 10.0),
        num_iterations=2,
        num_repeats=2,
    )
    run_dir = run_experiment(spec, tmp_path / "run")
    assert written == {ITERATIONS_COLUMNS: 12 * 2, RUNS_COLUMNS: 12}
    assert len(_rows(run_dir / "iterations.csv")) == 12 * 2
    complete = (run_dir / "runs.csv").read_text()
    lines = complete.splitlines(keepends=True)
    (run_dir / "runs.csv").write_text("".join(lines[:5]))  # 4 configurations ended
    written.clear()
    run_experiment(spec, run_dir)
    # once anew (iterations.csv without the 8 configurations' rows runs.csv lacks), then 8
    assert written == {ITERATIONS_COLUMNS: 4 * 2 + 8 * 2, RUNS_COLUMNS: 4 + 8}
    assert len(_rows(run_dir / "iterations.csv")) == 12 * 2

    def key(row: dict[str, str]) -> tuple[str, ...]:
        return tuple(row.values())

    assert sorted(_rows(run_dir / "runs.csv"), key=key) == sorted(
        csv.DictReader(complete.splitlines()), key=key
    )


def test_a_configuration_s_repeats_share_its_warnings_made_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before its first progress line a run makes each configuration's warnings: made once per
    configuration, not per repeat (100,000 configurations' took 15 s of a 20 s silence), and
    still given, once, for every repeat's configuration."""
    made: list[str] = []
    run_warnings = experiment.run_warnings

    def counted(system: str | None, *args: Any, **kwargs: Any) -> list[str]:
        made.append(str(system))
        return run_warnings(system, *args, **kwargs)

    monkeypatch.setattr(experiment, "run_warnings", counted)
    spec = ExperimentSpec(
        name="t",
        models=("m",),
        profile=Profile.uniform(2, 4, 1, 1, 1),
        systems=("zb", "adaptra"),
        delays_ms=(0.0, 10.0),
        num_iterations=1,
        num_repeats=3,
    )
    seen: list[str] = []
    run_dir = run_experiment(spec, tmp_path / "run", progress=seen.append)
    assert sorted(made) == ["adaptra", "adaptra", "zb", "zb"]
    (warning,) = read_spec_record(run_dir)["warnings"]  # adaptra's detector sees no healthy link
    assert warning.startswith("m 0-1@10ms: warning: adaptra finds slow links") and warning in seen


def test_a_sim_spec_times_its_delays_as_its_injection_does(tmp_path: Path) -> None:
    """`run --backend sim --inject network` times the delays and caps as the testbed's
    network does; a spec refused it ("which the simulator has none of"). Its configurations
    record the injection among their inputs (`setups`), so that a compare against the hook's
    timing says they were run another way; the hook's adds nothing (older spec.json files
    compare as before)."""
    profile = Profile.uniform(2, 4, 10, 10, 10, message_bytes=64 << 10, link_bandwidth_gbps=0.1)
    medians = {}
    for injection in ("hook", "network"):
        spec = ExperimentSpec(
            name=injection,
            models=("m",),
            profile=profile,
            systems=("1f1b",),
            delays_ms=(20.0,),
            num_iterations=2,
            injection=injection,
        )
        assert ("injection" in spec.setups()["m"]) is (injection == "network")
        run_dir = run_experiment(spec, tmp_path / injection)
        (row,) = _rows(run_dir / "runs.csv")
        medians[injection] = float(row["median_iteration_ms"])
    # the hook holds the sender for each delay and cap; the network pipelines them
    assert medians["hook"] == pytest.approx(276.2, abs=0.1)
    assert medians["network"] == pytest.approx(251.0, abs=0.1)
