"""`collect`: a cluster job's step timelines (here the simulator's, of the plans the launch
wrote) into a run directory that `report` and `compare` read as they read a run's."""

import csv
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from harness.cluster_job import JOB_FILE, ClusterJob
from harness.collect import CLUSTER, collect_job
from harness.compare import RAN_BY, compare_runs, load_runs
from harness.experiment import run_experiment
from harness.runner import fixed_plan, run_configuration
from harness.slurm import write_slurm_script
from harness.spec import ExperimentSpec
from pipeline.errors import ConfigError
from pipeline.metrics import compute_metrics
from pipeline.profile import Profile
from pipeline.schedule import Schedule
from pipeline.timeline import Timeline
from pipeline.torchrun_launch import LAUNCH_ID_FILE
from tests.harness.test_cli import cli

NUM_ITERATIONS = 3


def _spec(**changes: Any) -> ExperimentSpec:
    """1F1B, ZB and Adaptra on two stages, fault-free and with 0-1 at 10 ms (Adaptra's plan
    for the delay goes over the delegates: the launch skips it)."""
    fields: dict[str, Any] = {
        "name": "cj",
        "models": ("two",),
        "profile": Profile.uniform(2, 4, 2, 2, 2, message_bytes=1024),
        "systems": ("1f1b", "zb", "adaptra"),
        "link_sets": (("0-1",),),
        "delays_ms": (0.0, 10.0),
        "num_iterations": NUM_ITERATIONS,
        "backend": "emulated",
    }
    return ExperimentSpec(**(fields | changes))


def _ran_in_sim(step_dir: Path, job: ClusterJob | None = None) -> Timeline:
    """What a step's workers write, the simulator standing in for the cluster: its measured
    iterations' timeline (numbered from 0), of the profile and schedule the launch wrote, and
    the id of the launch (`job`, else the one its folder holds now) whose command it ran."""
    if job is None:
        job = ClusterJob.read(next(p for p in step_dir.parents if (p / JOB_FILE).is_file()))
    (step_dir / LAUNCH_ID_FILE).write_text(job.launch_id + "\n")
    profile = Profile.from_file(step_dir / "profile.json")
    schedule = Schedule.from_dict(json.loads((step_dir / "schedule.json").read_text()))
    result = run_configuration(
        fixed_plan(schedule, profile), num_iterations=NUM_ITERATIONS, num_warmup_iterations=0
    )
    assert result.timeline is not None
    (step_dir / "timeline.json").write_text(json.dumps(result.timeline.to_dict()))
    return result.timeline


