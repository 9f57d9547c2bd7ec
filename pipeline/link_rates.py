"""A profile's own link rates, and what a bandwidth cap adds to a message on top of them.

A profile gives a PP link `link_bandwidth_gbps` and a DP ring link `dp_bandwidth_gbps` (else
the PP one); the simulator times a message's bytes at that rate, and the testbed caps each
host pair at it. A fault's cap is a rate too: where it is slower than the link's own, it
replaces it (the lower of the two holds, as on the testbed, where the pair's htb cap and the
wire's cap both apply), so it adds bytes/cap - bytes/rate to a message, and nothing where the
link is slower already. The fault model asks `LinkRates.cap_ms` for every message, the
simulator's and a runtime hook's alike (both get the same `LinkRates` with the faults: the
profile's, `Profile.link_rates`).
"""

from __future__ import annotations

import dataclasses
import math

from pipeline.topology import Link

__all__ = ["NO_RATES", "LinkRates"]


@dataclasses.dataclass(frozen=True, slots=True)
class LinkRates:
    """The rate of every PP and every DP ring link, Gbit/s (None: unlimited)."""

    pp_gbit_s: float | None = None
    dp_gbit_s: float | None = None
    """A DP ring link's (a profile's `dp_bandwidth_gbps`, else its `link_bandwidth_gbps`)."""

    def of(self, link: Link) -> float | None:
        """`link`'s own rate, Gbit/s (None: unlimited)."""
        return self.pp_gbit_s if link.is_pp else self.dp_gbit_s

    def cap_ms(self, link: Link, num_bytes: int, cap_gbit_s: float) -> float:
        """What a cap of `cap_gbit_s` on `link` adds to a message of `num_bytes`, ms: its
        bytes at the cap's rate less its bytes at the link's own, where the cap is slower."""
        own_gbit_s = self.of(link)
        if own_gbit_s is not None and own_gbit_s <= cap_gbit_s:
            return 0.0
        own_ms = 0.0 if own_gbit_s is None else num_bytes * 8 / (own_gbit_s * 1e6)
        return max(0.0, num_bytes * 8 / (cap_gbit_s * 1e6) - own_ms)

    def __post_init__(self) -> None:
        for rate in (self.pp_gbit_s, self.dp_gbit_s):
            if rate is not None and not (math.isfinite(rate) and rate > 0):
                raise ValueError(f"a link rate is finite and > 0 Gbit/s (or None): {self}")


NO_RATES = LinkRates()
"""Every link unlimited: a cap adds its bytes at its rate in full."""
