"""The options the commands share (harness.cli_common): their numbers are refused at parsing."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import cli
from harness.cli_common import resolve
from pipeline.errors import AdaptraBenchError

PROFILE = {"stages": 2, "microbatches": 2, "t_f": 1, "t_b": 1, "t_w": 1}


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["run", "--policy", "1f1b", "--timeout", "nan"], "'--timeout': nan is not a finite"),
        (["run", "--policy", "milp", "--time-limit", "nan"], "'--time-limit': nan is not a"),
        (["simulate", "--policy", "milp", "--time-limit", "nan"], "'--time-limit': nan is not"),
        (["schedule", "--policy", "milp", "--time-limit", "inf"], "inf is not in the range"),
        (["profile", "--stages", "2", "--out", "p.json", "--iterations", "100001"], "100001 is"),
        (["profile", "--stages", "2", "--out", "p.json", "--microbatches", "4097"], "4097 is"),
        (["calibrate", "--out", "c.json", "--op-ms", "nan"], "'--op-ms': nan is not a finite"),
        (["calibrate", "--out", "c.json", "--repeats", "100001"], "'--repeats': 100001 is"),
    ],
)
def test_a_non_finite_or_unbounded_number_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], said: str
) -> None:
    """`run --timeout nan` was refused later, by the experiment (exit 1), and `--time-limit
    nan` by the planner (exit 1), while `inf` was a usage error (exit 2); `profile
    --iterations 100000000000` started measuring, as `calibrate --repeats 1000000000` did
    (three pools of workers, that many iterations a point). All are usage errors now."""
    monkeypatch.chdir(tmp_path)
    Path("p.json").write_text(json.dumps(PROFILE))
    if argv[0] in ("run", "simulate", "schedule"):
        argv = [argv[0], "--profile", "p.json", *argv[1:]]
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 2, result.output
    assert said in result.output


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (  # was "t_f must be finite ...", no file named
            {"stages": [["F0", "BW0"]], "profile": {**PROFILE, "stages": 1, "t_f": -1}},
            "schedule s.json: profile: t_f must be finite and in 0..3600000 ms, got -1",
        ),
        (  # was "--profile is required: the schedule file s.json has no 'profile' key"
            {"stages": [["F0", "BW0"]], "profile": "p.json"},
            "schedule s.json: 'profile' must be an object (the profile file's form), got str "
            "'p.json'",
        ),
        (  # was "cannot read op 'Q0': ..."
            {"stages": [["F0", "Q0"]]},
            "schedule s.json: cannot read op 'Q0': expected a kind",
        ),
    ],
)
def test_a_schedule_file_s_errors_name_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: dict, said: str
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("s.json").write_text(json.dumps(content))
    with pytest.raises(AdaptraBenchError) as error:
        resolve(None, None, "s.json")
    assert str(error.value).startswith(said), str(error.value)


def test_a_schedule_file_s_profile_is_read_only_without_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--profile given: the schedule file's own `profile`, whatever it is, is not read."""
    monkeypatch.chdir(tmp_path)
    Path("p.json").write_text(json.dumps(PROFILE))
    Path("s.json").write_text(json.dumps({"stages": [["F0", "F1", "BW0", "BW1"]] * 2,
                                          "profile": "elsewhere"}))  # fmt: skip
    profile, planned = resolve("p.json", None, "s.json")
    assert (profile.num_stages, planned.method) == (2, "schedule file s.json")