def _job(tmp_path: Path, spec: ExperimentSpec | None = None) -> tuple[Path, ClusterJob]:
    job_dir = tmp_path / "job"
    write_slurm_script(spec or _spec(), job_dir)
    return job_dir, ClusterJob.read(job_dir)


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_collected_steps_are_measured_as_a_run_measures_them(tmp_path: Path) -> None:
    job_dir, job = _job(tmp_path)
    assert [step.configuration for step in job.steps] == [
        ("two", system, scenario, "0")
        for system, scenario in [
            ("1f1b", "fault-free"),
            ("zb", "fault-free"),
            ("adaptra", "fault-free"),
            ("1f1b", "0-1@10ms"),
            ("zb", "0-1@10ms"),
        ]
    ]  # the launch's order (scenarios outermost); adaptra at 10 ms skipped
    assert job.skipped == (
        "skipped two/adaptra/0-1@10ms: delegated comm (the torchrun path has no delegate "
        "transport yet)",
    )
    timelines = {step.configuration: _ran_in_sim(job_dir / step.folder) for step in job.steps}
    said: list[str] = []
    collected = collect_job(job_dir, tmp_path / "results", "c", progress=said.append)
    run_dir = tmp_path / "results" / "c"
    assert (collected.run_dir, collected.num_collected, collected.not_run) == (run_dir, 5, ())
    runs = _rows(run_dir / "runs.csv")
    assert collected.num_skipped == 1 and said == [
        f"[{k}/5] two {r['system']} {r['scenario']}: {float(r['median_wall_ms']):.1f} ms median "
        "step"
        for k, r in enumerate(runs, start=1)
    ]
    # the spec's order, as a run writes them (systems, then scenarios)
    assert [(r["system"], r["scenario"]) for r in runs] == [
        ("1f1b", "fault-free"),
        ("1f1b", "0-1@10ms"),
        ("zb", "fault-free"),
        ("zb", "0-1@10ms"),
        ("adaptra", "fault-free"),
    ]
    for row in runs:
        timeline = timelines[(row["model"], row["system"], row["scenario"], row["repeat"])]
        # the simulator's own measure of the same iterations
        steps = [
            run_configuration(
                fixed_plan(*_plan(job_dir, row)), num_iterations=1, num_warmup_iterations=0
            ).median_wall_ms
        ]
        assert float(row["median_wall_ms"]) == pytest.approx(steps[0])
        iteration_ms = [r.end_ms - r.start_ms for r in timeline.iterations]
        assert float(row["median_iteration_ms"]) == pytest.approx(sorted(iteration_ms)[1])
        assert (row["backend"], row["controller"], row["comm"], row["iterations"]) == (
            "emulated",
            "fixed",
            "direct",
            str(NUM_ITERATIONS),
        )
        assert (row["restarts"], row["failovers"], row["params_sha256"]) == ("0", "0", "")
    slow = {r["system"]: float(r["median_wall_ms"]) for r in runs if r["scenario"] != "fault-free"}
    assert slow["1f1b"] > slow["zb"]  # the delay's cost as the plans run it
    iterations = _rows(run_dir / "iterations.csv")
    assert len(iterations) == 5 * NUM_ITERATIONS
    assert [r["iteration"] for r in iterations[:3]] == ["0", "1", "2"]
    # Adaptra's fault-free plan is its own: what it ran, and for what delays
    (adaptra,) = {r["policy"] for r in iterations if r["system"] == "adaptra"}
    assert adaptra == job.steps[2].policy and adaptra
    assert {r["detected_ms"] for r in iterations} == {"{}"}
    messages = _rows(run_dir / "messages.csv")
    assert {(r["system"], r["iteration"]) for r in messages} == {
        (system, str(k)) for system in ("1f1b", "zb", "adaptra") for k in range(NUM_ITERATIONS)
    }
    assert len(list((run_dir / "timelines").iterdir())) == 5  # each one's last iteration
    record = json.loads((run_dir / "spec.json").read_text())
    assert (record["ran_by"], record["collected_from"]) == (CLUSTER, str(job_dir.resolve()))
    assert record["spec"] == job.spec and record["git_revision"] == job.git_revision
    assert len(record["resolved"]["configurations"]) == 5  # complete: what it collected
    assert record["warnings"] == [
        "the launch skipped 1 configuration(s) the cluster path cannot run (its run.sbatch "
        "says why each)"
    ]
    report = (run_dir / "report.md").read_text()
    assert f"Ran by {CLUSTER}, collected from `{job_dir.resolve()}`" in report
    assert "| two | zb | direct | fixed | 0-1@10ms |" in report
    # the Gantt charts' scenario, 0-1@10ms: Adaptra's was skipped, not left unfinished
    assert "- adaptra: no chart, not run (the launch skipped it: its run.sbatch says why)" in report


def _plan(job_dir: Path, row: dict[str, str]) -> tuple[Schedule, Profile]:
    (step,) = [
        s
        for s in ClusterJob.read(job_dir).steps
        if s.configuration == (row["model"], row["system"], row["scenario"], row["repeat"])
    ]
    folder = job_dir / step.folder
    schedule = Schedule.from_dict(json.loads((folder / "schedule.json").read_text()))
    return schedule, Profile.from_file(folder / "profile.json")


