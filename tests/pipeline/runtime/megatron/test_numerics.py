"""A pipelined megatron run trains exactly like one process: same losses, same gradients.

A tiny GPT (6 layers, hidden 64) for 3 iterations under 1F1B, ZB-H1, ZB-H2 and a deep
warm-up schedule, at 2 and 4 stages and at PP 2 x DP 2, against one process accumulating the
same microbatches in the same order with torch's ordinary backward. Stage weights come from
the reference's state dict; the tied embedding's gradients are compared after the
embedding-group all-reduce, every gradient after the DP all-reduce.
"""

import functools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from adaptra.generator import generate_schedule
from baselines import one_f_one_b, zb_h1, zb_h2
from pipeline.profile import Profile
from pipeline.runtime import IterationConfig, WorkerPool
from pipeline.runtime.megatron import MegatronCompute, get_preset
from pipeline.runtime.megatron.reference import (
    ReferenceIteration,
    build_whole_model,
    single_process_megatron,
    train_reference,
)
from pipeline.schedule import Schedule

pytestmark = pytest.mark.multiprocess

NUM_ITERATIONS, SEED, LR = 3, 0, 0.5


def _reference(tmp: Path, num_microbatches: int, num_replicas: int) -> list[ReferenceIteration]:
    preset = get_preset("tiny")
    with single_process_megatron():
        model = build_whole_model(preset, SEED)
        torch.save(model.state_dict(), tmp / "init.pt")  # the same init for any R, N
        return train_reference(
            model,
            preset,
            num_microbatches=num_microbatches,
            num_replicas=num_replicas,
            num_iterations=NUM_ITERATIONS,
            seed=SEED,
            lr=LR,
        )


def _assert_close(got: np.ndarray, expected: np.ndarray, where: str) -> None:
    try:
        torch.testing.assert_close(
            torch.from_numpy(got), torch.from_numpy(expected), rtol=1e-5, atol=1e-6
        )
    except AssertionError as err:
        raise AssertionError(f"{where}: {err}") from None


def _schedules(profile: Profile, fig4: dict[str, Any]) -> dict[str, Schedule]:
    if profile.num_stages == 4:
        warmup = Schedule.from_dict(fig4)  # x = [7, 5, 3, 1], N = 12
        assert warmup.warmup_counts() == (7, 5, 3, 1)
    else:
        warmup = generate_schedule(profile, [3, 1])
    return {
        "1f1b": one_f_one_b(profile),
        "zb-h1": zb_h1(profile),
        "zb-h2": zb_h2(profile),
        f"warmup{list(warmup.warmup_counts())}": warmup,
    }


@pytest.mark.parametrize(
    ("num_stages", "num_replicas", "num_microbatches"),
    [(2, 1, 4), (4, 1, 12), (2, 2, 4)],
    ids=["pp2", "pp4", "pp2xdp2"],
)
def test_pipelined_training_equals_one_process(
    tmp_path: Path,
    fig4_fixture: dict[str, Any],
    num_stages: int,
    num_replicas: int,
    num_microbatches: int,
) -> None:
    reference = _reference(tmp_path, num_microbatches, num_replicas)
    profile = Profile.uniform(num_stages, num_microbatches, 1, 1, 1)
    factory = functools.partial(
        MegatronCompute, "tiny", seed=SEED, lr=LR, init_state=str(tmp_path / "init.pt")
    )
    with WorkerPool(num_stages, num_replicas, compute_factory=factory, timeout_s=60) as pool:
        for name, schedule in _schedules(profile, fig4_fixture).items():
            losses = []
            for it in range(NUM_ITERATIONS):
                pool.run_iteration(IterationConfig(it, schedule, profile, collect_grads=True))
                results = pool.last_results
                last = [r for r in results if r.stage == num_stages - 1]
                for r in last:
                    assert r.step_output.loss is not None
                    torch.testing.assert_close(
                        r.step_output.loss, reference[it].loss, rtol=1e-5, atol=1e-6
                    )
                losses.append(last[0].step_output.loss)
                seen: set[str] = set()
                for r in results:
                    assert r.step_output.grads is not None
                    for param, grad in r.step_output.grads.items():
                        where = f"{name}, iteration {it}, rank {r.rank}, {param}"
                        _assert_close(grad, reference[it].grads[param], where)
                    seen |= r.step_output.grads.keys()
                assert seen == reference[it].grads.keys(), name  # every parameter compared
            assert losses[-1] < losses[0], f"{name}: the loss did not fall: {losses}"
            assert np.isfinite(losses).all()