def test_a_spec_is_a_file_or_a_bundled_preset_s_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--spec fig16` (the preset's `name:`) and `--spec fig16_models` (its file's stem) are
    the bundled preset, wherever the command runs (an installed package keeps them in its
    own folder); a file of that name here is the file; an unknown name is a usage error
    listing the presets' names; a missing path is left to the spec's reader."""
    from harness.cli_common import SpecFile
    from harness.paper import PRESETS_DIR

    monkeypatch.chdir(tmp_path)
    take = SpecFile().convert
    assert take("fig16", None, None) == str(PRESETS_DIR / "fig16_models.yaml")
    assert take("fig16_models", None, None) == str(PRESETS_DIR / "fig16_models.yaml")
    assert take("table3-trace", None, None) == str(PRESETS_DIR / "table3_trace.yaml")
    Path("fig16").write_text("name: mine\n")
    assert take("fig16", None, None) == "fig16"
    assert take("missing.yaml", None, None) == "missing.yaml"
    assert take("sub/fig1", None, None) == "sub/fig1"
    result = CliRunner().invoke(cli, ["launch", "--spec", "fig99", "--out", "job"])
    assert result.exit_code == 2, result.output
    assert (
        "'fig99' is no file, nor a bundled preset's name (fig1, fig3, fig5-straggler-sweep, "
        "fig15, fig16, fig17, table3-trace)" in result.output
    )
    assert not Path("job").exists()


def test_launch_writes_a_bundled_preset_s_job(tmp_path: Path) -> None:
    """A preset's name reaches the command as its file: its steps are its configurations."""
    result = CliRunner().invoke(cli, ["launch", "--spec", "fig1", "--out", str(tmp_path / "j")])
    assert result.exit_code == 0, result.output
    job = json.loads((tmp_path / "j" / "launch.json").read_text())
    assert job["spec"]["name"] == "fig1" and len(job["steps"]) == 8


def test_a_folder_of_a_preset_s_name_is_not_the_spec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run --spec fig1 --out fig1` made a folder `fig1`, and the same command again (with its
    `--run-id`, to resume it) was refused: "File 'fig1' is a directory". A folder is no spec
    file: the name is the preset's (a folder of another name is still refused)."""
    from harness.cli_common import SpecFile
    from harness.paper import PRESETS_DIR

    monkeypatch.chdir(tmp_path)
    Path("fig1", "a").mkdir(parents=True)
    Path("mine").mkdir()
    take = SpecFile().convert
    assert take("fig1", None, None) == str(PRESETS_DIR / "fig1_14b_last_link.yaml")
    result = CliRunner().invoke(cli, ["launch", "--spec", "mine", "--out", "job"])
    assert result.exit_code == 2 and "'mine' is a directory" in result.output, result.output


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--profile", "p.json", "--policy", "1f1b", "--trace", "p.json"],
        ["simulate", "--policy", "1f1b", "--profile", "./p.json", "--trace", "link.json"],
        ["run", "--profile", "p.json", "--system", "1f1b", "--trace", "p.json"],
        ["run", "--profile", "p.json", "--schedule", "s.json", "--trace", "s.json"],
        ["schedule", "--profile", "p.png", "--policy", "1f1b", "--plot", "p.png"],
    ],
)
def test_an_output_file_that_is_an_input_file_is_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    """`simulate --profile p.json --trace p.json` wrote its trace over the profile (exit 0:
    the next command then refused the profile as unknown keys traceEvents, ...). An output
    file that is one of the command's input files, by any path or link, is refused."""
    monkeypatch.chdir(tmp_path)
    for name in ("p.json", "p.png"):
        Path(name).write_text(json.dumps(PROFILE))
    Path("s.json").write_text(json.dumps({"stages": [["F0", "F1", "BW0", "BW1"]] * 2}))
    Path("link.json").symlink_to("p.json")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    result = CliRunner().invoke(cli, argv)
    assert isinstance(result.exception, AdaptraBenchError), result.output
    output, source = (
        argv[-2:],
        argv[argv.index("--schedule" if "s.json" in argv[-1] else "--profile")],
    )
    assert str(result.exception) == (
        f"{output[0]} {output[1]} is the {source} file it reads: writing it would overwrite "
        "that input; give another file name"
    )
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


@pytest.mark.parametrize("run_id", [None, "named"])
def test_a_refused_run_leaves_no_output_folder_it_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_id: str | None
) -> None:
    """A spec refused once its run directory was made (here: more processes than this host
    takes) removed that directory, and left the empty --out folder it had made for it (the
    bad-input review); an --out that was there stays."""
    from harness import experiment
    from pipeline.errors import ConfigError

    def refused(self: object) -> None:
        raise ConfigError("too many processes")

    monkeypatch.setattr(experiment.ExperimentSpec, "check_processes_here", refused)
    monkeypatch.chdir(tmp_path)
    Path("s.yaml").write_text(
        "name: t\nmodel: m\nsystems: [1f1b]\nprofile: " + json.dumps(PROFILE) + "\n"
    )
    named = [] if run_id is None else ["--run-id", run_id]
    result = CliRunner().invoke(cli, ["run", "--spec", "s.yaml", "--out", "new/out", *named])
    assert result.exit_code == 1 and "too many processes" in str(result.exception)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new", "s.yaml"]
    assert list(Path("new").iterdir()) == []  # (only the folder it was told to make: removed)
    Path("kept").mkdir()
    result = CliRunner().invoke(cli, ["run", "--spec", "s.yaml", "--out", "kept", *named])
    assert result.exit_code == 1 and Path("kept").is_dir()