def test_steps_without_results_are_left_out_and_named(tmp_path: Path) -> None:
    job_dir, job = _job(tmp_path)
    first, _, _, _, failed = job.steps  # (1f1b fault-free, zb 0-1@10ms)
    for step in job.steps[1:4]:
        _ran_in_sim(job_dir / step.folder)
    said: list[str] = []
    collected = collect_job(job_dir, tmp_path / "out", "c", progress=said.append)
    assert collected.num_collected == 3
    assert said[:2] == [
        f"not collected: two 1f1b fault-free (repeat 0): no {job_dir / first.folder}/timeline.json",
        f"not collected: two zb 0-1@10ms (repeat 0): no {job_dir / failed.folder}/timeline.json",
    ]
    record = json.loads((collected.run_dir / "spec.json").read_text())
    assert record["warnings"][0] == (
        "2 of the job's 5 steps have no results and are left out (failed, or not run: the job "
        "stopped before them)"
    )
    assert record["left_out"] == [list(first.configuration), list(failed.configuration)]
    assert [(r["system"], r["scenario"]) for r in _rows(collected.run_dir / "runs.csv")] == [
        ("1f1b", "0-1@10ms"),
        ("zb", "fault-free"),
        ("adaptra", "fault-free"),
    ]
    report = (collected.run_dir / "report.md").read_text()  # its charts: at 0-1@10ms
    assert "- zb: no chart, its cluster job's step has no results (it failed, or did" in report
    assert "- adaptra: no chart, not run (the launch skipped it: its run.sbatch says" in report


def test_a_launch_again_removes_its_steps_earlier_results(tmp_path: Path) -> None:
    """An earlier launch's results in a step's folder were collected as the new launch's
    (collect told them apart by their files' times, which a copy of the folder rewrites)."""
    job_dir, job = _job(tmp_path)
    for step in job.steps:
        _ran_in_sim(job_dir / step.folder)
        (job_dir / step.folder / "losses.json").write_text("[]")
    write_slurm_script(_spec(), job_dir)
    assert not list(job_dir.rglob("timeline.json")) and not list(job_dir.rglob("losses.json"))
    with pytest.raises(ConfigError, match=r"no step of .* has results yet"):
        collect_job(job_dir, tmp_path / "out", "c")


def test_an_earlier_launch_s_job_that_ran_after_a_launch_again_is_refused(
    tmp_path: Path,
) -> None:
    """A job of an earlier launch into the folder, still queued or running when the spec was
    launched again (sbatch keeps the script it was given), ran its steps after that launch:
    collect took their results as the new launch's, though their command lines were the
    earlier launch's (here one warm-up, where the spec now says three)."""
    spec = _spec(systems=("1f1b",), delays_ms=(0.0,))
    job_dir, earlier = _job(tmp_path, spec)
    _, job = _job(tmp_path, _spec(systems=("1f1b",), delays_ms=(0.0,), num_warmup_iterations=3))
    assert [s.folder for s in job.steps] == [s.folder for s in earlier.steps]
    for step in job.steps:  # the earlier job's steps, run after the launch again
        _ran_in_sim(job_dir / step.folder, earlier)
    with pytest.raises(
        ConfigError,
        match=rf"{job_dir / job.steps[0].folder}: the results of another launch into "
        rf"{job_dir} \(its {earlier.launch_id}, not {job.launch_id}\)",
    ):
        collect_job(job_dir, tmp_path / "out", "c")
    assert not (tmp_path / "out").exists()
    for step in job.steps:  # this launch's job ran them again: collected
        _ran_in_sim(job_dir / step.folder, job)
    assert collect_job(job_dir, tmp_path / "out", "c").num_collected == 1


def test_a_job_with_no_results_writes_nothing(tmp_path: Path) -> None:
    job_dir, _ = _job(tmp_path)
    with pytest.raises(ConfigError, match=r"no step of .* has results yet \(5 without: two 1f1b"):
        collect_job(job_dir, tmp_path / "out", "c")
    assert not (tmp_path / "out").exists()


