"""The paper's Fig. 18 in emulated runs: a slow DP ring link at PP 4 x DP 2 (8 workers),
10, 20 then 30 ms, under ZB (no mitigation), Falcon (its ladder up to the rank swap),
Adaptra-CPU (the swap, then ZB over the delegates) and Adaptra (the swap, then its plan for
the PP delay over the delegates). Each system finds the link from its own measurements."""

from __future__ import annotations

import statistics

import pytest

from harness.policies import SYSTEMS, system_controller
from harness.runner import RuntimeEngines, run_configuration
from injectors.fault_files import parse_yaml
from pipeline.profile import Profile

pytestmark = pytest.mark.multiprocess

PROFILE = Profile.uniform(
    4, 8, 2, 2, 2, message_bytes=4096, num_replicas=2,
    allreduce_bytes=1_500_000, dp_bucket_bytes=125_000,
)  # fmt: skip
"""Each stage's ring: 12 buckets, 24 chunks of 62.5 kB each way, against 16 PP messages per
link direction: a slow DP link costs more than the same delay on a PP link, as at 7B."""

PHASES = ((10, 2, 11), (20, 11, 17), (30, 17, 23))
"""(delay ms, first, end) measured iterations on stage 1's ring link dp1:0-1. The 10 ms phase
is the longest: the swap comes in its first four iterations, and its last five steps then
come after it, once the delegates and Adaptra's plan have settled; in the later phases the
last five follow the first, in which Adaptra sees the new delay."""

FAULTS = parse_yaml(
    "["
    + ", ".join(
        f'{{start_iteration: {a}, end_iteration: {b}, links: ["dp1:0-1"], delay_ms: {d}}}'
        for d, a, b in PHASES
    )
    + "]"
)


def phase_medians(times_ms: tuple[float, ...]) -> list[float]:
    """The median of each phase's last five iterations (a late swap's one long iteration
    among them moves no median)."""
    return [statistics.median(times_ms[end - 5 : end]) for _, _, end in PHASES]


def test_fig18_order_in_emulated_runs() -> None:
    """ZB > Falcon > both Adaptras in the median step (pipeline and DP ring) of each phase's
    last five iterations, after the mitigations (each system swaps once, in the 10 ms phase,
    and Adaptra has planned for each new delay); Adaptra-CPU > Adaptra in the median
    pipeline time at every delay, and in the median step at 30 ms; the cost of the delay from
    10 to 30 ms the smallest for Adaptra, then Adaptra-CPU, Falcon, ZB; the swaps are in the
    records.

    Why the two Adaptras' steps are compared at 30 ms only: after the swap both run the same
    ring, over the same delegates, with no slow DP link, so what tells them apart is the
    pipeline (medians at 10 ms: 75-82 ms against 96-102, alone and beside two busy
    processes). The ring after it takes 20-64 ms on 2 cores, so at 10 ms Adaptra's median
    step has come out above Adaptra-CPU's alone here (129 against 124 ms) and in CI, while
    the median of 3 runs in bench_fig18 keeps the paper's order at every delay
    (BENCHMARKS.md, Fig. 18)."""
    medians: dict[str, list[float]] = {}
    pipelines: dict[str, list[float]] = {}
    with RuntimeEngines() as engines:  # two pools: without delegates, with them
        for system in ("zb", "falcon", "adaptra-cpu", "adaptra"):
            run = run_configuration(
                system_controller(system, PROFILE, FAULTS),
                backend="emulated",
                num_iterations=PHASES[-1][2],
                faults=FAULTS,
                engines=engines,
                delegated=SYSTEMS[system][1] == "delegated",
            )
            medians[system] = phase_medians(run.wall_times_ms)
            pipelines[system] = phase_medians(run.iteration_times_ms)
            assert run.timeline is not None
            # (A pool that the run before left swapped moves back at iteration 0.)
            swaps = [r for r in run.timeline.swaps if r.iteration > 0]
            if system == "zb":
                assert swaps == []
            else:  # one swap, of two workers, while the link is at 10 ms
                assert len(swaps) == 2 and len({r.iteration for r in swaps}) == 1
                assert 1 + 2 < swaps[0].iteration < 1 + 8
    for phase, (delay_ms, _, _) in enumerate(PHASES):
        zb, falcon, cpu, adaptra = (medians[s][phase] for s in medians)
        assert zb > falcon > max(cpu, adaptra), (delay_ms, medians)
        assert pipelines["adaptra-cpu"][phase] > pipelines["adaptra"][phase], (delay_ms, pipelines)
    assert medians["adaptra-cpu"][-1] > medians["adaptra"][-1], medians
    growth = {system: steps[-1] - steps[0] for system, steps in medians.items()}
    assert growth["adaptra"] < growth["adaptra-cpu"] < growth["falcon"] < growth["zb"], medians
