"""`launch --run` keeps torchrun's store off every network but loopback."""

import shutil
import subprocess
import sys

import pytest

from harness.commands_infra import _loopback_only


@pytest.mark.skipif(
    shutil.which("unshare") is None
    or subprocess.run(["unshare", "--user", "--map-root-user", "--net", "true"]).returncode,
    reason="this machine allows no network namespace of one's own",
)
def test_a_local_run_sees_loopback_only() -> None:
    """What the wrapped command sees: one interface, lo, up; a socket bound to every address
    can therefore only ever be reached from inside."""
    code = "import socket; print(' '.join(name for _, name in socket.if_nameindex()))"
    out = subprocess.run(
        _loopback_only([sys.executable, "-c", code]), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["lo"]