def test_a_step_s_timeline_of_other_iterations_is_refused_and_nothing_stays(
    tmp_path: Path,
) -> None:
    job_dir, job = _job(tmp_path, _spec(num_iterations=4))
    for step in job.steps:  # 3 iterations where the spec runs 4: cut short, or another run's
        _ran_in_sim(job_dir / step.folder)
    with pytest.raises(
        ConfigError, match=r"holds iterations 0, 1, 2, not the spec's measured iterations 0-3"
    ):
        collect_job(job_dir, tmp_path / "out", "c")
    assert not (tmp_path / "out").exists()  # every step read before the run directory


def test_a_failed_write_removes_the_run_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_dir, job = _job(tmp_path)
    for step in job.steps:
        _ran_in_sim(job_dir / step.folder)

    def broken(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("harness.report.write_report", broken)
    with pytest.raises(OSError, match="disk full"):
        collect_job(job_dir, tmp_path / "out", "c")
    assert list((tmp_path / "out").iterdir()) == []


def test_an_existing_run_directory_is_not_collected_into(tmp_path: Path) -> None:
    job_dir, job = _job(tmp_path)
    for step in job.steps:
        _ran_in_sim(job_dir / step.folder)
    (tmp_path / "out" / "c").mkdir(parents=True)
    (tmp_path / "out" / "c" / "mine.txt").write_text("keep")
    with pytest.raises(ConfigError, match=r"out/c is not empty: pick another --run-id"):
        collect_job(job_dir, tmp_path / "out", "c")
    assert (tmp_path / "out" / "c" / "mine.txt").read_text() == "keep"


def test_a_collected_run_is_not_the_same_measurement_as_a_run_here(tmp_path: Path) -> None:
    """compare tells them apart by what ran them (here: the same files, but for spec.json's
    `ran_by`), and a run cannot resume a collected one."""
    spec = _spec(systems=("1f1b",), delays_ms=(10.0,))
    job_dir, job = _job(tmp_path, spec)
    for step in job.steps:
        _ran_in_sim(job_dir / step.folder)
    collected = collect_job(job_dir, tmp_path / "out", "cluster").run_dir
    here = tmp_path / "out" / "here"
    shutil.copytree(collected, here)
    record = json.loads((here / "spec.json").read_text())
    del record["ran_by"], record["collected_from"]
    (here / "spec.json").write_text(json.dumps(record))
    same = compare_runs(load_runs(here), load_runs(here), 0.0)
    assert same.mismatches == [] and len(same.changes) == 9
    comparison = compare_runs(load_runs(here), load_runs(collected), 0.0)
    assert [(m.configuration, m.column, m.base, m.new) for m in comparison.mismatches] == [
        ("two 1f1b 0-1@10ms", RAN_BY, "adaptra-bench run", CLUSTER)
    ]
    assert not any(c.worse for c in comparison.changes)  # the same numbers otherwise
    with pytest.raises(ConfigError, match=r"holds what a cluster job .* ran \(collected\)"):
        run_experiment(spec, collected)


def test_a_megatron_step_needs_its_losses_and_digest(tmp_path: Path) -> None:
    megatron = _spec(
        backend="megatron",
        models=("tiny",),
        profile=Profile.uniform(2, 4, 2, 2, 2),
        systems=("1f1b",),
    )
    job_dir, job = _job(tmp_path, megatron)
    step = job.steps[0]
    _ran_in_sim(job_dir / step.folder)
    for other in job.steps[1:]:
        _ran_in_sim(job_dir / other.folder)
        (job_dir / other.folder / "losses.json").write_text("[3.0, 2.5, 2.0]")
        (job_dir / other.folder / "params_sha256.txt").write_text("ab" * 32 + "\n")
    with pytest.raises(ConfigError, match=r"cannot read losses .*/losses.json: No such file"):
        collect_job(job_dir, tmp_path / "out", "c")
    (job_dir / step.folder / "losses.json").write_text("[3.0, 2.5]")
    with pytest.raises(ConfigError, match=r"not 3 losses, one per measured iteration"):
        collect_job(job_dir, tmp_path / "out", "c")
    (job_dir / step.folder / "losses.json").write_text("[3.0, 2.5, 2.25]")
    (job_dir / step.folder / "params_sha256.txt").write_text("not a digest\n")
    with pytest.raises(ConfigError, match=r"does not hold a SHA-256"):
        collect_job(job_dir, tmp_path / "out", "c")
    (job_dir / step.folder / "params_sha256.txt").write_text("cd" * 32 + "\n")
    run_dir = collect_job(job_dir, tmp_path / "out", "c").run_dir
    runs = _rows(run_dir / "runs.csv")
    assert [r["params_sha256"] for r in runs] == ["cd" * 32, "ab" * 32]
    losses = [r["loss"] for r in _rows(run_dir / "iterations.csv")]
    assert losses == ["3.0", "2.5", "2.25", "3.0", "2.5", "2.0"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda d: d.pop("steps"),
            r"not what launch writes \(spec, revision, launch id, steps, skipped\)",
        ),
        (
            lambda d: d.update(launch_id="../x"),
            r"not what launch writes \(spec, revision, launch id, steps, skipped\)",
        ),
        (lambda d: d.update(job_version=1), r"job version 1; this version reads 2 only"),
        (
            lambda d: d["steps"][0].update(folder="../elsewhere"),
            r"step folder '../elsewhere' is not inside the job's folder",
        ),
        (
            lambda d: d["steps"][0].update(believed_ms={"0-1": "10"}),
            r"step 'two_1f1b_fault-free' is not what launch writes",
        ),
        (
            lambda d: d["steps"].append(d["steps"][0]),
            r"a configuration has two steps",
        ),
    ],
)
def test_a_damaged_launch_record_is_refused_naming_it(
    tmp_path: Path, change: Any, message: str
) -> None:
    job_dir, _ = _job(tmp_path)
    path = job_dir / JOB_FILE
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=rf"cluster job {path}: {message}"):
        ClusterJob.read(job_dir)


