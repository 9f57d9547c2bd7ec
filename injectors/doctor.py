"""`adaptra-bench doctor`: what this machine can do, each with its consequence for the user.

Kernel features are probed for real, inside a namespace of our own that is always removed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

from injectors.ownership import OwnerRecord
from injectors.testbed import add_peer_filter

__all__ = ["Check", "run_checks"]


@dataclasses.dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str
    consequence: str


_QDISCS: dict[str, dict[str, object]] = {
    "netem": {"delay": 1000},
    "tbf": {"rate": "10mbit", "burst": 10240, "latency": 50},
    "htb": {"default": 0x10},
}


def _probe_kernel() -> dict[str, tuple[bool, str]]:
    """Namespaces, qdiscs and the u32 classifier, tried in a throwaway namespace."""
    try:
        from pyroute2 import IPRoute, netns
    except ImportError as err:
        return {"namespaces": (False, f"pyroute2 missing: {err}")}
    name = f"adb-doctor-{uuid.uuid4().hex[:8]}"
    owner = OwnerRecord.for_this_process(name, (name,))  # `cleanup` knows it is ours
    found: dict[str, tuple[bool, str]] = {}
    try:
        owner.write()
        netns.create(name)
    except Exception as err:
        owner.remove()
        return {"namespaces": (False, str(err))}
    found["namespaces"] = (True, "created and removed one")
    try:
        with IPRoute(netns=name, flags=0) as ipr:
            for number, (kind, options) in enumerate([*_QDISCS.items(), ("u32", {})]):
                ipr.link("add", ifname=f"a{number}", kind="veth", peer=f"b{number}")
                index = ipr.link_lookup(ifname=f"a{number}")[0]
                try:
                    if kind == "u32":
                        ipr.tc("add", "htb", index, 0x10000, default=0x10)
                        add_peer_filter(ipr, index, "10.0.0.2", 0x10001)
                    else:
                        ipr.tc("add", kind, index, 0x10000, **options)
                    what = "filter" if kind == "u32" else "qdisc"
                    found[kind] = (True, f"a {kind} {what} was attached")
                except Exception as err:
                    found[kind] = (False, str(err))
    finally:
        netns.remove(name)
        owner.remove()
    return found


def run_checks(
    probe_kernel: Callable[[], dict[str, tuple[bool, str]]] = _probe_kernel,
) -> list[Check]:
    root = os.geteuid() == 0
    kernel = probe_kernel() if root else {}

    def kernel_check(key: str, consequence: str) -> Check:
        ok, detail = kernel.get(key, (False, "needs root"))
        return Check(key, ok, detail, "" if ok else consequence)

    cuda = _cuda()
    rdma = sorted(p.name for p in Path("/sys/class/infiniband").glob("*"))
    return [
        Check(
            "root",
            root,
            f"euid {os.geteuid()}",
            "" if root else "no network testbed: namespaces, qdiscs and link faults need root",
        ),
        kernel_check("namespaces", "no network testbed; transport-level faults still work"),
        kernel_check("netem", "no kernel per-packet delay: inject delays at the transport level"),
        kernel_check("tbf", "no bandwidth caps at the network level"),
        kernel_check("htb", "no per-peer bandwidth caps at the network level"),
        kernel_check("u32", "a cap would hit the whole interface, not one peer"),
        Check(
            "tap",
            Path("/dev/net/tun").exists(),
            "/dev/net/tun",
            "" if Path("/dev/net/tun").exists() else "no userspace delay wire",
        ),
        Check(
            "iptables",
            shutil.which("iptables") is not None,
            shutil.which("iptables") or "not found",
            "" if shutil.which("iptables") else "no random packet loss",
        ),
        Check(
            "cuda",
            cuda[0],
            cuda[1],
            ""
            if cuda[0]
            else "runs use CPUs and gloo; no NCCL, and megatron timings are not results",
        ),
        Check(
            "rdma",
            bool(rdma),
            ", ".join(rdma) or "no device in /sys/class/infiniband",
            "" if rdma else "delegates and links use TCP; nothing RDMA-specific can run",
        ),
        Check(
            "megatron-core",
            importlib.util.find_spec("megatron") is not None,
            "importable" if importlib.util.find_spec("megatron") else "not installed",
            ""
            if importlib.util.find_spec("megatron")
            else "no `--backend megatron` (pip install megatron-core)",
        ),
    ]


def _cuda() -> tuple[bool, str]:
    try:
        import torch
    except ImportError:
        return False, "torch not installed"
    if torch.cuda.is_available():
        return True, f"{torch.cuda.device_count()} device(s)"
    return False, "torch sees no CUDA device"
