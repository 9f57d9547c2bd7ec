"""What this kernel can do for a testbed, tried for real in a throwaway namespace, and the
path the testbed's per-link faults take because of it (kernel netem or the userspace wire).

`kernel_features` probes once per process (doctor and every testbed share it); the namespace
it makes is recorded as this process's (injectors.ownership) and always removed.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import os
import uuid
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from injectors.ownership import OwnerRecord
from injectors.peer_tc import add_peer_filter
from pipeline.signals import held_signals

__all__ = [
    "NETEM_ENV",
    "PerLinkPath",
    "error_code",
    "error_reason",
    "kernel_features",
    "per_link_path",
    "probe_kernel",
]

NETEM_ENV = "ADAPTRA_BENCH_NETEM"
"""Set to 0, testbeds leave netem alone and put every per-link fault on the userspace wire."""

_QDISCS: dict[str, dict[str, object]] = {
    "netem": {"delay": 1000},
    "htb": {"default": 0x10},
}

Found = Mapping[str, tuple[bool, str]]
"""Feature name -> (present, what the probe saw)."""


def probe_kernel() -> dict[str, tuple[bool, str]]:
    """Namespaces, qdiscs and the u32 classifier, tried in a throwaway namespace."""
    try:
        from pyroute2 import IPRoute, netns
    except ImportError as err:
        return {"namespaces": (False, f"pyroute2 missing: {err}")}
    name = f"adb-probe-{uuid.uuid4().hex[:8]}"
    owner = OwnerRecord.for_this_process(name, (name,))  # `cleanup` knows it is ours
    found: dict[str, tuple[bool, str]] = {}
    try:
        # Made with the shutdown signals held, inside the try whose finally removes it: a
        # signal is handled only where that finally runs, so none leaves it or its record.
        with held_signals():
            owner.write()
            try:
                netns.create(name)
            except Exception as err:
                found["namespaces"] = (False, f"could not create one ({error_reason(err)})")
        if not found:
            with IPRoute(netns=name, flags=0) as ipr:
                _attach_each(ipr, found)
    finally:
        with held_signals():
            _remove(name, owner, found)
    return found


def _attach_each(ipr: Any, found: dict[str, tuple[bool, str]]) -> None:
    """Each of `_QDISCS` and the u32 classifier on a veth pair of its own, in `found`."""
    for number, (kind, options) in enumerate([*_QDISCS.items(), ("u32", {})]):
        what = "filter" if kind == "u32" else "qdisc"
        try:
            ipr.link("add", ifname=f"a{number}", kind="veth", peer=f"b{number}")
            index = ipr.link_lookup(ifname=f"a{number}")[0]
        except Exception as err:
            found[kind] = (False, f"untested: no veth pair to try it on ({error_reason(err)})")
            continue
        try:
            if kind == "u32":
                try:
                    ipr.tc("add", "htb", index, 0x10000, default=0x10)
                except Exception as err:
                    why = error_reason(err)
                    found[kind] = (False, f"untested: no htb qdisc to filter for ({why})")
                    continue
                add_peer_filter(ipr, index, "10.0.0.2", 0x10001)
            else:
                ipr.tc("add", kind, index, 0x10000, **options)
            found[kind] = (True, f"a {kind} {what} was attached")
        except Exception as err:
            found[kind] = (False, _failure(kind, what, err))


def _remove(name: str, owner: OwnerRecord, found: dict[str, tuple[bool, str]]) -> None:
    """The probe's namespace removed (absent: never made) and then its owner record; one
    that could not be removed keeps its record, for `cleanup`, and says so in `found`."""
    from pyroute2 import netns

    try:
        netns.remove(name)
    except FileNotFoundError:
        pass  # never made: its creation failed, or a signal came before it
    except Exception as err:  # its owner record stays: `cleanup` removes it later
        found["namespaces"] = (
            False,
            f"created one but could not remove it ({error_reason(err)}): "
            "`adaptra-bench cleanup` removes it",
        )
        return
    owner.remove()
    found.setdefault("namespaces", (True, "created and removed one"))


_MODULES = {"netem": "sch_netem", "htb": "sch_htb", "u32": "cls_u32"}
"""The kernel module behind each probed qdisc or classifier."""


def _failure(kind: str, what: str, err: Exception) -> str:
    """Why `kind` could not be attached, in words: the kernel answers ENOENT for a qdisc or
    classifier kind it does not know (its module is absent)."""
    if error_code(err) == errno.ENOENT:
        return f"no {_MODULES[kind]} in this kernel ({error_reason(err)})"
    return f"a {kind} {what} could not be attached ({error_reason(err)})"


def error_code(err: Exception) -> int | None:
    """The errno of an OSError or of pyroute2's NetlinkError (its `code`), else None."""
    code = err.errno if isinstance(err, OSError) else getattr(err, "code", None)
    return code if isinstance(code, int) else None


def error_reason(err: Exception) -> str:
    """An error's message without its errno: pyroute2's NetlinkError prints as the tuple
    `(2, 'No such file or directory')` and an OSError as `[Errno 2] No such file ...`."""
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    code = error_code(err)
    if code is not None:
        message = err.args[1] if len(err.args) > 1 else None
        return message if isinstance(message, str) and message else os.strerror(code)
    return str(err) or type(err).__name__


@functools.cache
def kernel_features() -> Found:
    """`probe_kernel`'s answer, probed on the first call of this process (needs root)."""
    return MappingProxyType(probe_kernel())


@dataclasses.dataclass(frozen=True, slots=True)
class PerLinkPath:
    """Where a testbed puts per-link faults that netem can express (the rest: the wire)."""

    netem: bool
    detail: str
    reason: str = ""
    """Why not netem, in words ("" where netem): `NETEM_ENV`'s 0, or the modules missing."""


def per_link_path(found: Found | None = None) -> PerLinkPath:
    """The automatic choice: kernel netem where the kernel has it, and the htb classes and
    u32 filters that give each peer its own netem (`found`, default: this process's probe),
    unless ADAPTRA_BENCH_NETEM=0; else the userspace wire."""
    if os.environ.get(NETEM_ENV) == "0":
        reason = f"{NETEM_ENV}=0"
        return PerLinkPath(False, f"userspace delay wire ({reason})", reason)
    found = kernel_features() if found is None else found
    modules = {"netem": "sch_netem", "htb": "sch_htb", "u32": "cls_u32"}
    missing = [modules[kind] for kind in modules if not found.get(kind, (False, ""))[0]]
    if not missing:
        return PerLinkPath(True, "kernel netem")
    reason = f"no {', '.join(missing)}"
    return PerLinkPath(False, f"userspace delay wire ({reason})", reason)