def test_a_folder_without_a_launch_record_is_no_job(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"is not a cluster job's folder: it has no launch"):
        collect_job(tmp_path, tmp_path / "out")


def test_a_launch_record_round_trips(tmp_path: Path) -> None:
    _, job = _job(tmp_path)
    assert ClusterJob.from_dict(json.loads(json.dumps(job.to_dict()))) == job


def test_the_command_names_what_it_collected_and_refuses_in_one_line(tmp_path: Path) -> None:
    job_dir, job = _job(tmp_path)
    for step in job.steps[1:]:
        _ran_in_sim(job_dir / step.folder)
    done = cli("collect", str(job_dir), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (run_dir,) = (tmp_path / "out").iterdir()
    assert run_dir.name.startswith("cj-")  # the spec's name and the time, as `run` names
    assert done.stdout == (
        f"collected 4 configuration run(s); 1 without results left out; 1 the launch "
        f"skipped: {run_dir} (report.md in it)\n"
    )
    assert done.stderr.startswith("not collected: two 1f1b fault-free (repeat 0): no ")
    assert cli("report", str(run_dir)).returncode == 0  # `report` reads it as a run's
    none = cli("collect", str(tmp_path))
    assert none.returncode == 1 and none.stderr == (
        f"error: {tmp_path} is not a cluster job's folder: it has no launch.json "
        "(`adaptra-bench launch --spec FILE --out DIR` writes one)\n"
    )


def _damage(data: dict[str, Any], how: str) -> None:
    if how == "a record of an iteration it lacks":
        data["ops"][0][0] = 7
    elif how == "no ops":
        data["ops"] = []
    elif how == "a negative step":
        data["iterations"][1][3] = -5.0
    elif how == "an op ending before it starts":
        data["ops"][0][5] = data["ops"][0][4] - 1.0
    elif how == "an op of replica 3":
        data["ops"][0][6] = 3
    elif how == "a rank's ops of iteration 1 lost":
        data["ops"] = [op for op in data["ops"] if op[:2] != [1, 1]]
        data["messages"] = [m for m in data["messages"] if m[0] != 1]
    elif how == "an op twice":
        data["ops"].append(data["ops"][0])
    elif how == "an op of microbatch 9":
        data["ops"].append([*data["ops"][0][:3], 9, *data["ops"][0][4:]])
    elif how == "3 stages":
        data["num_stages"] = 3
    elif how == "every op at its start":
        for op in data["ops"]:
            op[4] = op[5] = data["iterations"][op[0]][1]
    else:  # an op on stage 5 of 2
        data["ops"][0][1] = 5


@pytest.mark.parametrize(
    ("how", "said"),
    [
        ("a record of an iteration it lacks", r"a record of iteration 7, which it lacks: damaged"),
        ("no ops", r"iteration 0 has ops of stages \[\], not of stages 0-1: damaged"),
        ("an op on stage 5", r"iteration 0 has ops of stages \[0, 1, 5\], not of stages 0-1"),
        ("a negative step", r"iteration 1 of [0-9.]+ ms, a step of -5 ms, bubble ratio"),
        ("an op ending before it starts", r"iteration 0 has an op of replica 0 \(of 1\) from"),
        ("an op of replica 3", r"iteration 0 has an op of replica 3 \(of 1\) from"),
        ("3 stages", r"a timeline of 3 stages, the step's profile has 2"),
        (
            "a rank's ops of iteration 1 lost",
            r"iteration 1: stage 1 \(replica 0\) ran microbatch 0 as nothing, not F and B, W "
            r"\(or BW\) once each: cut short, or damaged",
        ),
        ("an op twice", r"iteration 0: stage 0 \(replica 0\) ran microbatch 0 as F, F, B, W"),
        ("an op of microbatch 9", r"iteration 0 has ops of microbatches outside 0-3: damaged"),
        ("every op at its start", r"iteration 0 of 0 ms, a step of 0 ms"),
    ],
)
def test_a_timeline_whose_records_do_not_add_up_is_refused(
    tmp_path: Path, how: str, said: str
) -> None:
    """Each passed `Timeline.from_dict` (which checks each record on its own) and then
    crashed collect (an internal error, exit 3) or, a negative step, was written and then
    refused as the report read the run directory's own iterations.csv back."""
    job_dir, job = _job(tmp_path)
    for step in job.steps:
        _ran_in_sim(job_dir / step.folder)
    path = job_dir / job.steps[-1].folder / "timeline.json"
    data = json.loads(path.read_text())
    _damage(data, how)
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=rf"{path}: {said}"):
        collect_job(job_dir, tmp_path / "out", "c")
    assert not (tmp_path / "out").exists()


