import json
import os
import random
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.cluster_job import ClusterJob
from harness.collect import collect_job
from harness.results import ITERATIONS_COLUMNS, RUNS_COLUMNS, read_csv_rows
from harness.slurm import write_slurm_script
from harness.spec import ExperimentSpec, load_spec
from pipeline.errors import ConfigError
from pipeline.metrics import compute_metrics
from pipeline.profile import Profile
from pipeline.timeline import Timeline

PRESETS = Path(__file__).parents[2] / "harness" / "presets"


def _two_stages(**changes: Any) -> ExperimentSpec:
    """1F1B on a small two-stage profile labelled "tiny" (the megatron backend's model)."""
    fields: dict[str, Any] = {
        "name": "tiny",
        "models": ("tiny",),
        "profile": Profile.uniform(2, 2, 1, 1, 1),
        "systems": ("1f1b",),
    }
    return ExperimentSpec(**(fields | changes))


def test_a_preset_becomes_one_srun_step_per_runnable_configuration(tmp_path: Path) -> None:
    spec = load_spec(PRESETS / "fig16_models.yaml")
    script, num_configurations, num_skipped = write_slurm_script(spec, tmp_path)
    text = script.read_text()
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    # 7B and 14B under 1F1B and ZB (direct) in all 5 scenarios, Adaptra while fault-free;
    # the delegated path, and TP for 30B/60B, are not on the torchrun path yet: listed as
    # skipped, the 80 configurations' rest.
    assert num_configurations == 2 * (2 * 5 + 1)
    assert num_skipped == 4 * 4 * 5 - num_configurations
    assert text.count("\nrun_step ") == num_configurations
    assert text.count("\n# skipped ") == num_skipped
    assert "#SBATCH --nodes=1" in text and "#SBATCH --gpus" not in text  # emulated steps
    assert "# skipped gpt2-30b/1f1b/fault-free: TP 2" in text
    assert "# skipped gpt2-14b/adaptra/6-7@60ms: delegated comm" in text
    step = tmp_path / "gpt2-14b_zb_6-7-60ms"
    profile = Profile.from_file(step / "profile.json")
    assert profile.delay_ms[6] == 60.0 and profile.num_stages == 8
    assert json.loads((step / "schedule.json").read_text())["stages"]
    # The cost models' plans send `nccl-sleep` (the paper's injected sleeps, in the
    # simulator); the steps send direct, and collect's results used to say `nccl-sleep`.
    steps = ClusterJob.read(tmp_path).steps
    assert len(steps) == num_configurations
    assert {step.comm for step in steps} == {"direct"}
    assert {c for step in steps for c in step.link_comms.values()} == {"direct"}


def test_each_repeat_is_a_step_of_its_own_in_a_folder_of_its_own(tmp_path: Path) -> None:
    spec = _two_stages(num_iterations=4, num_warmup_iterations=2, num_repeats=3)
    script, num_configurations, _ = write_slurm_script(spec, tmp_path)
    assert num_configurations == 1
    steps = [
        shlex.split(line)
        for line in script.read_text().splitlines()
        if line.startswith("run_step ")
    ]
    config = tmp_path / "tiny_1f1b_fault-free"
    assert [step[3:5] for step in steps] == [
        [f"tiny_1f1b_fault-free-{k}", str(config / f"repeat-{k}")] for k in range(3)
    ]
    for step in steps:  # one plan, read by every repeat; warm-ups apart from the measured
        args = step[5:]
        assert args[args.index("--profile") + 1] == str(config / "profile.json")
        assert args[args.index("--warmup-iterations") + 1] == "2"
        assert args[args.index("--iterations") + 1] == "4"
        assert args[args.index("--out") + 1] == step[4]


NOTHING_RUNS = "no configuration of this spec can run on the cluster yet: "
TP_ONLY_SIMULATED = "(the runtime runs PP x DP ranks; TP is modelled by the simulator only)"


def _refusal(spec: ExperimentSpec, tmp_path: Path, gpus_per_node: int = 8) -> str:
    with pytest.raises(ConfigError) as refused:
        write_slurm_script(spec, tmp_path, gpus_per_node=gpus_per_node)
    return str(refused.value)


