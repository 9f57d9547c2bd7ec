import json
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# Loaded cores make hypothesis's timing checks flaky: no deadline and no "too slow" anywhere.
# CI (.ci/run sets CI) draws fewer examples, the same each run (derandomized: seeded).
settings.register_profile(
    "ci",
    deadline=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
settings.register_profile(
    "dev", deadline=None, max_examples=100, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

# The signal tests send SIGHUP to processes they start, which inherit this one's dispositions:
# under `nohup` SIGHUP is ignored, and the project rightly leaves an ignored signal ignored
# (pipeline.signals), so those tests would see their processes live on. They test the default.
if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
# So is SIGINT for a background job of a shell without job control (`pytest &` in a script):
# the processes the Ctrl-C tests start ignored it, and a solve they interrupt ran on to its
# time limit.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

ASSETS = Path(__file__).parent / "assets"

# torch's inductor cache in a folder of this session's, removed at its end: an import of
# megatron-core (torch.compile at its import) makes `<TMPDIR>/torchinductor_<user>` in the
# process that imports it, and the suite left it behind. Set here, before any conftest below
# imports megatron-core; xdist's workers and the tests' children inherit it.
_INDUCTOR_CACHE = None
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    _INDUCTOR_CACHE = tempfile.mkdtemp(prefix="adb-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _INDUCTOR_CACHE


def pytest_unconfigure(config: pytest.Config) -> None:
    if _INDUCTOR_CACHE is not None:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        shutil.rmtree(_INDUCTOR_CACHE, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def megatron_in_the_worker_fork_server() -> None:
    """Each test process's worker fork server imports megatron-core once, whichever pool
    starts it first: the many megatron pools of the tests skip their workers' own imports
    (2.5 s of CPU each here), where a run's first pool decides for itself."""
    from pipeline.runtime.hooks import preload_in_workers
    from pipeline.runtime.megatron import WORKER_IMPORTS

    preload_in_workers(WORKER_IMPORTS)


@pytest.fixture(scope="session")
def fig4_fixture() -> dict[str, Any]:
    """The paper's Fig. 4 schedule (the paper's Fig. 4, docs/paper.md)."""
    return json.loads((ASSETS / "fig4_zb_order.json").read_text())


@pytest.fixture(scope="session")
def fig4_path() -> Path:
    return ASSETS / "fig4_zb_order.json"


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A folder of a short path for a child's TMPDIR: the worker fork server's socket lives
    under it, and a socket's path has 108 bytes at most (tmp_path may be longer with xdist)."""
    folder = Path(tempfile.mkdtemp(prefix="adb-t-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