def test_a_dp_step_s_all_reduce_is_in_its_step_and_bubble_ratio(tmp_path: Path) -> None:
    """PP 2 x DP 2 with a gradient: each iteration's step time (its DP all-reduce and
    optimizer) and bubble ratio as `compute_metrics` gives them for the step's timeline."""
    dp = Profile.uniform(2, 4, 2, 2, 2, message_bytes=1024, num_replicas=2,
                         allreduce_bytes=4_000_000, dp_bandwidth_gbps=1.0)  # fmt: skip
    job_dir, job = _job(tmp_path, _spec(profile=dp, systems=("zb",), delays_ms=(0.0,)))
    (step,) = job.steps
    timeline = _ran_in_sim(job_dir / step.folder)
    run_dir = collect_job(job_dir, tmp_path / "out", "c").run_dir
    measured = [compute_metrics(timeline, k) for k in range(NUM_ITERATIONS)]
    rows = _rows(run_dir / "iterations.csv")
    assert [float(r["step_time_ms"]) for r in rows] == [m.step_time_ms for m in measured]
    assert [float(r["bubble_ratio"]) for r in rows] == [m.bubble_ratio for m in measured]
    assert all(m.step_time_ms > 0 for m in measured)
    (run,) = _rows(run_dir / "runs.csv")
    walls = sorted(m.iteration_time_ms + m.step_time_ms for m in measured)
    assert float(run["median_wall_ms"]) == walls[1]
    assert float(run["throughput_samples_per_s"]) == pytest.approx(8 * 1000 / (sum(walls) / 3))
