"""SIGINT, SIGTERM and SIGHUP end a run the same way: every worker, temporary file and
namespace gone, one line, exit status 128 + the signal."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from injectors.ownership import OwnerRecord, cleanup
from pipeline.runtime.scratch import (
    CHECKPOINTS_PREFIX,
    POOL_PREFIX,
    clean_orphaned,
    make_folder,
    stop_orphaned_torchruns,
)


def _descendants(pid: int) -> set[int]:
    found: set[int] = set()
    todo = [pid]
    while todo:
        here = todo.pop()
        try:
            children = Path(f"/proc/{here}/task/{here}/children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


_MARKS_ITS_ITERATIONS = """
import sys
from pathlib import Path
from pipeline.runtime.pool import WorkerPool
marker = Path(sys.argv.pop(1))
run_iteration = WorkerPool.run_iteration
def marked(self, *args, **kwargs):
    timeline = run_iteration(self, *args, **kwargs)
    marker.touch()
    return timeline
WorkerPool.run_iteration = marked
from harness.program import main
main()
"""
"""The program as `python -m harness` runs it, which touches the file its first argument
names each time its worker pool has run an iteration: the sign that a run is inside its
iterations (a loaded host may hold it in its start-up for seconds after its workers run)."""


def _program(marker: Path) -> list[str]:
    """The command line of the program that touches `marker` after each iteration."""
    return [sys.executable, "-c", _MARKS_ITS_ITERATIONS, str(marker)]


def _wait_for_iterations(run: subprocess.Popen[str], marker: Path) -> None:
    """Return once `run` has run an iteration (a hang bound of 120 s)."""
    deadline = time.monotonic() + 120  # start-up under load
    while time.monotonic() < deadline and run.poll() is None and not marker.exists():
        time.sleep(0.05)
    ended = run.poll() is not None
    assert not ended and marker.exists(), (
        run.stderr.read() if ended and run.stderr else "no iteration within 120 s"
    )


@contextlib.contextmanager
def _emulated_run(
    tmp_path: Path,
    scratch: Path,
    num_stages: int,
    prefix: tuple[str, ...] = (),
    options: tuple[str, ...] = (),
    *,
    iterating: bool = False,
) -> Iterator[tuple[subprocess.Popen[str], set[int]]]:
    """`run --backend emulated` of 1F1B over `num_stages` stages with no end (TMPDIR
    `scratch`; `prefix` before it on the command line, `options` after it), once its pool's
    folder is made and its fork server, that one's helper and a worker per stage run, and,
    if `iterating`, once it has run an iteration (it is then in its iterations: the next
    ones follow back to back); killed if still running at the end."""
    profile = tmp_path / "p.json"
    op_ms = {"t_f": 5, "t_b": 5, "t_w": 5}
    profile.write_text(json.dumps({"stages": num_stages, "microbatches": num_stages, **op_ms}))
    marker = tmp_path / "iterated"
    command = [*prefix, *_program(marker), "run", "--backend", "emulated"]
    command += ["--profile", str(profile), "--policy", "1f1b", "--iterations", "100000"]
    command += options
    run = subprocess.Popen(
        command,
        env={**os.environ, "TMPDIR": str(scratch)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a process group of its own, as a terminal's job is
    )
    try:
        deadline = time.monotonic() + 120  # start-up under load
        workers: set[int] = set()
        pool = False
        while time.monotonic() < deadline and run.poll() is None:
            pool = any(p.name.startswith("adaptra-pool-") for p in scratch.iterdir())
            workers = _descendants(run.pid)
            if pool and len(workers) >= num_stages + 2:
                break
            time.sleep(0.2)
        assert run.poll() is None and pool and len(workers) >= num_stages + 2, (
            run.stderr.read() if run.stderr else ""
        )
        if iterating:
            _wait_for_iterations(run, marker)
        yield run, workers
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()


@pytest.mark.multiprocess
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize(
    ("signum", "line"),
    [
        (signal.SIGTERM, "terminated (SIGTERM)"),
        (signal.SIGHUP, "terminated (SIGHUP)"),
        (signal.SIGINT, "interrupted (SIGINT)"),
    ],
)
def test_a_signal_mid_run_cleans_up_and_exits_128_plus_n(
    tmp_path: Path, short_tmp: Path, signum: int, line: str
) -> None:
    scratch = short_tmp
    with _emulated_run(tmp_path, scratch, 4, iterating=True) as (run, workers):
        run.send_signal(signum)
        _, err = run.communicate(timeout=60)
    assert run.returncode == 128 + signum
    assert err == f"{line}\n"  # nothing else: click's blank line before SIGINT's is gone
    assert list(scratch.iterdir()) == []  # the pool's rendezvous, checkpoints, fork server's
    deadline = time.monotonic() + 10  # orphans are reaped by init, not at once
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in workers)


@pytest.mark.multiprocess
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc (Linux)")
def test_ctrl_c_to_the_whole_job_is_one_line(tmp_path: Path, short_tmp: Path) -> None:
    """A terminal's Ctrl-C signals every process of the job, the workers too: they leave the
    ending to the run (each printed a KeyboardInterrupt traceback), which says one line."""
    with _emulated_run(tmp_path, short_tmp, 2, iterating=True) as (run, workers):
        os.killpg(run.pid, signal.SIGINT)
        _, err = run.communicate(timeout=60)
    assert run.returncode == 128 + signal.SIGINT
    assert err == "interrupted (SIGINT)\n"
    assert list(short_tmp.iterdir()) == []
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in workers)


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def _owned_by(pid: int) -> set[str]:
    """The namespaces whose testbed's owner record names process `pid`."""
    return {n for r in OwnerRecord.read_all() if r.pid == pid for n in r.namespaces}


