"""A torchrun command run on this machine (`launch --run`): on loopback only, stopped at its
time, its failure told by its workers' last error line."""

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.errors import LaunchError
from pipeline.runtime.local_launch import failure_reason, loopback_only, run_local

ASSETS = Path(__file__).parents[2] / "assets"


def test_a_worker_s_error_after_start_up_is_the_reason_not_torchrun_s_banner() -> None:
    """torch 2.13 prefixes a worker's lines with "[rankN]: " once its process group exists:
    the real stderr of a 2-rank torchrun whose rank 1 timed out (its output ends in
    torchrun's summary, a row of "=")."""
    stderr = (ASSETS / "torchrun_rank1_timeout_stderr.txt").read_text()
    assert stderr.strip().splitlines()[-1].startswith("=====")
    assert failure_reason(stderr) == (
        "rank 1: TimeoutError: waiting for the activation of microbatch 0 from rank 0 failed: "
        "nothing came within 2 s"
    )


def test_a_worker_killed_by_a_signal_is_the_reason_torchrun_s_summary_names() -> None:
    """The real stderr of a 2-rank torchrun whose rank 1 was SIGKILLed (as the OOM killer
    does) in its first op: no worker says an error, and the reason was the last line,
    torchrun's banner of "=" ("torchrun failed with exit code 1: =====...")."""
    stderr = (ASSETS / "torchrun_rank1_sigkill_stderr.txt").read_text()
    assert stderr.strip().splitlines()[-1].startswith("=====")
    assert failure_reason(stderr) == "rank 1: Signal 9 (SIGKILL) received by PID 26037"
    # a worker that exited with a code of its own, saying no error: its code
    exited = stderr.replace("-9 (pid: 26037)  (SIGKILL)", "3 (pid: 26037)").replace(
        "Signal 9 (SIGKILL) received by PID 26037", "To enable traceback see: https://x"
    )
    assert failure_reason(exited) == "rank 1: exit code 3"


def test_a_start_up_error_has_no_rank_and_no_error_gives_the_last_line() -> None:
    """Before the process group exists a worker's lines have no prefix; torchrun's own
    ChildFailedError is never the reason; without any error line, the last line is."""
    stderr = (
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in <module>\n'
        "    raise RuntimeError('no address')\n"
        "RuntimeError: Unable to find address for: no-such-nic\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        "============================================================\n"
    )
    assert failure_reason(stderr) == "RuntimeError: Unable to find address for: no-such-nic"
    assert failure_reason("starting\nkilled by a signal\n") == "killed by a signal"
    assert failure_reason("") == "no output"


def _marked(marker: bytes) -> list[str]:
    """The processes whose environment holds `marker` (an exited one's is empty)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker in (proc / "environ").read_bytes().split(b"\0"):
                    found.append(proc.name)
            except OSError:
                continue  # gone, or not ours to read
    return found


def test_a_run_past_its_time_or_failing_is_a_launch_error_and_leaves_no_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A runtime failure, not a malformed option: it was raised as ConfigError (a ValueError).
    The process is stopped and waited for either way. Each process the command started
    inherits a marker in its environment: found, whether or not it got as far as its pid
    file within the 2 s (a loaded host once started it later)."""
    monkeypatch.setenv("ADB_TEST_LAUNCH_MARK", str(tmp_path))
    pid_file = tmp_path / "pid"
    sleeper = shlex.join(["sh", "-c", f"echo $$ > {pid_file}; exec sleep 60"])  # starts fast
    with pytest.raises(LaunchError, match=r"did not finish within 2 s") as caught:
        run_local(sleeper, tmp_path, loopback=False, timeout_s=2)
    assert not isinstance(caught.value, ValueError)
    assert _marked(f"ADB_TEST_LAUNCH_MARK={tmp_path}".encode()) == []
    if pid_file.exists():
        assert not Path(f"/proc/{pid_file.read_text().strip()}").exists()
    failing = f"{sys.executable} -c 'raise RuntimeError(\"no address for: nic9\")'"
    with pytest.raises(
        LaunchError, match=r"^torchrun failed with exit code 1: RuntimeError: no address for: nic9$"
    ):
        run_local(failing, tmp_path, loopback=False, timeout_s=60)
    # off loopback, it says its store listens on every interface
    assert "torchrun's store listens on every interface of this host" in caplog.text


@pytest.mark.skipif(
    shutil.which("unshare") is None
    or subprocess.run(["unshare", "--user", "--map-root-user", "--net", "true"]).returncode,
    reason="this machine allows no network namespace of one's own",
)
def test_a_local_run_seesloopback_only() -> None:
    """What the wrapped command sees: one interface, lo, up; a socket bound to every address
    can therefore only ever be reached from inside."""
    code = "import socket; print(' '.join(name for _, name in socket.if_nameindex()))"
    out = subprocess.run(
        loopback_only([sys.executable, "-c", code]), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["lo"]
