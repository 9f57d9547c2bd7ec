"""The kernel probe's throwaway namespace, ended by a shutdown signal (needs root)."""

import os
import signal
from collections.abc import Callable, Iterator

import pytest

from injectors.ownership import OwnerRecord
from pipeline.signals import Terminated, shutdown_handler

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")


def _raise_terminated() -> None:
    """The CLI's shutdown exception, as its handler raises it, the moment create returns."""
    raise Terminated(signal.SIGTERM)


def _send_sigterm() -> None:
    """A real SIGTERM to this process, the CLI's handler in place, before create returns."""
    os.kill(os.getpid(), signal.SIGTERM)


@pytest.fixture
def cli_handlers() -> Iterator[None]:
    """The CLI's shutdown handler on SIGTERM and SIGHUP (it ignores every later one as it
    handles one), and this process's own back afterwards."""
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP)}
    handler = shutdown_handler(os.getpid())
    for signum in previous:
        signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


@pytest.mark.usefixtures("cli_handlers")
@pytest.mark.parametrize(
    "after_create", [_raise_terminated, _send_sigterm], ids=["raised", "signalled"]
)
def test_a_shutdown_signal_at_the_probe_s_create_leaves_no_namespace_nor_record(
    monkeypatch: pytest.MonkeyPatch, after_create: Callable[[], None]
) -> None:
    """A signal inside `netns.create` or just as it returns once left `adb-probe-*` and its
    owner record behind (6 of 20 random SIGTERMs): now the namespace and the record are gone
    and the shutdown goes on, its exception's type kept."""
    from pyroute2 import netns

    from injectors.kernel_probe import probe_kernel

    real_create = netns.create
    made: list[str] = []

    def create_then_signal(name: str) -> None:
        made.append(name)
        real_create(name)
        after_create()

    monkeypatch.setattr(netns, "create", create_then_signal)
    try:
        with pytest.raises(Terminated) as info:
            probe_kernel()
        assert info.value.signum == signal.SIGTERM
        (name,) = made
        assert name.startswith("adb-probe-")
        assert name not in netns.listnetns()
        assert not [record for record in OwnerRecord.read_all() if name in record.namespaces]
    finally:  # the failure this test is for: undo it
        for name in made:
            if name in netns.listnetns():
                netns.remove(name)
            for record in OwnerRecord.read_all():
                if name in record.namespaces:
                    record.remove()
