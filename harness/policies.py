"""Policy and system names: what orders the ops, and what the results call a system."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from baselines import one_f_one_b, zb_h1, zb_h2
from pipeline.errors import ConfigError
from pipeline.profile import Profile
from pipeline.schedule import Schedule

__all__ = ["POLICIES", "PlannedSchedule", "plan", "system_name"]


@dataclasses.dataclass(frozen=True, slots=True)
class _Policy:
    build: Callable[[Profile], Schedule]
    method: str


POLICIES: dict[str, _Policy] = {
    "1f1b": _Policy(one_f_one_b, "1f1b (megatron warm-up)"),
    "zb-h1": _Policy(zb_h1, "zb-h1 (handcrafted)"),
    "zb-h2": _Policy(zb_h2, "zb-h2 (handcrafted)"),
}


@dataclasses.dataclass(frozen=True, slots=True)
class PlannedSchedule:
    policy: str
    method: str
    schedule: Schedule
    generation_ms: float


def plan(policy: str, profile: Profile) -> PlannedSchedule:
    """Build the policy's schedule for the profile, timing everything the call does."""
    if policy not in POLICIES:
        raise ConfigError(f"unknown policy {policy!r}; valid policies: {', '.join(POLICIES)}")
    entry = POLICIES[policy]
    start = time.perf_counter()
    schedule = entry.build(profile)
    generation_ms = (time.perf_counter() - start) * 1000.0
    return PlannedSchedule(policy, entry.method, schedule, generation_ms)


def system_name(policy: str, comm: str) -> str:
    """DESIGN.md's system names: a ZB order over `delegated` is `adaptra-cpu`."""
    if comm == "direct":
        return policy
    if comm == "delegated" and policy == "zb":
        return "adaptra-cpu"
    return f"{policy}+{comm}"
