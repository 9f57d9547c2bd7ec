"""A torchrun launch's command lines (one per node, each running
`pipeline.runtime.torchrun`'s workers), node 0's address checked, and the files its rank 0
writes: what `launch` needs without importing torch."""

from __future__ import annotations

import ipaddress
import re
import shlex
import sys
from pathlib import Path

from pipeline.errors import ConfigError

__all__ = [
    "DIGEST_FILE",
    "LAUNCH_ID",
    "LAUNCH_ID_FILE",
    "LOSSES_FILE",
    "STEP_RESULTS",
    "TIMELINE_FILE",
    "check_master_addr",
    "remove_step_results",
    "torchrun_commands",
]

_HOST_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
TIMELINE_FILE, LOSSES_FILE, DIGEST_FILE = "timeline.json", "losses.json", "params_sha256.txt"
LAUNCH_ID_FILE = "launch_id.txt"
"""The --launch-id its command line gave (a cluster job's step: `launch --spec`), written
first: its results are that launch's, not another's into the same folder."""
LAUNCH_ID = re.compile(r"[0-9a-f]{32}")
"""A launch's id, as `launch --spec` draws it (harness.slurm)."""
STEP_RESULTS = (LAUNCH_ID_FILE, TIMELINE_FILE, LOSSES_FILE, DIGEST_FILE)
"""What `main` writes to its --out folder (rank 0): a launch removes an earlier run's first,
so that a run that fails leaves none that look like its own."""


def remove_step_results(folder: Path) -> None:
    """An earlier run's `STEP_RESULTS` in `folder` removed (a folder in the way stays: rank 0's
    write then fails, saying so)."""
    for name in STEP_RESULTS:
        if not (folder / name).is_dir():
            (folder / name).unlink(missing_ok=True)


def check_master_addr(address: str) -> None:
    """A ConfigError unless `address` (node 0's, as torchrun takes it) is an IP address of one
    host (not 0.0.0.0 or ::, nor a multicast or the broadcast address) or a host name
    (dot-separated labels of letters, digits and inner hyphens, the last not all digits:
    "999.1.1.1" is neither)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        ip = None
    if ip is not None:
        if ip.is_unspecified or ip.is_multicast or address == "255.255.255.255":
            raise ConfigError(f"--master-addr {address} is not the address of one host")
        return
    labels = address.split(".")
    if (
        len(address) > 253
        or not all(_HOST_LABEL.fullmatch(label) for label in labels)
        or labels[-1].isdigit()
    ):
        raise ConfigError(f"--master-addr {address!r} is neither an IP address nor a host name")


def torchrun_commands(
    *,
    num_nodes: int,
    procs_per_node: int,
    master_addr: str,
    master_port: int | None,
    worker_args: list[str],
    log_dir: Path | None = None,
) -> list[str]:
    """The command to run on node k (k = 0 .. num_nodes - 1), as shell text. `master_port`
    None (one node only): torchrun's store binds a free port itself, at `master_addr`, and
    tells its workers which; a port chosen before torchrun starts may be taken by another
    process (a second launch, a gloo connection) before its store binds it. `log_dir`:
    where each node's torchrun keeps its logs, its workers' output too (else a folder of its
    own in the node's temporary directory, left behind)."""
    if master_port is None and num_nodes != 1:
        raise ValueError(f"{num_nodes} nodes need node 0's port: only one node finds its own")
    if master_port is None:  # c10d rendezvous: its store binds port 0, the kernel picks
        address = f"[{master_addr}]" if ":" in master_addr else master_addr
        store = [
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={address}:0",
            f"--local-addr={master_addr}",  # the workers' MASTER_ADDR (not the host's name)
            # It hosts the store: torchrun decides so only where the host's name resolves to
            # the address (an address of this host off loopback waited as a client of port 0).
            "--rdzv-conf=is_host=1",
        ]
    else:
        store = [f"--master-addr={master_addr}", f"--master-port={master_port}"]
    commands = []
    for node_rank in range(num_nodes):
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={num_nodes}",
            f"--nproc-per-node={procs_per_node}",
            f"--node-rank={node_rank}",
            *store,
            *([] if log_dir is None else [f"--log-dir={log_dir}", "--tee=3"]),
            "-m",
            "pipeline.runtime.torchrun",
            *worker_args,
        ]
        commands.append(shlex.join(argv))
    return commands
