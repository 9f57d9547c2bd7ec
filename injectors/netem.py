"""The kernel netem qdisc for one direction of a host pair's `WireState` (pure: no socket).

netem implements a fixed delay with per-packet uniform jitter (clipped at 0), a random loss,
a rate and "down" (100 % loss): `netem_request` gives the options for those in pyroute2's
terms (its netem encoder's keyword arguments), and `netem_message` the RTM_NEWQDISC message
that carries them. The testbed sends that message itself: pyroute2's `tc("replace", "netem",
rate=...)` also puts the rate in a top-level TCA_RATE, which it cannot encode.

netem cannot express the rest of the fault model, and `netem_cannot` says why for a state
that needs it: a normal delay redrawn every U[lo, hi] ms (netem draws per packet and holds
no draw), a one-off stall (netem holds no direction once), and values beyond its 32-bit
fields. Those stay on the userspace wire (injectors.wire), and so does a change scheduled
for a later time (`Testbed.set_wire`'s `at`: a qdisc change takes effect when it is made;
nothing in netem waits for a time).

Where both serve, they differ in two ways: netem's jitter and loss are drawn by the kernel
(the same distributions, not the state's seeded draws), and netem's jitter without a rate
may reorder a direction's packets (its queue is sorted by send time) where the wire keeps
their order.
"""

from __future__ import annotations

from typing import Any

from injectors.wire import WireState
from pipeline.errors import ConfigError

__all__ = [
    "NETEM_LIMIT_PACKETS",
    "NETEM_MAX_RATE_BIT_S",
    "NETEM_TICK_NS",
    "netem_cannot",
    "netem_message",
    "netem_request",
]

NETEM_TICK_NS = 64
"""The unit of netem's 32-bit latency and jitter: one psched tick (PSCHED_SHIFT 6)."""
NETEM_LIMIT_PACKETS = 100_000
"""netem's queue length (its default is 1000): the wire drops nothing, so neither should a
delayed fast link."""
_U32_MAX = (1 << 32) - 1
_MAX_DELAY_US = _U32_MAX * NETEM_TICK_NS // 1000
"""About 274.9 s: netem's 32-bit latency in ticks (pyroute2 encodes no TCA_NETEM_LATENCY64)."""
_MAX_JITTER_US = ((1 << 31) - 1) // 1000
"""About 2147 ms: the kernel clips netem's jitter at 2^31 - 1 ns."""
_MAX_RATE_BYTES_S = _U32_MAX
"""About 34.4 Gbit/s: netem's 32-bit byte rate (pyroute2 encodes no TCA_NETEM_RATE64)."""
NETEM_MAX_RATE_BIT_S = _MAX_RATE_BYTES_S * 8
"""The fastest rate netem holds (bit/s)."""


def netem_cannot(state: WireState) -> str | None:
    """Why netem cannot express `state` (None: it can)."""
    if state.down:
        return None  # nothing passes: the rest of the state never acts
    if state.normal_ms is not None:
        return (
            "a normal delay redrawn every U[lo, hi] ms: netem draws a delay per packet "
            "and holds no draw for a while"
        )
    if state.stall_ms:
        return "a one-off stall: netem holds no direction once"
    if state.delay_ms * 1000 > _MAX_DELAY_US:  # a bound on the rounded µs pyroute2 gets
        return f"a delay over {_MAX_DELAY_US / 1e6:.1f} s: netem's latency is 32 bits of ticks"
    if state.jitter_ms * 1000 > _MAX_JITTER_US:
        return f"a jitter over {_MAX_JITTER_US / 1e3:.0f} ms: the kernel clips netem's there"
    if state.rate_bit_s is not None and state.rate_bit_s > NETEM_MAX_RATE_BIT_S:
        return f"a cap over {NETEM_MAX_RATE_BIT_S / 1e9:.1f} Gbit/s: netem's byte rate is 32 bits"
    return None


def netem_request(state: WireState) -> dict[str, int | float]:
    """pyroute2's netem keyword arguments for `state`: delay and jitter in whole µs (what
    pyroute2 takes), loss in %, rate in bytes/s (0: none; always sent, as netem keeps the
    rate a change leaves out) and the queue's limit in packets."""
    why = netem_cannot(state)
    if why is not None:
        raise ConfigError(f"netem cannot express {state}: {why}")
    if state.down:
        return {"delay": 0, "jitter": 0, "loss": 100.0, "rate": 0, "limit": NETEM_LIMIT_PACKETS}
    rate_bytes_s = 0 if state.rate_bit_s is None else max(1, round(state.rate_bit_s / 8))
    return {
        "delay": round(state.delay_ms * 1000),
        "jitter": round(state.jitter_ms * 1000),
        "loss": state.loss_pct,
        "rate": rate_bytes_s,
        "limit": NETEM_LIMIT_PACKETS,
    }


def netem_message(index: int, handle: int, parent: int, state: WireState) -> Any:
    """The tcmsg of a netem qdisc `handle` under `parent` on interface `index` in `state`
    (its options from pyroute2's netem encoder: latency and jitter in ticks, loss as a
    32-bit fraction, TCA_NETEM_RATE in bytes/s)."""
    from pyroute2.netlink.rtnl.tcmsg import sched_netem, tcmsg

    msg = tcmsg()
    msg["family"], msg["index"], msg["handle"], msg["parent"] = 0, index, handle, parent
    options = sched_netem.get_parameters(netem_request(state))
    msg["attrs"] = [["TCA_KIND", "netem"], ["TCA_OPTIONS", options]]
    return msg
