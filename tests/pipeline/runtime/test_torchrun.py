"""The torchrun worker's command line: what it computes with."""

import pytest

from pipeline.checks import MAX_SEED
from pipeline.runtime.compute import EmulatedCompute
from pipeline.runtime.torchrun import compute_backend, parse_worker_args

PLAN = ["--profile", "p.json", "--schedule", "s.json", "--out", "out"]


def test_a_megatron_worker_draws_its_weights_and_tokens_from_the_seed_it_is_given() -> None:
    """The worker built MegatronCompute(model) with seed 0, whatever the spec's seed."""
    pytest.importorskip("megatron.core", reason="the megatron backend needs megatron-core")
    from pipeline.runtime.megatron import MegatronCompute
    from pipeline.runtime.megatron.model import microbatch_tokens

    megatron = [*PLAN, "--compute", "megatron", "--model", "tiny"]
    computes = [
        compute_backend(parse_worker_args([*megatron, *seed]))
        for seed in ([], ["--seed", "7"], ["--seed", str(MAX_SEED)])
    ]
    megatrons = [c for c in computes if isinstance(c, MegatronCompute)]
    assert len(megatrons) == 3 and [c.seed for c in megatrons] == [0, 7, MAX_SEED]
    tokens = [microbatch_tokens(c.preset, c.seed, 0)[0] for c in megatrons]
    assert not tokens[0].equal(tokens[1]) and not tokens[1].equal(tokens[2])


def test_the_emulated_worker_takes_a_seed_and_a_seed_out_of_range_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert isinstance(compute_backend(parse_worker_args([*PLAN, "--seed", "3"])), EmulatedCompute)
    for bad in ("-1", str(MAX_SEED + 1)):
        with pytest.raises(SystemExit):
            parse_worker_args([*PLAN, "--seed", bad])
        assert f"--seed must be in 0..{MAX_SEED}" in capsys.readouterr().err
