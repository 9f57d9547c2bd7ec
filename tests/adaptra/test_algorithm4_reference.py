"""The generator against a literal Algorithm 3 + 4 written from the paper (docs/paper.md),
with the errata the project adopts: readiness counts from an op's end, the last stage queues
its own B after its F, W waits for its own B, an op not yet ready is skipped, and at equal
times all ends and arrivals come first, then idle stages choose in index order.

The reference steps through integer times (delta = 1 ms, so every time of an integer profile
is on the grid) with sets of ready microbatches, and shares no code with `pipeline.generator`
or `adaptra.policy_timing`: the Fig. 4 fixture was the only oracle of the generator's
decisions not written alongside it.
"""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from adaptra.generator import Policy, generate_policy
from pipeline.errors import ScheduleError
from pipeline.profile import Profile
from pipeline.simulator import simulate

_FREES = {"F": 1.0, "B": -0.5, "W": -0.5}


def _reference(profile: Profile, policy: Policy) -> tuple[list[list[str]], float] | None:
    """Per stage the ops in order, and the iteration's end; None where it stalls."""
    num_stages, num_microbatches = profile.num_stages, profile.num_microbatches
    duration = {"F": profile.t_f_ms, "B": profile.t_b_ms, "W": profile.t_w_ms}
    ready: list[dict[str, set[int]]] = [
        {"F": set(), "B": set(), "W": set()} for _ in range(num_stages)
    ]
    ready[0]["F"] = set(range(num_microbatches))
    arrivals: list[tuple[float, int, str, int]] = []
    running: list[tuple[float, str, int] | None] = [None] * num_stages
    started = [{"F": 0, "B": 0, "W": 0} for _ in range(num_stages)]
    memory = [0.0] * num_stages
    memory_cap = math.inf if profile.mem_limit is None else profile.mem_limit
    orders: list[list[str]] = [[] for _ in range(num_stages)]
    now = 0.0
    while True:
        changed = True
        while changed:  # a zero-time op or transfer ends or arrives at this very step
            changed = False
            for i in range(num_stages):
                job = running[i]
                if job is None or job[0] > now:
                    continue
                _, kind, m = job
                running[i], changed = None, True
                if kind == "F" and i == num_stages - 1:
                    ready[i]["B"].add(m)
                elif kind == "F":
                    arrivals.append((now + profile.transfer_ms(i), i + 1, "F", m))
                elif kind == "B":
                    ready[i]["W"].add(m)
                    if i > 0:
                        arrivals.append((now + profile.transfer_ms(i - 1), i - 1, "B", m))
            for arrival in [a for a in arrivals if a[0] <= now]:
                arrivals.remove(arrival)
                ready[arrival[1]][arrival[2]].add(arrival[3])
                changed = True
            for i in range(num_stages):  # Algorithm 3, idle stages in index order
                if running[i] is not None:
                    continue
                count = started[i]
                cap = policy.in_flight_caps[i]
                may_forward = bool(ready[i]["F"]) and memory[i] + 1 <= memory_cap
                kind: str | None = None
                if count["F"] < policy.warmup[i]:
                    kind = "F" if may_forward else None
                elif ready[i]["B"]:
                    kind = "B"
                elif may_forward and (cap is None or count["F"] - count["B"] < cap):
                    kind = "F"
                elif ready[i]["W"]:
                    kind = "W"
                if kind is None:
                    continue
                m = min(ready[i][kind])
                ready[i][kind].remove(m)
                count[kind] += 1
                memory[i] += _FREES[kind]
                orders[i].append(f"{kind}{m}")
                running[i] = (now + duration[kind][i], kind, m)
                changed = True
        pending = [job[0] for job in running if job is not None] + [a[0] for a in arrivals]
        if not pending:
            break
        now = min(pending)
    if sum(len(order) for order in orders) != 3 * num_stages * num_microbatches:
        return None
    return orders, now


@st.composite
def _cases(draw: st.DrawFn) -> tuple[Profile, Policy]:
    num_stages = draw(st.integers(1, 5))
    num_microbatches = draw(st.integers(num_stages, 3 * num_stages + 2))
    times = st.lists(st.integers(0, 20), min_size=num_stages, max_size=num_stages)
    delays = st.lists(st.integers(0, 60), min_size=num_stages - 1, max_size=num_stages - 1)
    mem_limit = draw(st.one_of(st.none(), st.integers(1, 2 * num_stages)))
    profile = Profile(
        num_stages=num_stages,
        num_microbatches=num_microbatches,
        t_f_ms=tuple(map(float, draw(times))),
        t_b_ms=tuple(map(float, draw(times))),
        t_w_ms=tuple(map(float, draw(times))),
        delay_ms=tuple(map(float, draw(delays))),
        mem_limit=mem_limit,
    )
    x_max = num_microbatches if mem_limit is None else min(num_microbatches, mem_limit)
    counts = st.lists(st.integers(1, x_max), min_size=num_stages, max_size=num_stages)
    caps = st.lists(
        st.one_of(st.none(), st.integers(1, num_microbatches)),
        min_size=num_stages,
        max_size=num_stages,
    )
    return profile, Policy(tuple(draw(counts)), tuple(draw(caps)))


@given(_cases())
def test_the_generator_makes_the_paper_s_decisions(case: tuple[Profile, Policy]) -> None:
    profile, policy = case
    expected = _reference(profile, policy)
    try:
        schedule = generate_policy(profile, policy)
    except ScheduleError:
        assert expected is None
        return
    assert expected is not None
    orders, end_ms = expected
    assert [[str(op) for op in ops] for ops in schedule.stages] == orders
    assert simulate(schedule, profile).iterations[0].end_ms == end_ms


def test_the_reference_gives_the_fig4_numbers(fig4_fixture: dict) -> None:
    """The reference itself, on the paper's example: x = (7, 5, 3, 1), 390 ms fault-free, and
    410/420/430 ms adapted (x_0 = 8, 9, 10) at 20/30/40 ms on link 0-1 (Fig. 5)."""
    base = Profile.from_dict(fig4_fixture["profile"])
    result = _reference(base, Policy.uncapped((7, 5, 3, 1)))
    assert result is not None
    assert result[0] == [list(ops) for ops in fig4_fixture["stages"]]
    assert result[1] == 390.0
    for delay_ms, x_0, end_ms in ((20.0, 8, 410.0), (30.0, 9, 420.0), (40.0, 10, 430.0)):
        adapted = _reference(base.with_delays((delay_ms,)), Policy.uncapped((x_0, 5, 3, 1)))
        assert adapted is not None and adapted[1] == end_ms