def test_nothing_runnable_is_one_line_counted_by_reason(tmp_path: Path) -> None:
    """Not each skipped configuration's comment joined up: how many, for each reason."""
    spec = ExperimentSpec(name="x", models=("gpt2-30b",), systems=("zb",))
    assert _refusal(spec, tmp_path) == f"{NOTHING_RUNS}1 has TP 2 {TP_ONLY_SIMULATED}"
    spec = ExperimentSpec(name="x", models=("gpt2-30b", "gpt2-60b"), systems=("zb", "1f1b"))
    assert _refusal(spec, tmp_path) == (
        f"{NOTHING_RUNS}2 have TP 2 and 2 have TP 4 {TP_ONLY_SIMULATED}"
    )
    message = _refusal(load_spec(PRESETS / "table3_trace.yaml"), tmp_path)
    assert message == f"{NOTHING_RUNS}4 have TP 8 {TP_ONLY_SIMULATED}"
    assert "\n" not in message and "#" not in message


def test_a_fault_timeline_or_a_delay_the_workers_time_out_on_is_counted_too(
    tmp_path: Path,
) -> None:
    faulted = ExperimentSpec(
        name="f",
        models=("tiny",),
        profile=Profile.uniform(2, 2, 1, 1, 1),
        systems=("1f1b", "zb"),
        faults="t.txt",
        faults_text="1;0_1;0.01\n",
    )
    assert _refusal(faulted, tmp_path) == (
        f"{NOTHING_RUNS}2 have a fault timeline (the torchrun path runs fixed plans only; "
        "`adaptra-bench run` replays timelines)"
    )
    held = _two_stages(systems=("1f1b", "zb"), delays_ms=(3000,), transport_timeout_s=2)
    assert _refusal(held, tmp_path) == (
        f"{NOTHING_RUNS}2 have a delay of 3000 ms (not shorter than the workers' 2 s timeout "
        "for one message, the spec's transport_timeout_s: its step would fail)"
    )


def test_a_delay_the_workers_would_time_out_on_is_a_skipped_configuration(
    tmp_path: Path,
) -> None:
    """The script ran it, its step failed with a TimeoutError (and ended the job, then):
    now it is listed as skipped, and the rest run. A delay just under the timeout runs. (A
    sim spec: one of a runtime backend refuses the delay when it is made, as `run` would.)"""
    spec = _two_stages(delays_ms=(0, 1999, 2000), transport_timeout_s=2)
    script, num_configurations, num_skipped = write_slurm_script(spec, tmp_path / "job")
    assert (num_configurations, num_skipped) == (2, 1)
    text = script.read_text()
    assert "\n# skipped tiny/1f1b/0-1@2000ms: a delay of 2000 ms (not shorter than the " in text
    assert not (tmp_path / "job" / "tiny_1f1b_0-1-2000ms").exists()
    assert (tmp_path / "job" / "tiny_1f1b_0-1-1999ms" / "profile.json").is_file()


def test_a_refused_spec_writes_nothing(tmp_path: Path) -> None:
    """The refusal came after some configurations' files were written: now it comes first."""
    spec = _two_stages(systems=("1f1b", "zb"), delays_ms=(5000,), transport_timeout_s=2)
    with pytest.raises(ConfigError, match="no configuration of this spec can run"):
        write_slurm_script(spec, tmp_path / "job")
    assert not (tmp_path / "job").exists()
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "mine.txt").write_text("kept")
    with pytest.raises(ConfigError, match="no configuration of this spec can run"):
        write_slurm_script(spec, tmp_path / "job")
    assert [p.name for p in (tmp_path / "job").iterdir()] == ["mine.txt"]


@pytest.mark.parametrize(
    ("num_stages", "gpus_per_node", "placement"),  # placement: nodes, ranks on each
    [(9, 8, (3, 3)), (8, 8, (1, 8)), (16, 8, (2, 8)), (12, 8, (2, 6)), (3, 2, (3, 1))],
)
def test_the_ranks_go_on_the_fewest_nodes_that_split_them_evenly(
    tmp_path: Path, num_stages: int, gpus_per_node: int, placement: tuple[int, int]
) -> None:
    """9 ranks on 8-GPU nodes were refused (2 nodes do not split them); 3 nodes of 3 do."""
    spec = _two_stages(profile=Profile.uniform(num_stages, num_stages, 1, 1, 1))
    script, num_configurations, _ = write_slurm_script(
        spec, tmp_path / "job", gpus_per_node=gpus_per_node
    )
    assert num_configurations == 1
    text = script.read_text()
    (step,) = [shlex.split(line) for line in text.splitlines() if line.startswith("run_step ")]
    assert (int(step[1]), int(step[2])) == placement
    assert f"\n#SBATCH --nodes={placement[0]}\n" in text


