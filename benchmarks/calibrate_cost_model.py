"""Fit the cost model's free parameters on the paper's fault-free times, and print them.

Three parameters, three fault-free targets (docs/paper.md), solved one at a time by
bisection since each target moves with one parameter only:
- mfu: 14B 1F1B, 0.86 s per step (1F1B fuses B and W, so the split overhead does not enter);
- split_backward_overhead: 14B ZB, 0.79 s;
- allreduce_efficiency: 7B DP 2 x PP 4 under ZB, 0.49 s (Fig. 3).
The printed values are frozen by hand into pipeline.cost_model.CALIBRATED; nothing else of
the paper's numbers is fitted.

Run: python benchmarks/calibrate_cost_model.py
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

from harness.experiment import fault_free_step_ms
from pipeline.cost_model import CALIBRATED, Calibration

TARGETS_S = {("gpt2-14b", "1f1b"): 0.86, ("gpt2-14b", "zb"): 0.79, ("gpt2-7b-dp2", "zb"): 0.49}


def step_s(model: str, system: str, calibration: Calibration) -> float:
    return fault_free_step_ms(model, system, calibration) / 1000.0


def bisect(f: Callable[[float], float], goal: float, low: float, high: float) -> float:
    """x in [low, high] with f(x) = goal, for a monotone f."""
    increasing = f(high) > f(low)
    for _ in range(50):
        mid = (low + high) / 2
        if (f(mid) < goal) == increasing:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def _step_with(model: str, system: str, cal: Calibration, field: str, value: float) -> float:
    return step_s(model, system, dataclasses.replace(cal, **{field: value}))


FITS = (  # parameter, the model and system whose fault-free step fixes it, search range
    ("mfu", "gpt2-14b", "1f1b", 0.05, 1.0),
    ("split_backward_overhead", "gpt2-14b", "zb", 0.0, 1.0),
    ("allreduce_efficiency", "gpt2-7b-dp2", "zb", 0.01, 1.0),
)


def calibrate() -> Calibration:
    """Each parameter in turn, the ones after it held at neutral values."""
    cal = dataclasses.replace(CALIBRATED, split_backward_overhead=0.0, allreduce_efficiency=1.0)
    for name, model, system, low, high in FITS:
        step_with = functools.partial(_step_with, model, system, cal, name)
        value = bisect(step_with, TARGETS_S[model, system], low, high)
        cal = dataclasses.replace(cal, **{name: value})
    return cal


if __name__ == "__main__":
    fitted = calibrate()
    print(f"fitted: {fitted}")
    for (model, system), goal in TARGETS_S.items():
        print(
            f"{model} {system}: paper {goal:.3f} s, fitted {step_s(model, system, fitted):.4f} s, "
            f"frozen CALIBRATED {step_s(model, system, CALIBRATED):.4f} s"
        )
