"""CI gate for the emulated runtime: its iteration time against the calibrated simulator, over
direct sends and over the delegates.

Run: python benchmarks/gate_emulated.py [--band 0.95 1.20]

First this host's runtime costs are measured (pipeline.runtime.calibrate: microbenchmarks,
not these schedules; with the delegated path's costs; no DP ring's, which these runs have none
of), with 2 ms ops: the band allows a slower run than predicted more than a faster one, and
calibrated with 10 ms ops (the benchmark's choice, BENCHMARKS.md) the prediction followed the
load the test suite leaves behind: this gate read 1.022, 1.024, 0.980 and 0.966 on
2026-12-03, against 1.039, 1.039 and 1.050 with 2 ms ops. Then, on S=4, N=12, 10 ms ops,
1 MiB messages, 5 measured iterations after a warm-up in one pool each:
- direct: 1F1B, no delay (where the runtime's own costs weigh most);
- delegated: ZB-H2 with every link direction over 3 delegates each, 30 ms on link 0-1 (the
  delegates carry the delay; Adaptra-CPU's case).
Each fidelity (median emulated / calibrated simulated) must lie in the CI gate's band
(docs/design.md: the fidelity band). Exits 1 with the figures otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics

from adaptra.transport import Delegates
from baselines import one_f_one_b, zb_h2
from pipeline.host_costs import HostCosts
from pipeline.metrics import compute_metrics
from pipeline.profile import Profile
from pipeline.runtime import IterationConfig, WorkerPool
from pipeline.runtime.calibrate import measure_host_costs
from pipeline.schedule import Schedule
from pipeline.signals import run_script
from pipeline.simulator import CommMode, simulate

GATE_CALIBRATION_OP_MS = 2.0


@dataclasses.dataclass(frozen=True)
class _Case:
    name: str
    profile: Profile
    schedule: Schedule
    comm: CommMode
    delegates: Delegates | None = None

    def predicted_ms(self, host: HostCosts) -> float:
        timeline = simulate(self.schedule, self.profile, self.comm, host=host)
        return compute_metrics(timeline).iteration_time_ms

    def measured_ms(self) -> float:
        """The median of 5 iterations after a warm-up, in one pool."""
        with WorkerPool(
            self.profile.num_stages,
            timeout_s=60,
            delegates=self.delegates,
            num_delegates=self.profile.delegate_count() if self.delegates else 0,
        ) as pool:
            times = [
                compute_metrics(
                    pool.run_iteration(
                        IterationConfig(i, self.schedule, self.profile, comm=self.comm.value)
                    ),
                    i,
                ).iteration_time_ms
                for i in range(6)
            ]
        return statistics.median(times[1:])


def _cases() -> list[_Case]:
    direct = Profile.uniform(4, 12, 10, 10, 10, message_bytes=1 << 20)
    delegated = Profile.uniform(
        4, 12, 10, 10, 10, message_bytes=1 << 20, num_delegates=3
    ).with_delays([30.0, 0.0, 0.0])
    return [
        _Case("1f1b direct, no delay", direct, one_f_one_b(direct), CommMode.DIRECT),
        _Case(
            "zb-h2 delegated, 30 ms on 0-1",
            delegated,
            zb_h2(delegated),
            CommMode.DELEGATED,
            Delegates(),
        ),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--band", type=float, nargs=2, default=(0.95, 1.20))
    args = parser.parse_args()
    low, high = args.band
    host = measure_host_costs(  # no DP ring here
        op_ms=GATE_CALIBRATION_OP_MS, dp_ring=False, delegates=Delegates()
    )
    ok = True
    for case in _cases():
        predicted, measured = case.predicted_ms(host), case.measured_ms()
        ratio = measured / predicted
        verdict = "ok" if low <= ratio <= high else "FAILED"
        ok = ok and verdict == "ok"
        shown = f"{ratio:.3f}"
        if verdict == "FAILED" and low <= float(shown) <= high:  # past the band by < 0.0005
            shown = f"{ratio:.6f}"
        print(
            f"emulated/calibrated sim gate ({case.name}, 1 MiB; load "
            f"{os.getloadavg()[0]:.2f}): {measured:.1f} ms / {predicted:.1f} ms = {shown} "
            f"(allowed {low:.2f}-{high:.2f}): {verdict}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    run_script(main)