def _free_port_below_the_ephemeral_range() -> int:
    """A port free now, where no connection takes its source port from: one the kernel handed
    out (bound to port 0, then freed) was taken as a parallel test's connection's source port
    before torchrun's store could bind it, whose agent then waited for a store that was not
    there and failed (RendezvousConnectionError, once in CI)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in random.Random(os.getpid()).sample(range(low // 2, low), 200):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free port in {low // 2}-{low - 1}")


@pytest.mark.multiprocess
@pytest.mark.parametrize("backend", ["emulated", "megatron"])
def test_the_script_runs_under_a_stand_in_slurm(tmp_path: Path, backend: str) -> None:
    """srun and scontrol replaced by stand-ins that run the step here: torchrun really
    starts the ranks, they run (or train: megatron) and write a timeline (and losses)."""
    spec = _two_stages(num_iterations=2, num_warmup_iterations=1, backend=backend)
    port = _free_port_below_the_ephemeral_range()
    script, num_steps, _ = write_slurm_script(spec, tmp_path / "job", master_port=port)
    assert num_steps == 1
    assert (f"--compute {backend}" in script.read_text()) and (
        backend == "emulated" or "--model tiny" in script.read_text()
    )
    # emulated workers compute on the CPU: their job held 8 GPUs a node for nothing
    assert ("#SBATCH --gpus-per-node=8" in script.read_text()) == (backend == "megatron")
    # srun: drop its own --options, run the command on this host.
    env = _stand_in_slurm(
        tmp_path,
        srun='while [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"',
        python=f'exec {sys.executable} "$@"',
    )
    env["GLOO_SOCKET_IFNAME"] = "lo"
    env["TMPDIR"] = str(tmp_path / "tmp")  # where torchrun left its log folder
    (tmp_path / "tmp").mkdir()
    done = subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-2000:]
    step = tmp_path / "job" / "tiny_1f1b_fault-free"
    timeline = Timeline.from_dict(json.loads((step / "timeline.json").read_text()))
    # torchrun's logs are the step's (its agent's folder, named by the rendezvous: job 7's
    # step), none left in the node's temporary directory
    (logs,) = (step / "torchrun-logs").iterdir()
    assert logs.name.startswith("7-tiny_1f1b_fault-free_") and any(logs.rglob("*"))
    assert list((tmp_path / "tmp").glob("torchelastic_*")) == []  # (megatron's inductor
    # cache may be there)
    assert len(timeline.iterations) == 2 and len(timeline.ops) == 2 * 2 * 2 * 2
    # the launch's id, which collect checks (not an earlier launch's job into the folder)
    launch_id = ClusterJob.read(tmp_path / "job").launch_id
    assert (step / "launch_id.txt").read_text() == launch_id + "\n"
    # The warm-up ran first, unreported: the measured iterations start after it.
    assert [r.iteration for r in timeline.iterations] == [0, 1]
    assert timeline.iterations[0].start_ms > 0 and {op.iteration for op in timeline.ops} == {0, 1}
    if backend == "megatron":
        losses = json.loads((step / "losses.json").read_text())
        # one per measured iteration, as `run` reports them (the warm-up's was first too,
        # one off from the timeline's iterations)
        assert len(losses) == 2 and losses[1] < losses[0]
        assert len((step / "params_sha256.txt").read_text().strip()) == 64
    else:
        assert not (step / "losses.json").exists()
    # `collect` makes the job's results a run directory, measured as `run` measures
    collected = collect_job(tmp_path / "job", tmp_path / "results", "cluster")
    (run,) = read_csv_rows(collected.run_dir / "runs.csv", RUNS_COLUMNS)
    iterations = read_csv_rows(collected.run_dir / "iterations.csv", ITERATIONS_COLUMNS)
    assert (run["backend"], run["system"], run["controller"]) == (backend, "1f1b", "fixed")
    times = [compute_metrics(timeline, k).iteration_time_ms for k in range(2)]
    assert [float(r["iteration_time_ms"]) for r in iterations] == pytest.approx(times)
    if backend == "megatron":
        assert [float(r["loss"]) for r in iterations] == losses
        assert run["params_sha256"] == (step / "params_sha256.txt").read_text().strip()


@pytest.mark.multiprocess
def test_a_one_node_step_does_not_join_whatever_holds_the_port_on_node_0(
    tmp_path: Path,
) -> None:
    """Another job on node 0 (an emulated job holds no GPU: Slurm packs them) or any torchrun
    there (29500 is torchrun's default) held --master-port: the step's torchrun, failing to
    bind it, joined that store as a client (torch's c10d backend does so), and ran through
    another job's store until that job ended, then failed (RendezvousConnectionError). A
    one-node step's store binds a free port itself, as `launch --run`'s does."""
    spec = _two_stages(num_iterations=1, num_warmup_iterations=0)
    with socket.socket() as held:  # another process's listening port on node 0
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        script, _, _ = write_slurm_script(spec, tmp_path / "job", master_port=port)
        env = _stand_in_slurm(
            tmp_path, srun='while [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"'
        )
        env["GLOO_SOCKET_IFNAME"] = "lo"
        env["TMPDIR"] = str(tmp_path / "tmp")
        (tmp_path / "tmp").mkdir()
        done = subprocess.run(
            ["bash", str(script)], env=env, capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "job" / "tiny_1f1b_fault-free" / "timeline.json").is_file()


INJECTIONS = ["'; touch PWNED; echo '", "$(touch PWNED)", "`touch PWNED`", '"; touch PWNED; "']
"""Shell that runs `touch PWNED` if a field reaches the script unquoted."""


def _stand_in_slurm(tmp_path: Path, **commands: str) -> dict[str, str]:
    """The environment of a job whose `scontrol` names this host and whose other commands
    (`srun`, ...) are the given shell scripts."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in {"scontrol": "echo 127.0.0.1", **commands}.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_JOB_ID": "7",
        "SRUN_LOG": str(tmp_path / "srun.log"),
    }


_RECORD_SRUN = (
    f'exec {sys.executable} -c "import json, os, sys; '
    "open(os.environ['SRUN_LOG'], 'a').write(json.dumps(sys.argv[1:]) + '\\\\n')\" \"$@\""
)
"""An srun that records its arguments (one JSON list a line) instead of running them."""


@pytest.mark.parametrize("text", INJECTIONS)
@pytest.mark.parametrize("field", ["name", "label", "cost-model name", "out"])
def test_user_text_in_any_field_is_data_not_shell(tmp_path: Path, field: str, text: str) -> None:
    """Quotes, $() and backticks in the spec name, a profile's label, a cost model's name or
    the output folder: the script runs its one step with them as plain arguments."""
    fields = {"name": "x", "models": ("x",), "profile": Profile.uniform(2, 2, 1, 1, 1)}
    out = tmp_path / "job"
    if field == "name":
        fields["name"] = text
    elif field == "label":
        fields["models"] = (text,)
    elif field == "cost-model name":
        fields = {"name": "x", "models": ({"base": "gpt2-7b", "name": text, "tp": 1},)}
    else:
        out = tmp_path / text / "job"
    spec = ExperimentSpec(**fields, systems=("1f1b",), num_iterations=1, num_warmup_iterations=0)
    script, num_steps, _ = write_slurm_script(spec, out)
    assert num_steps == 1
    done = subprocess.run(
        ["bash", str(script)],
        env=_stand_in_slurm(tmp_path, srun=_RECORD_SRUN),
        cwd=tmp_path,
        capture_output=True,
    )
    assert done.returncode == 0, done.stderr
    assert not list(tmp_path.rglob("PWNED")), "a field ran as shell code"
    (argv,) = [json.loads(line) for line in (tmp_path / "srun.log").read_text().splitlines()]
    profile = Path(argv[argv.index("--profile") + 1])
    assert profile.is_file() and profile.parent.parent == out.resolve()
    assert Profile.from_file(profile).num_stages == spec.targets()[0].profile.num_stages


@pytest.mark.parametrize("field", ["name", "label", "cost-model name"])
def test_a_line_break_in_a_name_is_refused(field: str) -> None:
    text = "x\ntouch PWNED\n"
    fields = {"name": "x", "models": ("x",), "profile": Profile.uniform(2, 2, 1, 1, 1)}
    if field == "name":
        fields["name"] = text
    elif field == "label":
        fields["models"] = (text,)
    else:
        fields = {"name": "x", "models": ({"base": "gpt2-7b", "name": text, "tp": 1},)}
    with pytest.raises(ConfigError, match=r"contains the control character '\\n'"):
        ExperimentSpec(**fields, systems=("1f1b",))


def test_a_line_break_in_the_output_folder_stays_in_its_argument(tmp_path: Path) -> None:
    spec = _two_stages()
    out = tmp_path / "a\ntouch PWNED\n" / "job"
    script, _, _ = write_slurm_script(spec, out)
    done = subprocess.run(
        ["bash", str(script)],
        env=_stand_in_slurm(tmp_path, srun=_RECORD_SRUN),
        cwd=tmp_path,
        capture_output=True,
    )
    assert done.returncode == 0, done.stderr
    assert not list(tmp_path.rglob("PWNED"))
    (argv,) = [json.loads(line) for line in (tmp_path / "srun.log").read_text().splitlines()]
    assert Path(argv[argv.index("--out") + 1]).parent == out.resolve()


def test_comments_and_the_job_name_keep_to_their_line() -> None:
    from harness.slurm import _comment, _job_name

    assert _comment("a\nb\tc `d` $(e)") == "# a\\nb\\tc `d` $(e)"
    assert _job_name("my run; $(x)\n") == "my_run____x__"


def test_the_steps_run_the_python_that_wrote_the_script_and_leave_no_stale_results(
    tmp_path: Path,
) -> None:
    """A bare `python` was whatever PATH found (no torch where the venv was not activated);
    PYTHON still chooses another. A step's results from an earlier job are removed before it
    runs, so a failed step leaves none that look like its own."""
    spec = _two_stages()
    script, _, _ = write_slurm_script(spec, tmp_path / "job")
    step = next(p for p in (tmp_path / "job").iterdir() if p.is_dir())
    env = _stand_in_slurm(tmp_path, srun=_RECORD_SRUN)
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    (argv,) = [json.loads(line) for line in (tmp_path / "srun.log").read_text().splitlines()]
    assert argv[argv.index("-m") - 1] == sys.executable
    (step / "timeline.json").write_text('{"old": "an earlier job"}')
    env = {**_stand_in_slurm(tmp_path, srun="exit 1"), "PYTHON": "/opt/other/python"}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 1 and not (step / "timeline.json").exists()
    (tmp_path / "srun.log").unlink()
    env = {**_stand_in_slurm(tmp_path, srun=_RECORD_SRUN), "PYTHON": "/opt/other/python"}
    assert subprocess.run(["bash", str(script)], env=env).returncode == 0
    (argv,) = [json.loads(line) for line in (tmp_path / "srun.log").read_text().splitlines()]
    assert argv[argv.index("-m") - 1] == "/opt/other/python"


_SRUN_AS_SLURM = (
    f'exec {sys.executable} -c "import json, os, sys; '
    "opts = dict(a[2:].split('=', 1) for a in sys.argv[1:] if a.startswith('--') and '=' in a); "
    "step = [opts['nodes'], opts.get('ntasks', os.environ.get('SLURM_NTASKS')), "
    "opts.get('relative')]; "
    "open(os.environ['SRUN_LOG'], 'a').write(json.dumps(step) + '\\n')\" \"$@\""
)
"""An srun that records a step's nodes, its tasks as srun takes them (its --ntasks, else the
job's SLURM_NTASKS, as srun reads its environment) and the node it starts from (--relative)."""


def _two_pipeline_depths() -> ExperimentSpec:
    """7B at 2 and at 4 stages, one 1F1B configuration each."""
    two_sizes = (
        {"base": "gpt2-7b", "name": "a", "pp": 2},
        {"base": "gpt2-7b", "name": "b", "pp": 4},
    )
    return ExperimentSpec(
        name="x", models=two_sizes, systems=("1f1b",), num_iterations=1, num_warmup_iterations=0
    )


def test_a_step_on_fewer_nodes_than_the_job_runs_one_torchrun_on_each_of_the_first(
    tmp_path: Path,
) -> None:
    """sbatch sets SLURM_NTASKS (the job's nodes x --ntasks-per-node: 2 here) and srun takes
    it as its -n unless given one: a 1-node step of a 2-node job asked for 2 tasks on 1 node
    (two torchruns of one node each), and on whichever node srun picked, where node 0 of the
    job hosts its rendezvous."""
    spec = _two_pipeline_depths()
    script, _, _ = write_slurm_script(spec, tmp_path / "job", gpus_per_node=2)
    assert "\n#SBATCH --nodes=2\n" in script.read_text()
    env = {**_stand_in_slurm(tmp_path, srun=_SRUN_AS_SLURM), "SLURM_NTASKS": "2"}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    steps = [json.loads(line) for line in (tmp_path / "srun.log").read_text().splitlines()]
    assert steps == [["1", "1", "0"], ["2", "2", "0"]]


def test_the_job_and_each_step_have_a_cpu_for_every_rank_of_a_node(tmp_path: Path) -> None:
    """The job asked for one task a node and no CPUs: Slurm's default, one CPU a task, and
    every worker of a node's torchrun (8 on an 8-GPU node) shared it."""
    spec = _two_pipeline_depths()
    script, _, _ = write_slurm_script(spec, tmp_path / "job", gpus_per_node=8)
    assert "\n#SBATCH --cpus-per-task=4\n" in script.read_text()  # the most ranks a node
    env = _stand_in_slurm(tmp_path, srun=_RECORD_SRUN)
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    steps = [json.loads(line) for line in (tmp_path / "srun.log").read_text().splitlines()]
    cpus = [argv[: argv.index("-m")] for argv in steps]
    assert ["--cpus-per-task=2" in a for a in cpus] == [True, False]
    assert ["--cpus-per-task=4" in a for a in cpus] == [False, True]


def test_run_outside_a_slurm_job_the_script_says_to_submit_it(tmp_path: Path) -> None:
    """`bash run.sbatch` outside a job said "SLURM_JOB_NODELIST: unbound variable"; it says
    what to do instead, and runs no step."""
    script, _, _ = write_slurm_script(_two_stages(), tmp_path / "job", gpus_per_node=1)
    env = _stand_in_slurm(tmp_path, srun=_RECORD_SRUN)
    for unset in ("SLURM_JOB_NODELIST", "SLURM_JOB_ID"):
        outside = {k: v for k, v in env.items() if k != unset}
        done = subprocess.run(["bash", str(script)], env=outside, capture_output=True, text=True)
        assert done.returncode == 2
        assert done.stderr == (
            "this is a Slurm batch script: submit it with sbatch (no Slurm job here)\n"
        )
    assert not (tmp_path / "srun.log").exists()


def test_node_0_is_the_first_of_a_long_node_list(tmp_path: Path) -> None:
    """`scontrol show hostnames | head -n 1` under pipefail: head left after the first line,
    scontrol's later writes met a closed pipe (SIGPIPE), and the job ended there, at its
    second line, without a word, whenever the node list was longer than the pipe holds."""
    spec = _two_stages()  # on two nodes: a one-node step's store binds a port of its own
    script, _, _ = write_slurm_script(spec, tmp_path / "job", master_port=29511, gpus_per_node=1)
    scontrol = "seq 1 200000 | sed 's/^/node/'"  # 2 MB of names: more than a pipe holds
    env = _stand_in_slurm(tmp_path, srun=_RECORD_SRUN, scontrol=scontrol)
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    (argv,) = [json.loads(line) for line in (tmp_path / "srun.log").read_text().splitlines()]
    assert "--rdzv-endpoint=node1:29511" in argv
    env = _stand_in_slurm(tmp_path, srun=_RECORD_SRUN, scontrol="exit 1")  # no node: said
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 1 and "no node to run on" in done.stderr


def test_the_spec_s_timeout_reaches_the_workers_and_network_injection_is_refused(
    tmp_path: Path,
) -> None:
    """The script's workers waited their default 60 s whatever the spec said, and a spec
    asking for its delays in the network got the workers' hook without a word."""
    spec = _two_stages(backend="emulated", transport_timeout_s=300)
    script, _, _ = write_slurm_script(spec, tmp_path / "job")
    assert "--timeout 300 " in script.read_text()
    networked = _two_stages(backend="emulated", injection="network")
    with pytest.raises(ConfigError, match="injection 'network': the cluster script injects"):
        write_slurm_script(networked, tmp_path / "other")


def test_the_workers_get_the_exact_timeout_the_delays_were_checked_against(
    tmp_path: Path,
) -> None:
    """1.0000001 s passed the check against a 1000 ms delay, and the script passed `--timeout
    1` (:g): the workers' 1 s is not longer than the delay, and their step would fail."""
    spec = _two_stages(backend="emulated", delays_ms=(1000,), transport_timeout_s=1.0000001)
    script, num_configurations, num_skipped = write_slurm_script(spec, tmp_path / "job")
    assert (num_configurations, num_skipped) == (1, 0)
    assert script.read_text().count("--timeout 1.0000001 ") == 1


def test_the_job_time_reaches_the_script_in_a_form_sbatch_takes(tmp_path: Path) -> None:
    spec = _two_stages()
    for job_time in ("30", "1-12", "2-00:30:00", "04:00:00"):
        script, _, _ = write_slurm_script(spec, tmp_path / job_time, time_limit=job_time)
        assert f"\n#SBATCH --time={job_time}\n" in script.read_text()
    for bad in ("1h", "01:00:00\nrm -rf /", "", "1:2:3:4"):
        with pytest.raises(ConfigError, match="not one sbatch --time takes"):
            write_slurm_script(spec, tmp_path / "bad", time_limit=bad)


def test_every_step_runs_with_the_spec_s_seed(tmp_path: Path) -> None:
    """The workers drew megatron's weights and tokens from seed 0 whatever the spec said."""
    spec = _two_stages(backend="megatron", seed=11, num_repeats=2)
    script, _, _ = write_slurm_script(spec, tmp_path / "job")
    lines = script.read_text().splitlines()
    steps = [shlex.split(line) for line in lines if line.startswith("run_step ")]
    assert len(steps) == 2
    for step in steps:
        assert step[step.index("--seed") + 1] == "11"


def test_a_failed_step_is_named_and_the_others_still_run(tmp_path: Path) -> None:
    """One failed step ended the whole job (`set -e`): the configurations after it never ran.
    Now each runs; the job names the failed ones and exits 1."""
    spec = _two_stages(systems=("1f1b", "zb"), delays_ms=(0, 5))
    script, num_configurations, _ = write_slurm_script(spec, tmp_path / "job")
    assert num_configurations == 4
    fails_zb = f'case "$*" in *tiny_zb_*) exit 3;; esac\n{_RECORD_SRUN}'
    done = subprocess.run(
        ["bash", str(script)],
        env=_stand_in_slurm(tmp_path, srun=fails_zb),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "step tiny_zb_fault-free failed (its torchrun-logs/ say why)",
        "step tiny_zb_0-1-5ms failed (its torchrun-logs/ say why)",
        "2 step(s) failed: tiny_zb_fault-free tiny_zb_0-1-5ms",
    ]
    ran = [json.loads(line) for line in (tmp_path / "srun.log").read_text().splitlines()]
    assert [Path(argv[argv.index("--out") + 1]).name for argv in ran] == [
        "tiny_1f1b_fault-free",
        "tiny_1f1b_0-1-5ms",
    ]
    assert all("--tee=3" in argv for argv in ran)  # the workers' output in torchrun-logs/


def test_a_multi_node_step_s_store_is_at_the_job_s_own_port_unless_given(tmp_path: Path) -> None:
    """Every job's multi-node steps met at node 0's 29500: two jobs Slurm put on one node
    joined one store (torch's fallback to a client where the port is taken). Without
    --master-port the port is 29500 + the job id mod 1000 (job 7: 29507; job 12345: 29845);
    a given port stays."""
    spec = _two_stages()  # on two nodes
    script, _, _ = write_slurm_script(spec, tmp_path / "job", gpus_per_node=1)
    for job_id, port in (("7", 29507), ("12345", 29845)):
        env = _stand_in_slurm(tmp_path, srun=_RECORD_SRUN, scontrol="echo node1; echo node2")
        env["SLURM_JOB_ID"] = job_id
        done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        argv = json.loads((tmp_path / "srun.log").read_text().splitlines()[-1])
        assert f"--rdzv-endpoint=node1:{port}" in argv
    given, _, _ = write_slurm_script(spec, tmp_path / "given", gpus_per_node=1, master_port=29511)
    done = subprocess.run(["bash", str(given)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    argv = json.loads((tmp_path / "srun.log").read_text().splitlines()[-1])
    assert "--rdzv-endpoint=node1:29511" in argv
