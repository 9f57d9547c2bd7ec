"""A sleep that ends on time: `time.sleep` wakes late (about 0.14 ms here, more under load),
and an emulated op or an injected delay must last what it is asked to, not more.

It sleeps until a little before the deadline, then yields the core in short sleeps of zero
length until the deadline has passed; the margin learns the host's wake-up lateness.
"""

from __future__ import annotations

import time

__all__ = ["PreciseSleep"]


class PreciseSleep:
    """One per process (it learns that process's lateness); not shared between threads."""

    def __init__(self, margin_s: float = 0.0003) -> None:
        self.margin_s = margin_s

    def __call__(self, duration_s: float) -> None:
        self.until(time.monotonic() + duration_s)

    def until(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining > self.margin_s:
            asked = remaining - self.margin_s
            before = time.monotonic()
            time.sleep(asked)
            late = time.monotonic() - before - asked
            # Aim the next wake-up that much earlier (a moving estimate, capped at 2 ms).
            self.margin_s = min(max(0.8 * self.margin_s + 0.2 * (late + 0.0001), 0.0001), 0.002)
        while time.monotonic() < deadline:
            time.sleep(0)
