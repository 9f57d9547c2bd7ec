"""The runtime's own fault hook (no processes): static delays by link name, a fault view
asked with the concrete link, PP or DP. Then, in fresh interpreters, what the workers' fork
server imports."""

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.errors import LinkFailure
from pipeline.faults import NO_FAULTS, MessageFault
from pipeline.runtime.hooks import FaultViewHook, HookRoute
from pipeline.topology import Link


@dataclasses.dataclass(frozen=True)
class _Recording:
    asked: list[tuple[Link, str, str, int]] = dataclasses.field(default_factory=list)
    down: frozenset[int] = frozenset()
    """The NICs whose route is down."""
    delay_ms: tuple[float, ...] = (0.0, 0.0)
    """Per NIC."""

    def message_fault(
        self,
        link: Link,
        direction: str,
        kind: str,
        microbatch: int,
        num_bytes: int = 0,
        offset_ms: float = 0.0,
        nic: int = 0,
    ) -> MessageFault:
        self.asked.append((link, direction, kind, microbatch))
        return MessageFault(self.delay_ms[nic], failed=nic in self.down)


def test_pp_and_dp_messages_reach_the_view_as_concrete_links() -> None:
    faults = _Recording()
    hook = FaultViewHook({"0-1": 0.0, "dp1:0-1": 0.0}, faults, replica=1)
    assert hook("0-1", "forward", 0, "F", 3, 64) == 0.0
    assert hook("dp1:0-1", "backward", 0, "AR", 7, 64) == 0.0
    assert faults.asked == [
        (Link.pp(0, 1), "forward", "F", 3),  # the sender's replica's PP link
        (Link.dp(1, 0), "backward", "AR", 7),  # a DP link's name is concrete already
    ]


def test_a_failed_dp_link_names_the_all_reduce_message() -> None:
    hook = FaultViewHook({}, _Recording(down=frozenset({0})))
    with pytest.raises(LinkFailure, match=r"link dp2:0-2 \(backward\) has failed: all-reduce "):
        hook("dp2:0-2", "backward", 4, "AR", 5, 64)


def test_a_delegated_message_goes_over_the_first_nic_whose_route_is_up() -> None:
    """`route` keeps the link direction's NIC while its route is up and moves it to the first
    NIC whose route is up otherwise, with that route's delay (plus the link's own); no route
    up is a LinkFailure, as is any failure of a direct send (gloo's one NIC). No fault view:
    the hook names no NIC (the delegates decide)."""
    slow_rnic1 = _Recording(delay_ms=(0.0, 3.0))
    hook = FaultViewHook({"0-1": 2.0}, slow_rnic1)
    assert hook.route("0-1", "forward", 0, "F", 0, 64, 0, 2) == HookRoute(0, 2.0)
    assert hook.route("0-1", "forward", 0, "F", 0, 64, 1, 2) == HookRoute(1, 5.0)
    rnic0_down = FaultViewHook({"0-1": 2.0}, _Recording(down=frozenset({0}), delay_ms=(0, 3)))
    assert rnic0_down.route("0-1", "forward", 0, "F", 0, 64, 0, 2) == HookRoute(1, 5.0)
    rnic1_down = FaultViewHook({}, _Recording(down=frozenset({1})))
    assert rnic1_down.route("0-1", "forward", 0, "F", 0, 64, 1, 2) == HookRoute(0, 0.0)
    both = FaultViewHook({}, _Recording(down=frozenset({0, 1})))
    with pytest.raises(LinkFailure, match="link pp0:0-1 .forward. has failed"):
        both.route("0-1", "forward", 0, "F", 0, 64, 1, 2)
    with pytest.raises(LinkFailure):
        FaultViewHook({}, _Recording(down=frozenset({0})))("0-1", "forward", 0, "F", 0, 64)
    assert FaultViewHook({"0-1": 2.0}, NO_FAULTS).route(
        "0-1", "forward", 0, "F", 0, 64, 1, 2
    ) == HookRoute(None, 2.0)