@pytest.mark.multiprocess
@pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/proc/self/task").exists(), reason="namespaces need root"
)
def test_sighup_during_a_testbed_run_removes_its_namespaces(tmp_path: Path) -> None:
    profile = tmp_path / "p.json"
    profile.write_text(
        json.dumps({"stages": 2, "microbatches": 2, "t_f": 5, "t_b": 5, "t_w": 5, "delay_ms": [5]})
    )
    marker = tmp_path / "iterated"
    command = [*_program(marker), "run", "--backend", "emulated", "--inject"]
    command += ["network", "--profile", str(profile), "--policy", "1f1b"]
    command += ["--iterations", "100000"]
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        made: set[str] = set()
        while time.monotonic() < deadline and run.poll() is None:
            made = _owned_by(run.pid) & _namespaces()  # not another test's testbed
            if len(made) == 3 and len(_descendants(run.pid)) >= 4:  # switch + 2 hosts, workers
                break
            time.sleep(0.2)
        assert run.poll() is None and len(made) == 3
        _wait_for_iterations(run, marker)  # inside the iterations
        run.send_signal(signal.SIGHUP)
        _, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:  # failed before its end: let it tear its testbed down
            run.terminate()
            try:
                run.wait(timeout=60)
            except subprocess.TimeoutExpired:
                run.kill()
                run.wait()
                if made:  # its namespaces, by their testbed's own prefix
                    cleanup(prefix=min(made).rsplit("-", 1)[0] + "-")  # <bed>-sw, -h0, ..
    assert run.returncode == 128 + signal.SIGHUP
    assert err.strip().splitlines() == ["terminated (SIGHUP)"]
    assert not made & _namespaces() and not _owned_by(run.pid)  # and its record is gone


