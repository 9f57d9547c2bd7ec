"""A pipelined megatron run trains exactly like one process: same losses, same gradients.

A tiny GPT (6 layers, hidden 64) for 3 iterations under 1F1B, ZB-H1, ZB-H2 and a deep
warm-up schedule, at 2 and 4 stages and at PP 2 x DP 2, against one process accumulating the
same microbatches in the same order with torch's ordinary backward. Every stage initialises
its weights from the seed and the parameters' names alone, as `run` does, so no state is
handed over; the tied embedding's gradients are compared after the embedding-group
all-reduce, every gradient after the DP all-reduce.
"""

import dataclasses
import functools
from typing import Any

import numpy as np
import pytest
import torch

from adaptra.generator import generate_schedule
from baselines import one_f_one_b, zb_h1, zb_h2
from pipeline.allreduce import buckets, chunk_bytes
from pipeline.ops import OpKind
from pipeline.profile import Profile
from pipeline.runtime import IterationConfig, WorkerPool
from pipeline.runtime.config import replicas_loss
from pipeline.runtime.digest import params_sha256, whole_model_params
from pipeline.runtime.megatron import MegatronCompute, get_preset
from pipeline.runtime.megatron.reference import (
    ReferenceIteration,
    build_whole_model,
    single_process_megatron,
    train_reference,
)
from pipeline.schedule import ReplicaSchedules, Schedule
from pipeline.topology import Link

pytestmark = pytest.mark.multiprocess

NUM_ITERATIONS, SEED, LR = 3, 0, 0.5


def _reference(
    num_microbatches: int, num_replicas: int
) -> tuple[list[ReferenceIteration], list[tuple[str, np.ndarray]]]:
    """One process's iterations, and its parameters after them (in the model's order)."""
    preset = get_preset("tiny")
    with single_process_megatron():
        model = build_whole_model(preset, SEED)
        iterations = train_reference(
            model,
            preset,
            num_microbatches=num_microbatches,
            num_replicas=num_replicas,
            num_iterations=NUM_ITERATIONS,
            seed=SEED,
            lr=LR,
        )
        params = [(name, p.detach().numpy().copy()) for name, p in model.named_parameters()]
    return iterations, params


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
    fig4_fixture: dict[str, Any],
    num_stages: int,
    num_replicas: int,
    num_microbatches: int,
) -> None:
    """...and the trained parameters: each within 1e-5 of one process's. Their digests differ
    between schedules and from one process's because floating-point sums depend on their
    order (W's weight gradients accumulate microbatches in the schedule's order, the tied
    embedding's two halves are added after the fact), so equality is to 1e-5, not bits; the
    same schedule run again in the same pool gives the same bits."""
    reference, reference_params = _reference(num_microbatches, num_replicas)
    profile = Profile.uniform(num_stages, num_microbatches, 1, 1, 1, num_replicas=num_replicas)
    # The stages initialise themselves from the seed, as `run` does: the reference's model.
    factory = functools.partial(MegatronCompute, "tiny", seed=SEED, lr=LR)
    schedules = list(_schedules(profile, fig4_fixture).items())
    digests: dict[str, str] = {}
    with WorkerPool(num_stages, num_replicas, compute_factory=factory, timeout_s=60) as pool:
        for name, schedule in [*schedules, ("again: " + schedules[0][0], schedules[0][1])]:
            losses = []
            for it in range(NUM_ITERATIONS):
                last_iteration = it == NUM_ITERATIONS - 1
                config = IterationConfig(
                    it, schedule, profile, collect_grads=True, collect_params=last_iteration
                )
                pool.run_iteration(config)
                results = pool.last_results
                last = [r for r in results if r.stage == num_stages - 1]
                assert all(r.step_output.loss is not None for r in last)  # each its part
                loss = replicas_loss(results)
                torch.testing.assert_close(loss, reference[it].loss, rtol=1e-5, atol=1e-6)
                losses.append(loss)
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
            params = whole_model_params(pool.last_results)
            assert [n for n, _ in params] == [n for n, _ in reference_params]
            for (param, got), (_, expected) in zip(params, reference_params, strict=True):
                _assert_close(got, expected, f"{name}, trained {param}")
            digests[name] = params_sha256(params)
    assert digests["again: 1f1b"] == digests["1f1b"]  # the same run, the same bits
    assert all(len(d) == 64 for d in digests.values())