_PRELOADED = """
import sys
from pipeline.runtime.hooks import local_launch, preload_in_workers
from pipeline.runtime.megatron import WORKER_IMPORTS

def imported_in_a_worker(module):
    code = f"import sys; sys.exit(0 if {module!r} in sys.modules else 3)"
    process = local_launch(0, exec, (code,))
    process.join(120)
    return {0: True, 3: False}[process.exitcode]

assert "megatron.core" not in sys.modules  # nor in the server, but by the preload
preload_in_workers(WORKER_IMPORTS)
print(imported_in_a_worker("megatron.core.models.gpt"))  # the server starts: preloaded
preload_in_workers(("wave",))  # the server has started: too late, it keeps what it has
print(imported_in_a_worker("wave"), imported_in_a_worker("megatron.core.models.gpt"))
"""


def _python(code: str, *args: str, first_on_path: Path | None = None) -> list[str]:
    """The lines `code` prints with `args`, in a fresh interpreter (its own fork server),
    `first_on_path` before the repository on its path; it must exit 0."""
    root = Path(__file__).resolve().parents[3]
    path = [str(p) for p in (first_on_path, root) if p is not None]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([*path, os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "UserWarning" not in done.stderr  # megatron's import-time warnings stay quiet
    return done.stdout.splitlines()


@pytest.mark.multiprocess
def test_the_fork_server_imports_megatron_for_the_workers_when_asked_before_it_starts() -> None:
    """A worker forked after `preload_in_workers(WORKER_IMPORTS)` has megatron-core without
    importing it (the name resolves: the server drops a module it cannot import silently); a
    server that has started keeps what it imported."""
    assert _python(_PRELOADED) == ["True", "False True"]


_TEMP_DIRS = """
import multiprocessing.util, sys
from pipeline.runtime.hooks import start_worker
from tests.pipeline.runtime.test_hooks import _write_temp_dir

for rank, out in enumerate(sys.argv[1:]):
    start_worker(rank, _write_temp_dir, (out,)).join()
print(multiprocessing.util.get_temp_dir())
"""


def _write_temp_dir(out: str) -> None:
    """A worker's target: its multiprocessing temporary folder into file `out`."""
    import multiprocessing.util

    Path(out).write_text(multiprocessing.util.get_temp_dir())


@pytest.mark.multiprocess
def test_every_worker_shares_its_controller_s_marked_temporary_folder(tmp_path: Path) -> None:
    """The process's first worker knew of no multiprocessing folder (its process object was
    made before the folder): one it needed (a listener's socket) was a `pymp-` folder of its
    own, unmarked, which a terminated or killed worker left behind and `cleanup` never
    removes. Every worker now has its controller's, which is marked."""
    outs = [tmp_path / f"rank{rank}" for rank in range(2)]
    (controller_s,) = _python(_TEMP_DIRS, *map(str, outs))
    assert [out.read_text() for out in outs] == [controller_s, controller_s]


_TWO_POOLS = """
import functools, sys
from baselines import one_f_one_b
from pipeline.profile import Profile
from pipeline.runtime import IterationConfig, WorkerPool
from pipeline.runtime.compute import EmulatedCompute
from pipeline.runtime.hooks import preload_in_workers
from pipeline.runtime.megatron import WORKER_IMPORTS, MegatronCompute

profile = Profile.uniform(2, 4, 1, 1, 1)
config = IterationConfig(0, one_f_one_b(profile), profile)
computes = {"emulated": EmulatedCompute, "megatron": functools.partial(MegatronCompute, "tiny")}
for backend in sys.argv[1:]:  # the first starts the fork server
    preload_in_workers(WORKER_IMPORTS if backend == "megatron" else ())  # as the engines do
    try:
        with WorkerPool(2, compute_factory=computes[backend], timeout_s=60) as pool:
            pool.run_iteration(config)
            loss = pool.last_results[1].step_output.loss
            print(backend, "ran" if loss is None else "trained")
    except Exception as err:
        print(backend, "failed:", type(err).__name__, err)
"""


@pytest.mark.multiprocess
def test_a_megatron_pool_after_another_backend_s_imports_megatron_in_its_workers() -> None:
    """An emulated pool first starts the fork server without megatron-core: the megatron pool
    after it asks for it too late, and its workers import it themselves, and train."""
    assert _python(_TWO_POOLS, "emulated", "megatron") == ["emulated ran", "megatron trained"]


@pytest.mark.multiprocess
def test_a_megatron_core_that_fails_to_import_fails_its_pool_not_the_fork_server(
    tmp_path: Path,
) -> None:
    """A megatron-core whose import raises another error than ImportError (one built for
    another torch): the fork server, which preloads it, lives on; the megatron pool fails
    with a worker's error naming its rank and the import's, and an emulated pool after it in
    the same process runs."""
    broken = tmp_path / "megatron"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise AttributeError('built for another torch')\n")
    lines = _python(_TWO_POOLS, "megatron", "emulated", first_on_path=tmp_path)
    assert len(lines) == 2 and lines[1] == "emulated ran"
    assert lines[0].startswith("megatron failed: WorkerCrash rank ")
    assert "AttributeError: built for another torch" in lines[0]


_CTRL_C_AS_THE_SERVER_STARTS = """
import time
from pipeline.runtime.hooks import preload_in_workers, start_worker
from pipeline.signals import run_script

def main():
    preload_in_workers(["slow_preload"])
    start_worker(0, time.sleep, (0.0,)).join()

run_script(main)
"""


def _run_importing_slowly(tmp_path: Path, import_s: float) -> subprocess.Popen[str]:
    """`_CTRL_C_AS_THE_SERVER_STARTS` in a session of its own, its fork server's preload
    taking `import_s` (it touches `importing` as it starts and `imported` as it ends),
    returned once the server is importing it."""
    importing, imported = tmp_path / "importing", tmp_path / "imported"
    (tmp_path / "slow_preload.py").write_text(
        f"import pathlib, time\npathlib.Path({str(importing)!r}).touch()\n"
        f"time.sleep({import_s})\npathlib.Path({str(imported)!r}).touch()\n"
    )
    # On the path from the environment: the fork server does not take its parent's sys.path.
    root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), root])}
    run = subprocess.Popen(
        [sys.executable, "-c", _CTRL_C_AS_THE_SERVER_STARTS],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while not importing.exists() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if not importing.exists():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)  # the run and its fork server
        run.wait()
        raise AssertionError("the fork server never imported the slow preload")
    return run