@pytest.mark.multiprocess
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc (Linux)")
def test_a_killed_run_s_workers_end_quietly_and_cleanup_removes_its_pool_folder(
    tmp_path: Path, short_tmp: Path
) -> None:
    """SIGKILL leaves the controller no chance to clean up: its workers end without a
    traceback (their pipe to it broke), and `cleanup`'s folder part (`clean_orphaned`, on
    this test's folder alone: the command's namespace part would race other tests' own
    leftovers) removes its pool's folder and its fork server's, whose process is gone, and
    leaves a live one's."""
    with _emulated_run(tmp_path, short_tmp, 4, iterating=True) as (run, workers):
        run.kill()
        _, err = run.communicate(timeout=60)
    deadline = time.monotonic() + 30  # orphans end as they find the controller gone
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in workers)
    assert "Traceback" not in err, err
    (left,) = short_tmp.glob("adaptra-pool-*")
    (server,) = short_tmp.glob("pymp-*")  # the fork server's socket folder
    other = short_tmp / "pymp-another-program"  # unmarked: not ours to remove
    other.mkdir()
    live = make_folder(POOL_PREFIX, str(short_tmp))  # this process's: it runs
    assert sorted(clean_orphaned([str(short_tmp)]).removed) == sorted([left, server])
    assert sorted(p.name for p in short_tmp.iterdir()) == sorted([Path(live).name, other.name])


@pytest.mark.multiprocess
@pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/proc/self/task").exists(), reason="namespaces need root"
)
def test_cleanup_removes_a_killed_testbed_run_s_fork_server_folder(
    tmp_path: Path, short_tmp: Path
) -> None:
    """The testbed's workers come from the fork server too: killed, the run left its socket
    folder unmarked, which `cleanup` took for another program's and kept, one more per
    killed run. Its namespaces go by their testbed's prefix (as above)."""
    with _emulated_run(tmp_path, short_tmp, 2, options=("--inject", "network")) as (run, _):
        made = _owned_by(run.pid) & _namespaces()
        try:
            run.kill()
            run.communicate(timeout=60)
        finally:
            if made:
                cleanup(prefix=min(made).rsplit("-", 1)[0] + "-")
    assert len(made) == 3  # switch, 2 hosts
    (server,) = short_tmp.glob("pymp-*")
    assert server in clean_orphaned([str(short_tmp)]).removed
    assert not server.exists()


@pytest.mark.multiprocess
def test_cleanup_removes_a_killed_megatron_run_s_checkpoints(
    tmp_path: Path, short_tmp: Path
) -> None:
    """A megatron run saves a checkpoint after its warm-up iteration (the first restart
    point); killed, it leaves the folder, which `cleanup`'s folder part removes as its owner
    is gone (a live process's checkpoints stay; on this test's folder alone, as above)."""
    pytest.importorskip("megatron.core", reason="the megatron backend needs megatron-core")
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"stages": 2, "microbatches": 2, "t_f": 1, "t_b": 1, "t_w": 1}))
    command = [sys.executable, "-m", "harness", "run", "--backend", "megatron", "--profile"]
    command += [str(profile), "--policy", "1f1b", "--iterations", "100000"]
    env = {**os.environ, "TMPDIR": str(short_tmp)}
    run = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120  # start-up under load
        saved: list[Path] = []
        while time.monotonic() < deadline and run.poll() is None and not saved:
            saved = list(short_tmp.glob("adaptra-*checkpoints-*/save-*/*.pt"))
            time.sleep(0.2)
        assert run.poll() is None and saved, run.stderr.read() if run.stderr else ""
    finally:
        run.kill()
        run.wait()
    left = saved[0].parents[1]
    assert left.name.startswith("adaptra-checkpoints-megatron-")
    live = make_folder(CHECKPOINTS_PREFIX, str(short_tmp))  # this process's: it runs
    assert left in clean_orphaned([str(short_tmp)]).removed
    assert not left.exists() and Path(live).is_dir()


