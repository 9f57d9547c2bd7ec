"""A rank swap in a megatron run moves the model state with the workers: training goes on
exactly as without the swap (the swap changes who computes, not what), nothing is lost, and
the state moved and the swap's time are in the iteration's records."""

import dataclasses
import math

import pytest
import torch

from baselines import one_f_one_b
from harness.runner import RuntimeEngines, fixed_plan, run_configuration
from pipeline.engines import Plan
from pipeline.profile import Profile
from pipeline.runtime.megatron import get_preset
from pipeline.runtime.megatron.reference import build_whole_model, single_process_megatron
from pipeline.timeline import Timeline
from pipeline.topology import Link, Topology

pytestmark = pytest.mark.multiprocess

PROFILE = Profile.uniform(2, 4, 1, 1, 1, num_replicas=2)
SWAPPED = Topology(2, 2).dp_pair_onto_pp(Link.parse("dp0:0-1"))
"""Worker 2 (stage 0 of replica 1) and worker 1 (stage 1 of replica 0) trade places."""
SWAP_AT, NUM_ITERATIONS = 2, 4


@dataclasses.dataclass
class _SwapAt:
    at: int
    name: str = "swap"
    fixed: Plan = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.fixed = fixed_plan(one_f_one_b(PROFILE), PROFILE).fixed

    def plan(self, iteration: int) -> Plan:
        return dataclasses.replace(self.fixed, topology=SWAPPED if iteration >= self.at else None)

    def observe(self, iteration: int, timeline: Timeline) -> None:
        pass

    def restarted(self, iteration: int, *, stragglers: bool, at_ms: float = math.inf) -> None:
        pass


def _whole_model_bytes() -> int:
    """The tiny GPT's state as one process holds it (the tied weight once)."""
    with single_process_megatron():
        model = build_whole_model(get_preset("tiny"), 0)
        return sum(t.numel() * t.element_size() for t in model.state_dict().values()
                   if isinstance(t, torch.Tensor))  # fmt: skip


def test_a_swap_moves_the_model_state_and_training_goes_on_unchanged() -> None:
    with RuntimeEngines() as engines:  # one pool for all runs: iteration 0 starts afresh
        runs = [
            run_configuration(
                _SwapAt(at),
                backend="megatron",
                model="tiny",
                num_iterations=NUM_ITERATIONS,
                num_warmup_iterations=0,
                engines=engines,
            )
            for at in (NUM_ITERATIONS, SWAP_AT, NUM_ITERATIONS)
        ]
    plain, swapped, again = runs
    assert len(swapped.losses) == NUM_ITERATIONS
    assert swapped.losses == pytest.approx(plain.losses, rel=1e-5, abs=0)
    # After a run that ended swapped, the workers are back in their places before the next
    # run, which swaps nothing and trains as the first.
    assert again.timeline is not None and again.timeline.swaps == ()
    assert again.losses == plain.losses and again.params_sha256 == plain.params_sha256
    assert swapped.losses[-1] < swapped.losses[0]  # it trains
    # DP sums of two and the tied sum a + b: the same bits whoever computes them.
    assert swapped.params_sha256 == plain.params_sha256 != ""
    timeline = swapped.timeline
    assert timeline is not None and plain.timeline is not None
    assert plain.timeline.swaps == ()
    swaps = sorted(timeline.swaps, key=lambda r: r.stage_to)
    assert [
        (r.iteration, r.stage_from, r.replica_from, r.stage_to, r.replica_to) for r in swaps
    ] == [
        (SWAP_AT, 1, 0, 0, 1),
        (SWAP_AT, 0, 1, 1, 0),
    ]
    # Each mover sent the state of the position it left (the other mover's new one).
    # Each mover sent the state of the position it left: both stages' together are the whole
    # model's with the tied weight twice (the last stage's output layer holds its copy).
    preset = get_preset("tiny")
    tied_bytes = 4 * preset.vocab_size * preset.hidden_size
    assert swaps[0].num_bytes > 0 and swaps[1].num_bytes > 0
    assert swaps[0].num_bytes + swaps[1].num_bytes == _whole_model_bytes() + tied_bytes
    record = timeline.iterations[SWAP_AT]
    before, after = timeline.iterations[SWAP_AT - 1].pids, record.pids
    assert (after[1], after[2]) == (before[2], before[1]) and after[0] == before[0]
    assert {r.pid for r in swaps} == {before[1], before[2]}
    for swap in swaps:  # inside the iteration, before the mover's first op
        first_op = min(
            o.start_ms
            for o in timeline.ops
            if (o.iteration, o.stage, o.replica) == (SWAP_AT, swap.stage_to, swap.replica_to)
        )
        assert record.start_ms <= swap.start_ms < swap.end_ms <= first_op
    # Every iteration's every message was taken in (the timeline is assembled only then).
    per_iteration = {k: 0 for k in range(NUM_ITERATIONS)}
    for message in timeline.messages:
        per_iteration[message.iteration] += 1
    assert set(per_iteration.values()) == {2 * 2 * PROFILE.num_microbatches}
