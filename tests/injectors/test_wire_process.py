"""A wire's process between two hosts of a testbed, and the signals it meets (needs root)."""

import os
import signal
import subprocess

import pytest

from injectors.testbed import Testbed
from injectors.wire import HEALTHY, WireError, WireProcess

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="network namespaces need root (CI runs as root)"
)

ANSWER_S = 60.0
"""A hang guard, not a timing (the testbed's WIRE_ANSWER_S)."""


def _links(namespace: str) -> str:
    return subprocess.run(
        ["ip", "-n", namespace, "-o", "link"], capture_output=True, text=True, check=True
    ).stdout


def test_a_ctrl_c_leaves_a_wire_running_and_quiet_until_it_is_told_to_stop(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Ctrl-C sends SIGINT to the terminal's whole process group, the wires too: each once
    died printing "Process SpawnProcess-2: Traceback ... KeyboardInterrupt" before the CLI's
    one line. Now a SIGINT during its start or while it forwards changes nothing: it comes
    up, answers, says nothing, and ends when told, its TAPs with it."""
    with Testbed(2, prefix="adb-wint-", netem=False) as bed:
        wire = WireProcess(bed.hosts[0], bed.hosts[1], "w9", "the test's wire")
        try:
            wire.start()
            assert wire.process.pid is not None
            os.kill(wire.process.pid, signal.SIGINT)  # as it starts
            wire.tell(None, "ready", ANSWER_S)
            assert all(" w9: " in _links(host) for host in bed.hosts)
            os.kill(wire.process.pid, signal.SIGINT)  # as it forwards
            wire.tell(("state", 0.0, HEALTHY, HEALTHY), "ok", ANSWER_S)
            assert wire.process.is_alive()
            wire.stop(grace_s=ANSWER_S)  # not the testbed's 2 s: a loaded host may be slow
            assert wire.process.exitcode == 0  # it ended on "stop", not on a kill
            assert not any(" w9: " in _links(host) for host in bed.hosts)
        finally:
            wire.kill()
    assert capfd.readouterr().err == ""


def test_a_wire_that_cannot_open_its_taps_says_why() -> None:
    """It once died with its traceback on stderr, and its testbed said only "is gone:
    EOFError": now it answers why, and ends."""
    wire = WireProcess("adb-no-such-ns-a", "adb-no-such-ns-b", "w0", "the wire w0")
    wire.start()
    try:
        with pytest.raises(WireError) as info:
            wire.tell(None, "ready", ANSWER_S)
        assert str(info.value).startswith(
            "the wire w0 could not start: opening its TAPs: FileNotFoundError: "
        )
        assert "adb-no-such-ns-a" in str(info.value)
        wire.process.join(ANSWER_S)
        assert wire.process.exitcode == 0
    finally:
        wire.kill()