@pytest.mark.multiprocess
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc (Linux)")
def test_sigint_ends_a_background_run_that_inherited_it_ignored(
    tmp_path: Path, short_tmp: Path
) -> None:
    """A shell starts a script's background job (`run ... &`) with SIGINT ignored; `kill -INT`
    of it still ends the run as Ctrl-C does in the foreground: cleanup, one line, 130."""
    ignore_sigint = ("bash", "-c", 'trap "" INT; exec "$@"', "bash")
    with _emulated_run(tmp_path, short_tmp, 2, ignore_sigint, iterating=True) as (run, workers):
        ignored = Path(f"/proc/{run.pid}/status").read_text().split("SigIgn:")[1].split()[0]
        assert not int(ignored, 16) & (1 << (signal.SIGINT - 1))  # the run no longer ignores it
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=60)
    assert run.returncode == 130
    assert err.strip().splitlines() == ["interrupted (SIGINT)"]
    assert list(short_tmp.iterdir()) == []
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in workers)


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().split("\0")
    except OSError:
        return []


def _main_thread_sleep(pid: int) -> tuple[str, str] | None:
    """Where process `pid`'s main thread sleeps in the kernel (/proc's wchan: a `time.sleep`
    is in hrtimer_nanosleep) and how often it has given up the CPU so far; None if gone."""
    try:
        task = Path(f"/proc/{pid}/task/{pid}")
        switches = (task / "status").read_text().split("voluntary_ctxt_switches:")[1].split()[0]
        return (task / "wchan").read_text(), switches
    except (OSError, IndexError):
        return None


def _wait_inside_an_op(run: subprocess.Popen[str], workers: set[int]) -> None:
    """Return once a worker's main thread has been in one `time.sleep` for 2 s (in
    hrtimer_nanosleep, with no switch since): inside an op of `_launch_run`'s 20 s, its start-up
    over (a hang bound of 120 s)."""
    deadline = time.monotonic() + 120  # start-up under load
    since: dict[int, tuple[tuple[str, str] | None, float]] = {}
    while time.monotonic() < deadline and run.poll() is None:
        now = time.monotonic()
        for pid in workers:
            asleep = _main_thread_sleep(pid)
            if pid not in since or since[pid][0] != asleep:
                since[pid] = (asleep, now)
            elif (
                asleep is not None and asleep[0] == "hrtimer_nanosleep" and now - since[pid][1] >= 2
            ):
                return
        time.sleep(0.1)
    raise AssertionError("no worker was inside an op within 120 s")


