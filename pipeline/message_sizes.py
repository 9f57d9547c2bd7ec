"""Message sizes a host treats alike: what is compared with what where a link's time is
judged against other links' (Adaptra's detector keeps a floor per size class, Falcon
compares a link with the links of its size class).

What a host adds to a message grows with its size: a DP ring's chunk lags about 0.3 ms at
125 kB and 8.5 ms at 40 MB alone, 25 ms with two rings (docs/design.md, the calibration
file's `ring_lag_ms_by_rings`; 0.8 ms per MB at 40 MB chunks is the tests' ring host). At
the sizes that cost most it grows about in proportion, at most 1.3 x as fast (a healthy
ring's emulated step from 25 to 40 MB chunks, 1.6 x the bytes: 1.7 x the time alone, 1.8 x
with two rings; BENCHMARKS.md, "The DP ring's step by chunk size"). Sizes that are exactly
equal are rare where they come from real gradients (megatron tiny's two stages at DP 2:
chunks of 318,336 and 316,544 B, 0.6 % apart), and a link alone in its size has nothing to
be compared with. So sizes within `SIZE_TOLERANCE` (5 %) of a class's smallest are one
class: a healthy host's cost differs across a class by about 7 % at most, under Falcon's
1.1 x threshold, and by about 2 ms at 40 MB chunks and 0.8 ms per MB, under the detector's
4 ms recovery and 8 ms onset.

Classes are formed from the sorted sizes: a class starts at its smallest size and takes
every size up to (1 + tolerance) x it (not a chain of neighbours, which could span any
range in steps of 5 %); the next size starts the next class. The same set of sizes gives
the same classes in any order.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["SIZE_TOLERANCE", "size_classes"]

SIZE_TOLERANCE = 0.05
"""Sizes within this fraction above a class's smallest are in that class (the module)."""


def size_classes(sizes: Iterable[int], tolerance: float = SIZE_TOLERANCE) -> dict[int, int]:
    """Each of `sizes` (bytes, >= 0) mapped to its class: the smallest size in it."""
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, not {tolerance}")
    classes: dict[int, int] = {}
    smallest = -1
    for size in sorted(set(sizes)):
        if smallest < 0 or size > smallest * (1 + tolerance):
            smallest = size
        classes[size] = smallest
    return classes
