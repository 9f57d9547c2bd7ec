import pytest

from baselines import one_f_one_b
from pipeline.allreduce import AllReduce
from pipeline.errors import ConfigError
from pipeline.metrics import compute_metrics
from pipeline.profile import Profile
from pipeline.simulator import simulate
from pipeline.topology import Link


def test_each_stage_reduces_when_its_replicas_are_done() -> None:
    ring = AllReduce(
        num_replicas=2, grad_bytes=(1_000_000, 4_000_000), bandwidth_gbps=8.0, optimizer_ms=(1, 2)
    )
    assert ring.ring_ms(0) == pytest.approx(2 * 0.5)  # 0.5 MB chunk at 1 GB/s, twice
    # Stage 0 finishes late but reduces little; stage 1 early with four times the bytes.
    assert ring.step_end_ms([10.0, 5.0]) == max(10.0 + 1.0 + 1.0, 5.0 + 4.0 + 2.0)
    slow = ring.with_delays({(0, 0): 3.0})
    assert slow.step_end_ms([10.0, 5.0]) == 10.0 + 1.0 + 2 * 3.0 + 1.0
    assert str(Link.dp(3, 0)) == "dp3:0-1"


def test_bad_all_reduce_is_refused() -> None:
    with pytest.raises(ConfigError, match="num_replicas"):
        AllReduce(num_replicas=0, grad_bytes=(1,), bandwidth_gbps=1.0)
    with pytest.raises(ConfigError, match="DP link dp0:1-2 does not exist"):
        AllReduce(num_replicas=2, grad_bytes=(1,), bandwidth_gbps=1.0, dp_delay_ms={(0, 1): 1.0})
    with pytest.raises(ConfigError, match="one entry per stage"):
        AllReduce(num_replicas=2, grad_bytes=(1, 1), bandwidth_gbps=1.0, optimizer_ms=(1.0,))


def test_simulated_step_follows_the_pipeline_on_every_replica() -> None:
    profile = Profile.uniform(2, 4, 1, 2, 1)
    ring = AllReduce(num_replicas=3, grad_bytes=(8_000_000, 8_000_000), bandwidth_gbps=64.0)
    plain = simulate(one_f_one_b(profile), profile)
    timeline = simulate(one_f_one_b(profile), profile, allreduce=ring)
    assert {r.replica for r in timeline.ops} == {0, 1, 2}
    assert len(timeline.ops) == 3 * len(plain.ops)
    metrics = compute_metrics(timeline)
    assert metrics.iteration_time_ms == compute_metrics(plain).iteration_time_ms
    # 4 ring steps of 8/3 MB at 8 GB/s after the later stage (stage 0) ends.
    stage0_end = max(r.end_ms for r in plain.ops if r.stage == 0)
    assert timeline.iterations[0].end_ms == pytest.approx(stage0_end + 4 * (8 / 3) / 8)
    assert metrics.step_time_ms == pytest.approx(timeline.iterations[0].end_ms - stage0_end)
