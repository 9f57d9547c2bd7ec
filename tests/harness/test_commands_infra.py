"""The infrastructure commands' helpers (launch, doctor, cleanup), called directly."""

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from harness.commands_infra import launch
from pipeline.errors import ConfigError
from pipeline.runtime.local_launch import check_local_address
from pipeline.torchrun_launch import check_master_addr

ASSETS = Path(__file__).parents[1] / "assets"


class _Stop(Exception):
    """Raised by the stand-in for torchrun_commands: nothing is run."""


@pytest.mark.parametrize(
    ("options", "expected_port"),
    [(["--run", "--master-port", "29777"], 29777), (["--master-port", "29778"], 29778)],
)
def test_launch_uses_the_master_port_it_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: list[str], expected_port: int
) -> None:
    """`launch --run --master-port 29777` silently took a random free port instead."""
    import harness.commands_infra as commands_infra

    given: dict[str, Any] = {}

    def stand_in(**kwargs: Any) -> list[str]:
        given.update(kwargs)
        raise _Stop

    monkeypatch.setattr(commands_infra, "torchrun_commands", stand_in)
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"stages": 2, "microbatches": 2, "t_f": 1, "t_b": 1, "t_w": 1}))
    args = ["--profile", str(profile), "--policy", "1f1b", "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(launch, [*args, *options])
    assert isinstance(result.exception, _Stop), result.output
    assert given["master_port"] == expected_port
    result = CliRunner().invoke(launch, [*args, "--run"])  # none given: a free one
    assert isinstance(result.exception, _Stop), result.output
    # None: torchrun's store binds port 0 itself. A port picked here and closed (it was)
    # could be taken by another process before torchrun bound it: "address already in use".
    assert given["master_port"] is None


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--timeout", "nan"], "'--timeout': nan is not a finite number"),
        (["--timeout", "inf"], "'--timeout': inf is not in the range 0<x<=86400"),
        (["--run", "--run-timeout-s", "nan"], "'--run-timeout-s': nan is not a finite number"),
        (["--run", "--run-timeout-s", "inf"], "'--run-timeout-s': inf is not in the range"),
        (["--iterations", "100001"], "100001 is not in the range 1<=x<=100000"),
        (["--warmup-iterations", str(10**20)], "is not in the range 0<=x<=100000"),
        (["--gpus-per-node", str(10**20)], "is not in the range 1<=x<=1024"),
        (["--replicas", "2000"], "'--replicas': 2000 is not in the range 1<=x<=1024"),
    ],
)
def test_launch_refuses_non_finite_and_unbounded_numbers_as_usage_errors(
    tmp_path: Path, options: list[str], said: str
) -> None:
    """`launch --timeout nan` printed a torchrun command with `--timeout nan` (exit 0) and
    `--run --run-timeout-s nan`/`inf` ended in an internal ValueError/OverflowError (exit 3);
    --iterations, --warmup-iterations and --gpus-per-node had no upper bound, and
    --replicas 2000 was refused as "dp must be in 1..1024" (a profile key not given: exit 1).
    Each is now a usage error (exit 2) before anything is written, as `run` refuses them."""
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"stages": 2, "microbatches": 2, "t_f": 1, "t_b": 1, "t_w": 1}))
    args = ["--profile", str(profile), "--policy", "1f1b", "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(launch, [*args, *options])
    assert result.exit_code == 2, result.output
    assert said in result.output
    assert not (tmp_path / "out").exists()


def _launch(tmp_path: Path, *options: str) -> Any:
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"stages": 2, "microbatches": 2, "t_f": 1, "t_b": 1, "t_w": 1}))
    args = ["--profile", str(profile), "--policy", "1f1b", "--out", str(tmp_path / "out")]
    return CliRunner().invoke(launch, [*args, *options])


def test_a_launch_removes_an_earlier_run_s_results_first(tmp_path: Path) -> None:
    """A launch into a folder an earlier run wrote left its timeline.json beside the new
    schedule: a run that then failed (or was stopped) looked like it had run."""
    (tmp_path / "out").mkdir()
    for name in ("timeline.json", "losses.json", "params_sha256.txt"):
        (tmp_path / "out" / name).write_text("an earlier run's")
    (tmp_path / "out" / "mine.txt").write_text("kept")
    result = _launch(tmp_path, "--nodes", "2", "--master-addr", "node0.cluster")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "mine.txt",
        "profile.json",
        "schedule.json",
    ]


