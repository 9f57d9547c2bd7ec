"""`adaptra-bench doctor`: what this machine can do, each with its consequence for the user.

Kernel features are probed for real, inside a namespace of our own that is always removed
(injectors.kernel_probe, the probe the testbed's choice of netem or the wire also uses).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path

from injectors.kernel_probe import Found, kernel_features, per_link_path

__all__ = ["Check", "run_checks"]


@dataclasses.dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str
    consequence: str


_TESTBED_CAPABILITIES = {"CAP_NET_ADMIN": 12, "CAP_SYS_ADMIN": 21}
"""What the testbed needs besides euid 0 (linux/capability.h's bit numbers): links and
qdiscs, and its namespaces' mounts. Root in a container made without them has neither."""


def _effective_capabilities() -> int:
    """This process's effective capability set (/proc/self/status's CapEff; 0 where it
    cannot be read)."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def _root_check() -> Check:
    euid = os.geteuid()
    if euid != 0:
        return Check(
            "root",
            False,
            f"euid {euid}",
            "no network testbed: namespaces, qdiscs and link faults need root",
        )
    held = _effective_capabilities()
    missing = [name for name, bit in _TESTBED_CAPABILITIES.items() if not held >> bit & 1]
    if not missing:
        return Check("root", True, "euid 0", "")
    return Check(
        "root",
        False,
        f"euid 0 without {' and '.join(missing)}",
        "no network testbed: root in a container needs them (docker run --cap-add)",
    )


def run_checks(probe_kernel: Callable[[], Found] = kernel_features) -> list[Check]:
    root = os.geteuid() == 0
    root_check = _root_check()
    kernel = probe_kernel() if root else {}
    # As root a feature the probe did not report went untried: it had no namespace to try
    # it in (the probe answers with "namespaces" alone then).
    unprobed = (False, "untested: no namespace to try it in" if root else "needs root")
    # Root without CAP_NET_ADMIN can make namespaces (CAP_SYS_ADMIN) but no link in them:
    # no testbed either (its bridges are refused), though the namespace probe passed.
    no_testbed = not kernel.get("namespaces", (False, ""))[0] or not root_check.ok

    def kernel_check(key: str, consequence: str) -> Check:
        """`consequence`: where a testbed can be made (where none can, that is the one)."""
        ok, detail = kernel.get(key, unprobed)
        if not ok and no_testbed and key != "namespaces":
            consequence = "no network testbed"
        return Check(key, ok, detail, "" if ok else consequence)

    cuda = _cuda()
    rdma = sorted(p.name for p in Path("/sys/class/infiniband").glob("*"))
    return [
        root_check,
        kernel_check("namespaces", "no network testbed; transport-level faults still work"),
        kernel_check(
            "netem", "the testbed's per-link faults all go through the userspace delay wire"
        ),
        # Caps are htb classes that u32 filters feed per peer (injectors.peer_tc); random
        # loss is netem's or the userspace wire's (`per-link faults`), never a firewall's.
        kernel_check("htb", "no bandwidth caps and no per-peer netem (both are htb classes)"),
        kernel_check("u32", "no bandwidth caps and no per-peer netem (u32 picks the peer)"),
        Check(
            "tap",
            Path("/dev/net/tun").exists(),
            "/dev/net/tun",
            "" if Path("/dev/net/tun").exists() else "no userspace delay wire",
        ),
        _per_link_check(root_check, kernel),
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


def _per_link_check(root: Check, kernel: Found) -> Check:
    """Which path the testbed's per-link faults take (the wire also takes what netem cannot:
    a redrawn normal delay, a stall, a change at a later time); none where `root` (the root
    check) failed: no testbed can be built, whatever the kernel has."""
    name = "per-link faults"
    if os.geteuid() != 0:
        return Check(name, False, "needs root", "no network testbed")
    if not root.ok:  # e.g. CAP_SYS_ADMIN without CAP_NET_ADMIN: namespaces, but no links
        return Check(name, False, root.detail, "no network testbed")
    namespaces_ok, namespaces_detail = kernel.get("namespaces", (False, "not probed"))
    if not namespaces_ok:  # root without CAP_NET_ADMIN: netem and the wire both live in one
        return Check(name, False, f"no namespaces: {namespaces_detail}", "no network testbed")
    path = per_link_path(kernel)
    if path.netem or Path("/dev/net/tun").exists():
        return Check(name, True, path.detail, "")
    return Check(
        name,
        False,
        f"none: {path.reason} and no /dev/net/tun",
        "no fault timeline's per-pair delay, jitter, loss, stall or cap in the testbed (each "
        "is a wire state: harness.network); the profile's link bandwidths still hold (htb)",
    )


def _cuda() -> tuple[bool, str]:
    try:
        import torch
    except ImportError:
        return False, "torch not installed"
    if torch.cuda.is_available():
        return True, f"{torch.cuda.device_count()} device(s)"
    return False, "torch sees no CUDA device"
