"""harness.runner: one configuration on the engines an experiment shares."""

import pytest

from baselines import one_f_one_b
from harness.runner import RuntimeEngines, fixed_plan, run_configuration
from pipeline.profile import Profile


@pytest.mark.multiprocess
def test_the_seed_reaches_the_megatron_model() -> None:
    """The run's seed draws megatron's initial weights and synthetic tokens: another seed
    trains another model (its own pool), the same seed the same one again."""
    pytest.importorskip("megatron.core", reason="the megatron backend needs megatron-core")
    profile = Profile.uniform(2, 2, 1, 1, 1)
    runs = []
    with RuntimeEngines() as engines:
        for seed in (0, 7, 0):
            result = run_configuration(
                fixed_plan(one_f_one_b(profile), profile),
                backend="megatron",
                model="tiny",
                num_iterations=2,
                num_warmup_iterations=0,
                engines=engines,
                seed=seed,
            )
            assert len(result.losses) == 2 and len(result.params_sha256) == 64
            runs.append((result.losses, result.params_sha256))
    (zero_losses, zero_sha), (seven_losses, seven_sha), again = runs
    assert again == (zero_losses, zero_sha)
    assert seven_sha != zero_sha
    assert all(a != b for a, b in zip(zero_losses, seven_losses, strict=True))