def test_a_launch_refuses_to_write_its_profile_over_the_one_it_was_given(tmp_path: Path) -> None:
    """`launch --profile out/profile.json --replicas 2 --out out` wrote the profile of 2
    replicas over the user's file (a review), and a schedule file given from --out was
    overwritten the same way; both are refused before anything is written."""
    out = tmp_path / "out"
    out.mkdir()
    given = {"stages": 2, "microbatches": 2, "t_f": 1, "t_b": 1, "t_w": 1}
    (out / "profile.json").write_text(json.dumps(given))
    args = ["--profile", str(out / "profile.json"), "--policy", "1f1b", "--replicas", "2"]
    result = CliRunner().invoke(launch, [*args, "--out", str(out), "--nodes", "2",
                                         "--master-addr", "node0.cluster"])  # fmt: skip
    assert result.exit_code == 1
    assert isinstance(result.exception, ConfigError)
    assert f"--profile {out / 'profile.json'} is a file this launch writes" in str(result.exception)
    assert json.loads((out / "profile.json").read_text()) == given
    assert sorted(p.name for p in out.iterdir()) == ["profile.json"]
    (tmp_path / "p.json").write_text(json.dumps(given))
    schedule = out / "schedule.json"
    schedule.write_text(json.dumps({"stages": [["F0", "BW0"], ["F0", "BW0"]]}))
    args = ["--profile", str(tmp_path / "p.json"), "--schedule", str(schedule)]
    result = CliRunner().invoke(launch, [*args, "--out", str(out), "--nodes", "2",
                                         "--master-addr", "node0.cluster"])  # fmt: skip
    assert result.exit_code == 1
    assert f"--schedule {schedule} is a file this launch writes" in str(result.exception)
    assert sorted(p.name for p in out.iterdir()) == ["profile.json", "schedule.json"]


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--master-addr", "not_an_address!"], "'not_an_address!' is neither an IP address nor"),
        (["--master-addr", "999.1.1.1"], "'999.1.1.1' is neither an IP address nor a host name"),
        (["--master-addr", "a b"], "'a b' is neither an IP address nor a host name"),
        (["--master-addr", "0.0.0.0"], "0.0.0.0 is not the address of one host"),
        (["--master-addr", "::"], ":: is not the address of one host"),
        (["--master-addr", "224.0.0.1"], "224.0.0.1 is not the address of one host"),
        (["--master-addr", "255.255.255.255"], "255.255.255.255 is not the address of one"),
        (["--run", "--master-addr", "203.0.113.9"], "203.0.113.9 is not an address of this host"),
        (["--run", "--master-addr", "vm"], "--run takes an IP address of this host as"),
    ],
)
def test_a_master_address_that_cannot_be_one_is_refused_before_anything_runs(
    tmp_path: Path, options: list[str], said: str
) -> None:
    """Each printed torchrun lines (exit 0); with --run, an address not of this host waited
    the whole --run-timeout-s for a store that was not there, and a host name (or this
    host's address) ran torchrun's store on every interface, out of the loopback-only
    namespace, without a word."""
    nodes = [] if "--run" in options else ["--nodes", "2"]
    result = _launch(tmp_path, *nodes, *options)
    assert result.exit_code == 1 and isinstance(result.exception, ConfigError)
    assert said in str(result.exception)
    assert not (tmp_path / "out").exists()


def test_a_host_name_or_an_ip_address_is_a_master_address() -> None:
    for address in ("10.1.2.3", "::1", "node-0", "node0.cluster.example", "localhost"):
        check_master_addr(address)
    assert check_local_address("localhost") and check_local_address("127.0.0.2")
    assert check_local_address("::1") and check_local_address("::ffff:127.0.0.1")


def test_an_address_of_this_host_off_loopback_is_local_but_not_loopback() -> None:
    """`launch --run` runs torchrun's store on every interface there (no loopback-only
    namespace has that address), and says so (`run_local`'s warning)."""
    shown = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True)
    addresses = [
        line.split()[3].split("/")[0] for line in shown.stdout.splitlines() if " lo " not in line
    ]
    if not addresses:
        pytest.skip("this host has no IPv4 address off loopback")
    assert check_local_address(addresses[0]) is False


def test_launch_spec_says_how_to_run_the_script_and_collect_its_results(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(
        "name: s\nmodels: [two]\nprofile: {stages: 2, microbatches: 2, t_f: 1, t_b: 1, t_w: 1}\n"
        "systems: [1f1b, adaptra]\nlink_sets: [['0-1']]\ndelays_ms: [0, 5]\n"
    )
    out = tmp_path / "my job"
    result = CliRunner().invoke(launch, ["--spec", str(spec), "--out", str(out)])
    assert result.exit_code == 0, result.output
    script = out.resolve() / "run.sbatch"
    assert result.output == (
        f"wrote {script} (3 configurations; 1 skipped, listed in it): sbatch '{script}', then "
        f"adaptra-bench collect '{script.parent}' for its results\n"
    )


def test_launch_run_refuses_more_ranks_than_this_host_takes_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`launch --run` started a worker process here per rank, however many: `--replicas
    1024` of a 4-stage profile was a torchrun of 4,096 workers on this host, where `run
    --backend emulated` refuses more than `max_processes()` processes. It is refused the
    same way now, before anything is written or run."""
    import harness.runner as runner
    import pipeline.runtime.local_launch as local_launch

    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("torchrun was started")

    monkeypatch.setattr(local_launch, "run_local", started)
    monkeypatch.setattr(runner, "max_processes", lambda: 6)
    result = _launch(tmp_path, "--run", "--replicas", "4")  # 2 stages x 4: 8 workers
    assert isinstance(result.exception, ConfigError), result.output
    assert str(result.exception).startswith(
        "this run would start 8 worker(s) and 0 delegate process(es), more than the 6 one "
        "host takes here"
    )
    assert not (tmp_path / "out").exists()
    result = _launch(tmp_path, "--replicas", "4")  # printed for a cluster's nodes: no limit
    assert result.exit_code == 0, result.output
