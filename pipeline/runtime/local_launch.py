"""A torchrun command run on this machine (`launch --run`): kept on loopback, its log folder
marked as this process's, its workers stopped with it whatever ends the wait, and its
failure told by what its workers said last."""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import re
import shlex
import shutil
import socket
import subprocess
from pathlib import Path

from pipeline.errors import ConfigError, LaunchError
from pipeline.processes import PipeReader, process_tree
from pipeline.runtime.scratch import TORCHRUN_PREFIX, owned_folder, share_folder
from pipeline.timeline import Timeline
from pipeline.torchrun_launch import TIMELINE_FILE

__all__ = ["check_local_address", "failure_reason", "loopback_only", "run_local"]

logger = logging.getLogger(__name__)

_ERROR_LINE = re.compile(
    r"(?:\[rank(?P<rank>\d+)\]:\s*)?(?P<error>[A-Za-z_][\w.]*(Error|Exception|Failure)\b.*)"
)
"""A traceback's last line, as a worker prints it: once its process group exists, torch
prefixes each of its lines with "[rankN]: "."""


def run_local(command: str, out_dir: Path, *, loopback: bool, timeout_s: float) -> Timeline:
    """Run `command` (one node's, from `torchrun_commands`) and return the timeline its
    workers wrote to `out_dir`; a run past `timeout_s` or a failed one raises `LaunchError`.
    `loopback`: its node 0's address is a loopback one (`check_local_address`), so it runs
    in a loopback-only namespace where the machine allows one; else it says it does not."""
    argv = shlex.split(command)
    if loopback:
        argv = loopback_only(argv)
    else:
        logger.warning(
            "node 0's address is not a loopback one: torchrun's store listens on every "
            "interface of this host (no loopback-only namespace for it)"
        )
    # torchrun leaves a log folder in the temporary directory: give it one that goes (marked
    # as this process's: `cleanup` removes it if a kill leaves it).
    with owned_folder(TORCHRUN_PREFIX) as scratch:
        env = {
            **os.environ,
            "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
            "TMPDIR": scratch,
        }
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
        # Its workers, in sessions of their own, stop with it whatever ends the wait. The wait
        # is for torchrun's exit, not its pipes' end: the workers of a torchrun that crashed
        # hold them until the exit stops them.
        with process_tree(argv, env=env, **pipes) as torchrun:
            share_folder(scratch, torchrun.pid)  # a kill of this process leaves it running
            output = PipeReader(torchrun)
            try:
                torchrun.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired as err:
                raise LaunchError(
                    f"torchrun did not finish within {timeout_s:g} s (--run-timeout-s)"
                ) from err
        _, stderr = output.result()
    if torchrun.returncode != 0:
        reason = failure_reason(stderr)
        raise LaunchError(f"torchrun failed with exit code {torchrun.returncode}: {reason}")
    return Timeline.from_dict(json.loads((out_dir / TIMELINE_FILE).read_text()))


def check_local_address(address: str) -> bool:
    """Whether `address`, `launch --run`'s --master-addr, is a loopback one ("localhost" or an
    IP address of loopback, which a loopback-only namespace has too); a ConfigError where it
    is not an IP address of this host (the one node it starts would wait for a store that is
    not there until --run-timeout-s). A host name other than "localhost" is refused too: it
    is not looked up (no traffic off this host)."""
    if address == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        raise ConfigError(
            f"--run takes an IP address of this host as --master-addr (or none: loopback), "
            f"not the host name {address!r}"
        ) from None
    if ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped and ip.ipv4_mapped.is_loopback):
        return True
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, 0))  # binds only an address this host has; sends nothing
        except OSError as err:
            raise ConfigError(
                f"--master-addr {address} is not an address of this host ({err.strerror}): "
                "--run starts its one node here"
            ) from None
    return False


def failure_reason(stderr: str) -> str:
    """What a failed torchrun's workers said last of their error (a traceback's last line,
    with the rank that said it where torch named it; torchrun's own summary, a banner of "=",
    ends its output); else, where none said one (a worker killed by a signal: the kernel's
    OOM killer's SIGKILL), the first failure torchrun's summary names; else its last line."""
    lines = [line.strip() for line in stderr.strip().splitlines()]
    for line in reversed(lines):
        found = _ERROR_LINE.fullmatch(line)
        if found and "ChildFailedError" not in line:
            rank = found["rank"]
            return found["error"] if rank is None else f"rank {rank}: {found['error']}"
    return _root_cause(lines) or (lines or ["no output"])[-1]


def _root_cause(lines: list[str]) -> str | None:
    """The rank and its signal or exit code in torchrun's summary's "Root Cause (first
    observed failure)" (its fields "rank : 1 (local_rank: 1)", "exitcode : -9 (pid: 7)
    (SIGKILL)", "traceback : Signal 9 (SIGKILL) received by PID 7"), None without one."""
    starts = [k for k, line in enumerate(lines) if line.startswith("Root Cause")]
    if not starts:
        return None
    fields: dict[str, str] = {}
    for line in lines[starts[-1] + 1 :]:
        key, colon, value = line.partition(":")
        if colon:
            fields.setdefault(key.strip(), value.strip())
    rank, exit_code = fields.get("rank", "").split(" ")[0], fields.get("exitcode", "").split(" ")[0]
    traceback = fields.get("traceback", "")
    if traceback.startswith("Signal "):
        what = traceback
    elif exit_code:
        what = f"exit code {exit_code}"
    else:
        return None
    return f"rank {rank}: {what}" if rank else what


def loopback_only(argv: list[str]) -> list[str]:
    """`argv` in a network namespace of its own with only loopback, where the machine allows
    one (a user namespace: no root needed): torchrun's store listens on every interface
    whatever address it is given, and a local run must not be reachable from outside."""
    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    if unshare is None or ip is None:
        logger.warning("no unshare or ip here: torchrun's store listens on every interface")
        return argv
    probe = [unshare, "--user", "--map-root-user", "--net", ip, "link", "set", "lo", "up"]
    if subprocess.run(probe, capture_output=True, timeout=30).returncode != 0:
        logger.warning(
            "no network namespace allowed here: torchrun's store listens on every interface"
        )
        return argv
    script = f'{shlex.quote(ip)} link set lo up && exec "$@"'
    return [unshare, "--user", "--map-root-user", "--net", "sh", "-c", script, "sh", *argv]