def test_a_rebalanced_global_batch_trains_like_the_balanced_one() -> None:
    """Falcon's rebalance: PP 2 x DP 2 with the global batch of 8 microbatches split 3 + 5
    (1F1B on replica 0, ZB-H1 on replica 1) gives the balanced run's losses within 1e-5 (and
    one process's gradients and trained parameters): each replica takes its own microbatches
    of the global batch and scales its losses by 1 / 8, not 1 / its own count."""
    num_stages, num_replicas, num_microbatches = 2, 2, 4
    reference, reference_params = _reference(num_microbatches, num_replicas)
    profile = Profile.uniform(num_stages, num_microbatches, 1, 1, 1, num_replicas=num_replicas)
    split = ReplicaSchedules(
        (
            one_f_one_b(dataclasses.replace(profile, num_microbatches=3)),
            zb_h1(dataclasses.replace(profile, num_microbatches=5)),
        )
    )
    factory = functools.partial(MegatronCompute, "tiny", seed=SEED, lr=LR)
    F = OpKind.F
    runs: dict[str, list[float]] = {}
    with WorkerPool(num_stages, num_replicas, compute_factory=factory, timeout_s=60) as pool:
        for name, replica_schedules in (("balanced", None), ("3+5", split)):
            losses = []
            for it in range(NUM_ITERATIONS):
                config = IterationConfig(
                    it,
                    one_f_one_b(profile),
                    profile,
                    replica_schedules=replica_schedules,
                    collect_grads=True,
                    collect_params=it == NUM_ITERATIONS - 1,
                )
                timeline = pool.run_iteration(config)
                forwards = [
                    sum(1 for o in timeline.ops if (o.kind, o.stage, o.replica) == (F, 0, r))
                    for r in range(num_replicas)
                ]
                assert forwards == ([4, 4] if replica_schedules is None else [3, 5])
                results = pool.last_results
                last = [r.step_output.loss for r in results if r.stage == num_stages - 1]
                assert None not in last and len(last) == num_replicas  # each replica's part
                losses.append(replicas_loss(results))
                for r in results:
                    assert r.step_output.grads is not None
                    for param, grad in r.step_output.grads.items():
                        where = f"{name}, iteration {it}, rank {r.rank}, {param}"
                        _assert_close(grad, reference[it].grads[param], where)
            runs[name] = losses
            params = whole_model_params(pool.last_results)
            for (param, got), (_, expected) in zip(params, reference_params, strict=True):
                _assert_close(got, expected, f"{name}, trained {param}")
    assert runs["3+5"] == pytest.approx(runs["balanced"], rel=1e-5, abs=0)
    assert runs["balanced"] == pytest.approx([r.loss for r in reference], rel=1e-5, abs=0)
    assert runs["3+5"][-1] < runs["3+5"][0]


def test_the_dp_ring_sums_real_gradients_through_its_faults() -> None:
    """PP 1 x DP 3: the worker's DP ring (not a collective) sums megatron's gradients, in
    buckets of 64 KiB whose element counts do not divide by 3 (every chunk padded), with a
    5 ms delay on one ring link: the same losses, gradients and trained parameters as one
    process, within 1e-5 (with three replicas the ring's summation order is not one
    process's), and every chunk of the gradient is a DP message, the delayed link's with its
    delay."""
    num_replicas, num_microbatches, bucket_bytes = 3, 2, 65_536
    reference, reference_params = _reference(num_microbatches, num_replicas)
    profile = Profile.uniform(
        1, num_microbatches, 1, 1, 1, num_replicas=num_replicas, dp_bucket_bytes=bucket_bytes
    )
    slow_link = Link.dp(0, 1)
    profile = profile.with_delays((), {slow_link: 5.0})
    factory = functools.partial(MegatronCompute, "tiny", seed=SEED, lr=LR)
    with WorkerPool(1, num_replicas, compute_factory=factory, timeout_s=60) as pool:
        for it in range(NUM_ITERATIONS):
            config = IterationConfig(
                it,
                one_f_one_b(profile),
                profile,
                collect_grads=True,
                collect_params=it == NUM_ITERATIONS - 1,
            )
            timeline = pool.run_iteration(config)
            results = pool.last_results
            grad_bytes = 4 * sum(g.size for g in reference[it].grads.values())
            chunks = [chunk_bytes(b, num_replicas, 4) for b in buckets(grad_bytes, bucket_bytes)]
            assert grad_bytes % bucket_bytes and (grad_bytes // 4) % num_replicas
            for sender in range(num_replicas):
                sent = [m for m in timeline.dp_messages if m.replica == sender]
                # 2 (D - 1) chunks per bucket, in bucket order.
                assert [m.num_bytes for m in sent] == [c for c in chunks for _ in range(4)]
                for m in sent:
                    assert m.fault_ms == (5.0 if m.link == str(slow_link) else 0.0)
            torch.testing.assert_close(
                replicas_loss(results), reference[it].loss, rtol=1e-5, atol=1e-6
            )
            for r in results:
                assert r.step_output.loss is not None
                assert r.step_output.grads is not None
                assert r.step_output.grads.keys() == reference[it].grads.keys()
                for param, grad in r.step_output.grads.items():
                    _assert_close(grad, reference[it].grads[param], f"it {it}, {param}")
        params = whole_model_params(pool.last_results)
        for (param, got), (_, expected) in zip(params, reference_params, strict=True):
            _assert_close(got, expected, f"trained {param}")


def test_the_tied_embeddings_copies_stay_bit_identical_at_dp_3() -> None:
    """PP 2 x DP 3: after every step stage 0's word embedding and the last stage's output
    layer (its copy, reported under the embedding's name) hold the same bits on every
    replica. The tied sum ran before the DP ring, whose summation order per element follows
    its chunk: the embedding is at the start of stage 0's flat gradient and at the end of the
    last stage's, so the two copies' sums differed in their last bits (574 elements after
    the first step, 869 after the second); megatron's order, the DP sum first, cannot."""
    num_stages, num_replicas = 2, 3
    profile = Profile.uniform(num_stages, 2, 1, 1, 1, num_replicas=num_replicas)
    factory = functools.partial(MegatronCompute, "tiny", seed=SEED, lr=LR)
    name = "embedding.word_embeddings.weight"
    before = None
    with WorkerPool(num_stages, num_replicas, compute_factory=factory, timeout_s=60) as pool:
        for it in range(2):
            config = IterationConfig(it, one_f_one_b(profile), profile, collect_params=True)
            pool.run_iteration(config)
            copies = [dict(r.step_output.params or ())[name] for r in pool.last_results]
            assert len(copies) == num_stages * num_replicas
            differing = [int((copy != copies[0]).sum()) for copy in copies]
            assert differing == [0] * len(copies), f"iteration {it}: elements off rank 0's"
            assert before is None or not np.array_equal(copies[0], before)  # it trained
            before = copies[0]
