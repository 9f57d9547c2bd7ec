"""Which terms of a profile's link model an engine imposes on every message.

A profile models a link as latency plus bytes over bandwidth (`Profile.wire_ms`,
`Profile.dp_wire_ms`), and a delegated message as going at a delegate's own rate
(`Profile.delegated_wire_ms`). The simulator times every message by that model. A runtime
whose faults come from its fault hook (`--inject hook`) imposes none of it: the hook sleeps
the delays and faults only, and a message takes what the host's transport takes. The
namespace testbed (`--inject network`) caps each host pair at the profile's bandwidths (htb)
but adds no latency and leaves a delegate's rate to the delegate. Each engine declares its
terms (`pipeline.engines.Capabilities.link_terms`); whatever reads measured message times
against the model (a detector) subtracts those terms only: a term the engine does not
impose is not in the measurement, and subtracting it calls a healthy link slow or fast.
"""

from __future__ import annotations

import dataclasses

from pipeline.profile import Profile

__all__ = ["ALL_LINK_TERMS", "NO_LINK_TERMS", "LinkTerms"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class LinkTerms:
    """The link-model terms an engine imposes on every message, beyond the delays."""

    latency: bool
    """`Profile.link_latency_ms` on every PP and DP message."""
    bandwidth: bool
    """A message's bytes over its link's bandwidth (`link_bandwidth_gbps`; a DP ring link's
    `dp_bandwidth_gbps`)."""
    delegate_rate: bool
    """A delegated message's bytes over `Profile.delegate_gbps` (a delegate's own rate)
    instead of the link's."""

    def kept_in(self, profile: Profile) -> Profile:
        """`profile` whose link model holds these terms only (no latency, unlimited
        bandwidth, delegates at the link's rate where a term is not imposed): its
        `wire_ms`, `dp_wire_ms` and `delegated_wire_ms` are what the engine imposes."""
        return dataclasses.replace(
            profile,
            link_latency_ms=profile.link_latency_ms if self.latency else 0.0,
            link_bandwidth_gbps=profile.link_bandwidth_gbps if self.bandwidth else None,
            dp_bandwidth_gbps=profile.dp_bandwidth_gbps if self.bandwidth else None,
            delegate_gbps=profile.delegate_gbps if self.delegate_rate else None,
        )

    def __str__(self) -> str:
        terms = [
            name
            for name, imposed in (
                ("latency", self.latency),
                ("bandwidth", self.bandwidth),
                ("delegate rate", self.delegate_rate),
            )
            if imposed
        ]
        return ", ".join(terms) or "no link-model terms"


ALL_LINK_TERMS = LinkTerms(latency=True, bandwidth=True, delegate_rate=True)
"""The simulator's: it times every message by the whole model."""
NO_LINK_TERMS = LinkTerms(latency=False, bandwidth=False, delegate_rate=False)
"""A runtime's whose fault hook injects (it sleeps the delays and faults only)."""