@contextlib.contextmanager
def _launch_run(tmp_path: Path, scratch: Path) -> Iterator[tuple[subprocess.Popen[str], set[int]]]:
    """`launch --run` of 1F1B over 2 stages whose ops take 20 s (TMPDIR `scratch`), once
    torchrun runs both workers; with every process it started by then. Whatever of them
    still runs at the end is killed."""
    profile = tmp_path / "p.json"
    op_ms = {"t_f": 20000, "t_b": 20000, "t_w": 0}  # the workers are inside an op for long
    profile.write_text(json.dumps({"stages": 2, "microbatches": 2, **op_ms}))
    command = [sys.executable, "-m", "harness", "launch", "--profile", str(profile), "--policy"]
    command += ["1f1b", "--run", "--iterations", "1", "--warmup-iterations", "0"]
    command += ["--out", str(tmp_path / "out")]
    run = subprocess.Popen(
        command,
        env={**os.environ, "TMPDIR": str(scratch)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    started: set[int] = set()
    try:
        deadline = time.monotonic() + 120  # start-up under load
        workers: set[int] = set()
        while time.monotonic() < deadline and run.poll() is None and len(workers) < 2:
            started |= _descendants(run.pid)
            workers = {p for p in started if _cmdline(p)[1:4].count("pipeline.runtime.torchrun")}
            time.sleep(0.2)
        assert run.poll() is None and len(workers) == 2, run.stderr.read() if run.stderr else ""
        started |= _descendants(run.pid)
        yield run, started
    finally:
        for pid in [run.pid, *started]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        run.wait()


@pytest.mark.multiprocess
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize(
    ("signum", "line"),
    [
        (signal.SIGINT, "interrupted (SIGINT)"),
        (signal.SIGTERM, "terminated (SIGTERM)"),
    ],
)
def test_a_signal_stops_launch_run_s_torchrun_and_its_workers(
    tmp_path: Path, short_tmp: Path, signum: int, line: str
) -> None:
    """torchrun starts its workers in sessions of their own: the launch stopped torchrun
    alone, and its workers ran on (and wrote the timeline after the launch had said
    "interrupted"). Now every process it started is gone when it exits, and nothing is
    written after. (`--run-timeout-s` ends the same block by an exception, which
    tests/pipeline/test_processes.py shows stopping every process; a run here waited 40 s.)"""
    out = tmp_path / "out"
    with _launch_run(tmp_path, short_tmp) as (run, started):
        workers = {p for p in started if _cmdline(p)[1:4].count("pipeline.runtime.torchrun")}
        _wait_inside_an_op(run, workers)  # their start-up over, rank 0 inside its first op
        started |= _descendants(run.pid)
        run.send_signal(signum)
        _, err = run.communicate(timeout=120)
        assert run.returncode == 128 + signum
        assert err.strip().splitlines()[-1] == line
        left = [pid for pid in started if _alive(pid)]
        assert not left, [_cmdline(pid) for pid in left]
        written = sorted(p.name for p in out.iterdir())
        time.sleep(1.0)
        assert sorted(p.name for p in out.iterdir()) == written == ["profile.json", "schedule.json"]
        assert list(short_tmp.iterdir()) == []  # torchrun's log folder


@pytest.mark.multiprocess
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc (Linux)")
def test_cleanup_removes_a_killed_launch_run_s_torchrun_folder(
    tmp_path: Path, short_tmp: Path
) -> None:
    """SIGKILL leaves `launch --run` no chance to remove the temporary folder it gives
    torchrun (its logs, its workers' TMPDIR): that folder was a plain one, which `cleanup`
    left; now it is marked with the launch's process, and `cleanup`'s folder part removes it
    once the launch is gone (on this test's folder alone, as above). The torchrun and its
    workers ran on, sending their results to no one: `cleanup` stops them first."""
    with _launch_run(tmp_path, short_tmp) as (run, started):
        run.kill()  # as a kill -9 of it leaves torchrun to run on
        run.wait()
        (torchrun,) = [p for p in started if _cmdline(p)[1:3] == ["-m", "torch.distributed.run"]]
        assert _alive(torchrun)
        assert stop_orphaned_torchruns([str(short_tmp)]) == [torchrun]
        assert not [_cmdline(pid) for pid in started if _alive(pid)]
        (left,) = short_tmp.glob("adaptra-torchrun-*")
        assert (left / ".owner").read_text().split()[0] == str(run.pid)
        assert list(clean_orphaned([str(short_tmp)]).removed) == [left]
        assert list(short_tmp.iterdir()) == []


@pytest.mark.parametrize(
    ("first", "raised"),
    [
        (signal.SIGTERM, "Terminated"),
        (signal.SIGHUP, "Terminated"),
        (signal.SIGINT, "KeyboardInterrupt"),
    ],
)
def test_after_one_shutdown_signal_every_other_waits_for_the_cleanups(
    first: signal.Signals, raised: str
) -> None:
    """The first of SIGINT, SIGTERM and SIGHUP ends the command; a second, Ctrl-C's too, is
    ignored from then on: a SIGINT after a SIGTERM (or a double Ctrl-C) raised inside the
    cleanups and left the pool's folders behind."""
    from pipeline.signals import shutdown_handler

    handler = shutdown_handler(os.getpid())
    with pytest.raises(BaseException) as info:
        handler(first, None)
    assert type(info.value).__name__ == raised
    for later in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        handler(later, None)  # nothing raised


_SIGNAL_IN_A_FINALIZER = """
import os, signal, sys, time
import click
from harness.cli import cli, main
class SignalsItself:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100):  # bytecode boundaries: the handler runs in here
            pass
@cli.command("finalize")
def finalize():
    try:
        SignalsItself()
        time.sleep(10)
        click.echo("went on")
    finally:
        os.kill(os.getpid(), signal.SIGTERM)  # a second signal in the cleanups: ignored
        click.echo("cleaned up")
main(["finalize"])
"""


def test_a_shutdown_signal_handled_inside_a_finalizer_ends_the_command() -> None:
    """A SIGTERM whose handler ran inside a finalizer (pyroute2 drops an asyncio loop per
    namespace it opens) raised its Terminated there, Python printed "Exception ignored",
    the command went on, and the handler had already set every shutdown signal to ignored:
    only SIGKILL ended it. Now the signal is handled again outside the finalizer: the
    command's cleanups run, a second signal during them is ignored, exit status 143."""
    out = subprocess.run(
        [sys.executable, "-c", _SIGNAL_IN_A_FINALIZER],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 128 + signal.SIGTERM
    assert out.stdout.splitlines() == ["cleaned up"]
    assert out.stderr.splitlines() == ["terminated (SIGTERM)"]


def test_the_command_line_s_own_process_ends_by_a_signal_once_done() -> None:
    """After the command, the program's own process put Python's SIGINT handler back: a
    Ctrl-C as it exited raised a KeyboardInterrupt there, a traceback after the results and
    exit status 0. Now every shutdown signal is at its default from then on; an in-process
    call (argv given) gets back the handlers it had."""
    code = (
        "import signal, sys; from harness.cli import main\n"
        "sys.argv = ['adaptra-bench', '--help']\n"
        "main()\n"
        "own = [signal.getsignal(s) == signal.SIG_DFL for s in "
        "(signal.SIGINT, signal.SIGTERM, signal.SIGHUP)]\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "main(['--help'])\n"
        "print(own, signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.splitlines()[-1] == "[True, True, True] True"


_SIGNAL_WHILE_THE_HOOK_REPORTS = """
import os, signal, sys, time
import click
from harness.cli import cli, main
if sys.argv[1] == "python-hook":  # a hook set before (a library's): Python code
    def report(unraisable):
        print("reported:", str(unraisable.exc_value), file=sys.stderr, flush=True)
    sys.unraisablehook = report
class Slow(Exception):
    def __str__(self):  # run by the hook as it reports
        os.kill(os.getpid(), signal.SIGTERM)  # the signal arrives while it reports
        for _ in range(100):  # bytecode boundaries: the handler runs in here
            pass
        return "a finalizer's own error"
class FailsItself:
    def __del__(self):
        raise Slow()
@cli.command("finalize")
def finalize():
    try:
        FailsItself()
        time.sleep(10)
        click.echo("went on")
    finally:
        click.echo("cleaned up")
main(["finalize"])
"""


@pytest.mark.parametrize(
    ("previous_hook", "reported"),
    [
        ("default", "Slow: a finalizer's own error"),
        ("python-hook", "reported: a finalizer's own error"),
    ],
)
def test_a_shutdown_signal_handled_while_the_hook_reports_another_error_ends_the_command(
    previous_hook: str, reported: str
) -> None:
    """A SIGTERM whose handler ran while `sys.unraisablehook` reported another finalizer's
    error was lost (the hook, wrapped only from inside the first handler, or the hook it
    wraps, dropped the Terminated): the command went on, every later SIGTERM and SIGINT was
    ignored, exit status 0. Now it ends the command: cleanups, one line, 143."""
    out = subprocess.run(
        [sys.executable, "-c", _SIGNAL_WHILE_THE_HOOK_REPORTS, previous_hook],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 128 + signal.SIGTERM
    assert out.stdout.splitlines() == ["cleaned up"]
    assert reported in out.stderr.splitlines()
    assert out.stderr.splitlines()[-1] == "terminated (SIGTERM)"
    assert "failed" not in out.stderr


_SIGNAL_IN_A_FINALIZER_AT_THE_END = """
import os, signal, sys
from harness.cli import cli, main
class SignalsItself:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100):  # bytecode boundaries: the handler runs in here
            pass
@cli.command("finalize")
def finalize():
    SignalsItself()  # the command's last act
sys.argv = ["adaptra-bench", "finalize"]
main()
"""


def test_a_shutdown_signal_handled_inside_a_finalizer_as_the_command_ends_ends_it() -> None:
    """A SIGTERM whose handler ran inside a finalizer as the command ended was to be sent
    again from a daemon thread, and the interpreter exited first: exit status 0, as if no
    signal had come (20 of 20). Now it is handled as one that no finalizer swallowed."""
    out = subprocess.run(
        [sys.executable, "-c", _SIGNAL_IN_A_FINALIZER_AT_THE_END],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 128 + signal.SIGTERM
    assert out.stderr.splitlines() == ["terminated (SIGTERM)"]


_SIGNALLED_AT_THE_CLI_S_IMPORT = """
import importlib.abc, importlib.metadata, os, signal, sys

SIGNUM = int(sys.argv[1])

class SignalAtTheImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "harness.cli":  # torch, pandas and click load now
            os.kill(os.getpid(), SIGNUM)
        return None

sys.meta_path.insert(0, SignalAtTheImport())
sys.argv = ["adaptra-bench", "run", "--out", sys.argv[2], "--run-id", "r"]
(program,) = importlib.metadata.entry_points(group="console_scripts", name="adaptra-bench")
program.load()()
"""


@pytest.mark.parametrize(
    ("signum", "inherited"),
    [
        (signal.SIGINT, signal.SIG_IGN),  # a script's background job
        (signal.SIGINT, signal.SIG_DFL),
        (signal.SIGTERM, signal.SIG_DFL),
    ],
)
def test_a_signal_while_the_program_loads_its_modules_ends_it_in_one_line(
    tmp_path: Path, signum: int, inherited: signal.Handlers
) -> None:
    """The `adaptra-bench` program (its console script's entry point, as installed), sent a
    signal as it imports the command line's modules: one line, exit status 128 + n, nothing
    run (its handlers came after those imports: an ignored SIGINT was lost, and the default
    experiment ran to its end with exit status 0; a Ctrl-C printed a traceback)."""
    done = subprocess.run(
        [sys.executable, "-c", _SIGNALLED_AT_THE_CLI_S_IMPORT, str(int(signum)), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,  # a hang bound, not a timing
        preexec_fn=lambda: signal.signal(signal.SIGINT, inherited),
    )
    name = "interrupted" if signum == signal.SIGINT else "terminated"
    assert (done.returncode, done.stderr) == (
        128 + signum,
        f"{name} ({signal.Signals(signum).name})\n",
    )
    assert list(tmp_path.iterdir()) == []


_WAITS = """
import sys, time
import click
from harness.cli import cli
from harness.program import main
@cli.command("wait")
def wait():
    click.echo("ready")
    time.sleep(30)
sys.argv = ["adaptra-bench", "wait"]
main()
"""


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGINT, signal.SIGTERM])
def test_a_signal_ends_a_command_whose_stderr_is_gone_with_128_plus_n(
    signum: signal.Signals,
) -> None:
    """A closed terminal's SIGHUP, or a Ctrl-C that also ended the pipe's reader (`2>&1 | tee
    log`): the command's one line could not be written (EIO, EPIPE), that error escaped the
    signal's exit and the command ended with exit status 1, a failed run, not 128 + n."""
    read, write = os.pipe()
    command = subprocess.Popen(
        [sys.executable, "-c", _WAITS], stdout=write, stderr=write, start_new_session=True
    )
    os.close(write)
    with os.fdopen(read, "rb") as out:
        assert out.readline() == b"ready\n"
    command.send_signal(signum)  # its stdout and stderr now go nowhere
    assert command.wait(timeout=60) == 128 + signum
