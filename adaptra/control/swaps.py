"""Adaptra and a slow DP ring link: it moves the link onto a PP edge, where its schedule and
delegates absorb it (the paper's section 5: a DP straggler costs every bucket of the
all-reduce, a PP one only what the schedule cannot hide).

A DP ring link the detector believes slow joins two hosts under the placement in force; the
next iteration runs a placement where those two hosts are PP neighbours instead
(`Topology.dp_pair_onto_pp`, the rank swap both Adaptra and Falcon use): the slow pair then
carries a PP link of the lower replica, which the detector sees slow from the iteration
after, and the controller plans for like any slow PP link. A swap moves model state, so it
waits for the same DP link to be the slowest believed in two iterations in a row (one
iteration's belief, e.g. as a fault starts or ends mid-iteration, or in the first iteration
under a new placement, does not move anything); at most one swap per iteration; the
placement stays after the link recovers (swapping back costs another state transfer and
gains nothing while the pair is a PP edge). A swapped DP link is not moved again, nor one on
a host a swap moved, while that slowness lasts: a link still believed slow after its swap,
or a slow one on a host moved already, has a slowness that did not stay with the pair (a
delay on the logical link; a slow NIC, which every placement keeps on some ring), and
another swap would only move it around, a state transfer every other iteration for nothing.
The slowness has ended with the first belief that calls no link slow that has the moved link
itself (a DP link: the logical link, wherever it runs now) or an end on the moved host (under
the placement that iteration ran; a PP link named for every replica, "1-2", has an end on
each replica's hosts of it): from then on the link and the host are like any other, and a
later slowness on them (another fault) is moved as a new one is. A slowness that stayed with
the pair keeps its hosts held while the detector believes their PP link slow (the detector
of `adaptra-cpu`, which reads only the DP ring's messages, never sees it there, and releases
them after the swap's iteration: no ring crosses the pair then).
"""

from __future__ import annotations

from adaptra.control.detector import Belief
from pipeline.topology import Link, LinkKind, Topology

__all__ = ["DpSwaps"]


class DpSwaps:
    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        """The placement the next iteration runs."""
        self.num_swaps = 0
        self._slowest: Link | None = None
        """The slowest DP link of the last belief (under the placement in force)."""
        self._moved: set[Link] = set()
        """The DP links swapped onto PP edges whose slowness has not ended (not again)."""
        self._moved_hosts: set[int] = set()
        """The hosts of the pairs those swaps moved, while their slowness has not ended."""

    def update(self, belief: Belief) -> None:
        slow = [Link.parse(name) for name in belief.slow]
        self._release(slow)
        slow_dp = [link for link in slow if link.kind is LinkKind.DP]
        if not slow_dp or self.topology.num_stages < 2:
            self._slowest = None
            return
        slowest = max(slow_dp, key=lambda link: (belief.extra_ms[str(link)], link))
        hosts = set(self.topology.hosts_of(slowest))
        if slowest in self._moved or hosts & self._moved_hosts:  # not the pair's slowness
            self._slowest = None
            return
        if slowest != self._slowest:
            self._slowest = slowest
            return
        self.topology = self.topology.dp_pair_onto_pp(slowest)
        self._moved.add(slowest)
        self._moved_hosts |= hosts
        self.num_swaps += 1
        self._slowest = None

    def _release(self, slow: list[Link]) -> None:
        """Forget the moved links and hosts that no link of `slow` (a belief's, under the
        placement in force) is or has an end on: their slowness has ended."""
        touched: set[int] = set()
        for link in slow:
            replicas = range(self.topology.num_replicas) if link.is_pp else (0,)
            for replica in replicas:
                touched.update(self.topology.hosts_of(link.in_replica(replica)))
        self._moved &= set(slow)
        self._moved_hosts &= touched

    @property
    def swapped(self) -> Topology | None:
        """The placement, once it is not the default one (None before any swap)."""
        return self.topology if self.num_swaps else None
