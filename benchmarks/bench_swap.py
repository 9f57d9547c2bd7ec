"""What a rank swap costs in the runtimes: the model state moved and the swap's time.

PP 2 x DP 2 (4 workers), 1F1B, 4 microbatches; the placement `dp_pair_onto_pp(dp0:0-1)`
from measured iteration 2 on (worker 2, stage 0 of replica 1, and worker 1, stage 1 of
replica 0, trade places). Per configuration: the state each mover sent, the swap's time
(from its start to its end on the slower mover: delegates, build, state exchange,
then the iteration's set-up under the new position: receives, the DP ring's buffers,
`begin_iteration`),
and the swap iteration's time against the median of the others. megatron: the tiny and
small GPT presets over direct (the state over gloo), the small one over delegates too (the
state over a connection of the movers' own, `adaptra.transport.state_wire`); emulated: no
state, over direct and over delegates (whose link directions with a new peer are rewired:
running delegates re-pointed, or new ones), also at the Fig. 18 test's shape (PP 4 x DP 2,
8 microbatches, 8 delegates per link direction and side; the same pair of workers trades
places).

`--testbed` (root: the namespace testbed, `--inject network`): emulated over delegates at the
small shape, healthy and with host 1's rnic0 down from measured iteration 1 (host 1 plays
stage 1 of replica 0: a mover), each a run of its own: a swap next to a failed NIC costs what
a healthy one does (its new pairs start on the first NIC up at both hosts; they tried the far
rnic0 first and waited the 5 s connect timeout).

Run: python benchmarks/bench_swap.py [--repeats 3] [--backend emulated | --testbed]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics

from baselines import one_f_one_b
from harness.runner import RuntimeEngines, fixed_plan, run_configuration
from injectors.fault_files import parse_yaml
from pipeline.engines import Plan
from pipeline.faults import NO_FAULTS
from pipeline.profile import Profile
from pipeline.signals import run_script
from pipeline.simulator import CommMode
from pipeline.timeline import Timeline
from pipeline.topology import Link, Topology

SWAP_AT, NUM_ITERATIONS = 2, 5


@dataclasses.dataclass
class _SwapAt:
    profile: Profile
    comm: CommMode
    name: str = "swap"
    fixed: Plan = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.fixed = fixed_plan(one_f_one_b(self.profile), self.profile, self.comm).fixed

    def plan(self, iteration: int) -> Plan:
        topology = Topology(self.profile.num_stages, self.profile.num_replicas)
        swapped = topology.dp_pair_onto_pp(Link.parse("dp0:0-1"))
        return dataclasses.replace(self.fixed, topology=swapped if iteration > SWAP_AT else None)

    def observe(self, iteration: int, timeline: Timeline) -> None:
        pass

    def restarted(self, iteration: int, *, stragglers: bool, at_ms: float = math.inf) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--backend", choices=("megatron", "emulated"), help="only this backend's rows"
    )
    parser.add_argument(
        "--testbed", action="store_true", help="emulated on the namespace testbed (root)"
    )
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.testbed:
        _testbed(args.repeats)
        return
    print("| backend | model / comm | PP x DP, delegates | state sent per mover (MiB) | swap ms "
          "| swap iteration ms | other iterations ms |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    small = Profile.uniform(2, 4, 2, 2, 2, num_replicas=2, num_delegates=2)
    fig18 = Profile.uniform(4, 8, 2, 2, 2, num_replicas=2, num_delegates=8)
    settings = [
        ("megatron", "tiny", CommMode.DIRECT, small),
        ("megatron", "small", CommMode.DIRECT, small),
        ("megatron", "small", CommMode.DELEGATED, small),
        ("emulated", None, CommMode.DIRECT, small),
        ("emulated", None, CommMode.DELEGATED, small),
        ("emulated", None, CommMode.DELEGATED, fig18),
    ]
    with RuntimeEngines() as engines:
        for backend, model, comm, profile in settings:
            if args.backend not in (None, backend):
                continue
            if backend == "emulated":
                profile = dataclasses.replace(profile, message_bytes=1 << 16)
            swap_ms, swap_iteration_ms, others_ms, sent = [], [], [], set()
            for _ in range(args.repeats):
                run = run_configuration(
                    _SwapAt(profile, comm),
                    backend=backend,
                    model=model,
                    num_iterations=NUM_ITERATIONS,
                    engines=engines,
                    delegated=comm is CommMode.DELEGATED,
                )
                assert run.timeline is not None
                # (Iteration 0 of a repeat moves the pool back to the default placement.)
                swaps = [r for r in run.timeline.swaps if r.iteration == 1 + SWAP_AT]
                assert len(swaps) == 2
                sent |= {r.num_bytes for r in swaps}
                swap_ms.append(max(r.end_ms for r in swaps) - min(r.start_ms for r in swaps))
                times = run.wall_times_ms
                swap_iteration_ms.append(times[SWAP_AT])
                others_ms += [t for k, t in enumerate(times) if k != SWAP_AT]
            mib = ", ".join(f"{b / (1 << 20):.3f}" for b in sorted(sent))
            shape = f"{profile.num_stages} x {profile.num_replicas}, {profile.num_delegates}"
            print(
                f"| {backend} | {model or 'none'} / {comm.value} | {shape} | {mib} | "
                f"{statistics.median(swap_ms):.1f} | {statistics.median(swap_iteration_ms):.1f} | "
                f"{statistics.median(others_ms):.1f} |",
                flush=True,
            )


def _testbed(repeats: int) -> None:
    """The `--testbed` rows: a fresh testbed per run (its NIC down goes with it)."""
    print("| injection | faults | swap ms | swap iteration ms | other iterations ms |")
    print("|---|---|---|---|---|")
    profile = Profile.uniform(2, 4, 2, 2, 2, num_replicas=2, num_delegates=2, message_bytes=1 << 16)
    nic_down = parse_yaml('[{start_iteration: 1, nic: "host1:rnic0", down: true}]')
    for name, faults in (("none", NO_FAULTS), ("host1:rnic0 down from 1", nic_down)):
        swap_ms, swap_iteration_ms, others_ms = [], [], []
        for _ in range(repeats):
            run = run_configuration(
                _SwapAt(profile, CommMode.DELEGATED),
                backend="emulated",
                num_iterations=NUM_ITERATIONS,
                faults=faults,
                injection="network",
                delegated=True,
            )
            assert run.timeline is not None and run.restarts == 0, run.restart_causes
            swaps = [r for r in run.timeline.swaps if r.iteration == 1 + SWAP_AT]
            assert len(swaps) == 2
            swap_ms.append(max(r.end_ms for r in swaps) - min(r.start_ms for r in swaps))
            times = run.wall_times_ms
            swap_iteration_ms.append(times[SWAP_AT])
            others_ms += [t for k, t in enumerate(times) if k != SWAP_AT]
        print(
            f"| network | {name} | {statistics.median(swap_ms):.1f} | "
            f"{statistics.median(swap_iteration_ms):.1f} | {statistics.median(others_ms):.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    run_script(main)
