"""Per-peer traffic control on one host's plane interface, through pyroute2.

An htb root 1: whose unmatched traffic leaves unshaped (default 0), and per destination host
an htb class that a u32 filter on the destination's address feeds: a bandwidth cap's class
(`Testbed.cap_bandwidth`), or netem's, an uncapped class with a netem qdisc as its leaf
(its state from injectors.netem). netem's filters come first (a lower prio), so a pair on
netem bypasses its cap's class, as a pair on the userspace wire does: the testbed gives the
pair's netem leaves its caps (the lower of a cap and the state's rate), as it gives a wire.

Every class gets an explicit burst (`htb_burst_bytes`): pyroute2's default, one 1,600-byte
MTU plus rate/HZ (HZ is 10^9 with high-resolution timers), is less than one 9,000-byte frame,
so htb throws away the tokens of every tick it wakes late: a 5 Gbit/s cap gave 2.8 Gbit/s.
A tenth of a millisecond of traffic, one frame at least, gives 4.95 (and 248 of 250 Mbit/s,
990 of 1,000; a millisecond's gave no more): a larger burst would let the start of each
message through at once, faster than the rate (measured on these machines).
"""

from __future__ import annotations

import math
from typing import Any

from injectors.netem import netem_message
from injectors.wire import WireState

__all__ = [
    "CAP_FILTER_PRIO",
    "HTB_ROOT",
    "NETEM_FILTER_PRIO",
    "UNCAPPED_BYTES_S",
    "add_htb_root",
    "add_netem_class",
    "add_peer_class",
    "add_peer_filter",
    "cap_classid",
    "change_peer_class",
    "htb_burst_bytes",
    "netem_classid",
    "netem_handle",
    "set_netem",
]

HTB_ROOT = 0x10000
NETEM_FILTER_PRIO = 1
CAP_FILTER_PRIO = 2
UNCAPPED_BYTES_S = 1 << 40
"""The rate of a netem class (8.8 Tbit/s: htb needs one; the netem leaf carries the cap), and
of a lifted cap's."""
BURST_S = 1e-4
"""A class's burst is this much of its traffic (see the module), and one frame at least."""
MAX_BURST_S = 60.0
"""htb holds a burst as its sending time in 32-bit ticks of 64 ns (275 s at most): a slow
rate's burst is cut to this time of its traffic."""


def htb_burst_bytes(rate_bytes_s: int, mtu_bytes: int) -> int:
    """The burst (and cburst) of an htb class at `rate_bytes_s` whose frames have up to
    `mtu_bytes`: `BURST_S` of traffic, one frame at least, `MAX_BURST_S` at most."""
    burst_bytes = max(mtu_bytes, math.ceil(rate_bytes_s * BURST_S))
    return max(1, min(burst_bytes, math.floor(rate_bytes_s * MAX_BURST_S)))


def _htb_class_options(rate_bytes_s: int, mtu_bytes: int) -> dict[str, int]:
    burst_bytes = htb_burst_bytes(rate_bytes_s, mtu_bytes)
    return {
        "rate": rate_bytes_s,
        "ceil": rate_bytes_s,
        "burst": burst_bytes,
        "cburst": burst_bytes,
        "mtu": mtu_bytes,
    }


def cap_classid(dst: int) -> int:
    """The htb class of a cap on the traffic for host `dst` (1:10 + dst)."""
    return HTB_ROOT + 0x10 + dst


def netem_classid(dst: int) -> int:
    """The htb class whose netem leaf shapes the traffic for host `dst` (1:200 + dst)."""
    return HTB_ROOT + 0x200 + dst


def netem_handle(dst: int) -> int:
    """The handle of the netem qdisc for host `dst` (200 + dst:)."""
    return (0x200 + dst) << 16


def add_peer_filter(
    ipr: Any, index: int, address: str, classid: int, *, prio: int = CAP_FILTER_PRIO
) -> None:
    """A u32 filter on the htb root 1: sending IPv4 packets for `address` to `classid`."""
    octets = [int(x) for x in address.split(".")]
    key = "0x{:02x}{:02x}{:02x}{:02x}/0xffffffff+16".format(*octets)
    ipr.tc(
        "add-filter",
        "u32",
        index,
        parent=HTB_ROOT,
        prio=prio,
        protocol=0x0800,
        target=classid,
        keys=[key],
    )


def add_htb_root(ipr: Any, index: int) -> None:
    """The htb root 1: on interface `index`, unless it has one (unmatched: not shaped)."""
    if not any(q.get("handle") == HTB_ROOT for q in ipr.get_qdiscs(index=index)):
        ipr.tc("add", "htb", index, HTB_ROOT, default=0)


def add_peer_class(
    ipr: Any,
    index: int,
    classid: int,
    rate_bytes_s: int,
    address: str,
    prio: int,
    *,
    mtu_bytes: int,
) -> None:
    """An htb class `classid` at `rate_bytes_s` under the root 1: (made if missing), fed the
    packets for `address` by a filter of `prio`; `mtu_bytes`: the interface's MTU."""
    add_htb_root(ipr, index)
    options = _htb_class_options(rate_bytes_s, mtu_bytes)
    ipr.tc("add-class", "htb", index, classid, parent=HTB_ROOT, **options)
    add_peer_filter(ipr, index, address, classid, prio=prio)


def change_peer_class(
    ipr: Any, index: int, classid: int, rate_bytes_s: int, *, mtu_bytes: int
) -> None:
    """An `add_peer_class` class to a new rate (and burst); its filter stays."""
    options = _htb_class_options(rate_bytes_s, mtu_bytes)
    ipr.tc("change-class", "htb", index, classid, parent=HTB_ROOT, **options)


def add_netem_class(ipr: Any, index: int, dst: int, address: str, *, mtu_bytes: int) -> None:
    """Host `dst`'s netem class (uncapped) and its filter, ahead of any cap's."""
    add_peer_class(
        ipr,
        index,
        netem_classid(dst),
        UNCAPPED_BYTES_S,
        address,
        NETEM_FILTER_PRIO,
        mtu_bytes=mtu_bytes,
    )


def set_netem(ipr: Any, index: int, dst: int, state: WireState) -> None:
    """Host `dst`'s netem leaf to `state` (made on first use; a change keeps its queue)."""
    from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_REPLACE, NLM_F_REQUEST
    from pyroute2.netlink.rtnl import RTM_NEWQDISC

    msg = netem_message(index, netem_handle(dst), netem_classid(dst), state)
    msg["header"]["type"] = RTM_NEWQDISC
    msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE
    ipr.nlm_request_batch([msg])  # its `nlm_request` fails in a namespace (pyroute2 0.9.7)