@pytest.mark.multiprocess
@pytest.mark.skipif(not hasattr(os, "killpg"), reason="a terminal's Ctrl-C: a process group")
def test_ctrl_c_while_the_fork_server_imports_its_preloads_is_one_line(tmp_path: Path) -> None:
    """A terminal's Ctrl-C reaches the whole job, the fork server too, which ignores SIGINT
    only once it has imported its preloads (torch: a second or more): it printed a
    KeyboardInterrupt traceback under the run's one line. Here a preload that takes 3 s."""
    run = _run_importing_slowly(tmp_path, 3.0)
    try:
        os.killpg(run.pid, signal.SIGINT)
        _, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 128 + signal.SIGINT
    assert err == "interrupted (SIGINT)\n"


@pytest.mark.multiprocess
@pytest.mark.skipif(not hasattr(os, "killpg"), reason="the run's fork server: its process group")
def test_ctrl_c_to_the_run_alone_ends_it_while_the_fork_server_imports(tmp_path: Path) -> None:
    """SIGINT is blocked where the fork server is spawned, not while the run then waits for
    it to import its preloads: a Ctrl-C there (here to the run alone, as `kill -INT`) ended
    the run only once they were imported, and never where an import hung. Here a preload
    that takes 60 s; the run ends long before."""
    run = _run_importing_slowly(tmp_path, 60.0)
    try:
        run.send_signal(signal.SIGINT)
        run.wait(timeout=45)  # (its stderr stays open in the fork server)
        assert not (tmp_path / "imported").exists()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)  # the fork server, still importing
        run.wait()
    assert run.stderr is not None
    err = run.stderr.read()
    run.stderr.close()
    assert run.returncode == 128 + signal.SIGINT
    assert err == "interrupted (SIGINT)\n"
