"""Presets, stage placement and the CPU shim (which must leave megatron as it found it)."""

import pytest
import torch

from baselines import one_f_one_b
from pipeline.checks import MAX_SEED
from pipeline.errors import ConfigError
from pipeline.ops import OpKind
from pipeline.profile import Profile
from pipeline.runtime.config import IterationConfig
from pipeline.runtime.devices import RankDevices
from pipeline.runtime.megatron.backend import MegatronCompute, build_initial_stage
from pipeline.runtime.megatron.model import (
    MODELS,
    build_stage_model,
    get_preset,
    global_param_name,
    initialize_parameters,
    microbatch_tokens,
    stage_layer_offset,
    with_model_bytes,
)
from pipeline.runtime.megatron.reference import single_process_megatron
from pipeline.runtime.megatron.shim import STAND_IN_DEVICE, cpu_shim, gpu_stand_in
from pipeline.runtime.megatron.stage import StageRunner
from pipeline.schedule import ReplicaSchedules


def test_unknown_model_names_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown model 'gpt5'; valid models: tiny, small"):
        get_preset("gpt5")


def test_slots_must_split_evenly() -> None:
    tiny = get_preset("tiny")  # 6 layers + embedding + head = 8 slots
    assert tiny.valid_stage_counts() == [1, 2, 4, 8]
    with pytest.raises(ConfigError, match=r"8 slots, which 3 stages cannot split evenly"):
        tiny.check_stages(3)
    for preset in MODELS.values():
        assert 2 in preset.valid_stage_counts()


def test_layer_offsets_follow_megatrons_split() -> None:
    tiny = get_preset("tiny")
    # 4 stages x 2 slots: [embedding, L0], [L1, L2], [L3, L4], [L5, head].
    assert [stage_layer_offset(tiny, s, 4) for s in range(4)] == [0, 1, 3, 5]
    assert [stage_layer_offset(tiny, s, 2) for s in range(2)] == [0, 3]
    assert global_param_name("decoder.layers.1.mlp.linear_fc1.weight", 3) == (
        "decoder.layers.4.mlp.linear_fc1.weight"
    )
    assert global_param_name("output_layer.weight", 5) == "embedding.word_embeddings.weight"
    assert global_param_name("decoder.final_layernorm.weight", 5) == (
        "decoder.final_layernorm.weight"
    )


def test_the_shim_undoes_itself() -> None:
    from megatron.core import utils
    from megatron.core.fusions import fused_softmax
    from megatron.core.tensor_parallel import random

    targets = [
        (random, "_get_cuda_rng_state"),
        (random, "_set_cuda_rng_state"),
        (utils.GlobalMemoryBuffer, "get_tensor"),
        (fused_softmax, "get_default_causal_mask"),
    ]
    before = [getattr(t, n) for t, n in targets]
    assert "cuda" not in vars(torch.Tensor)  # inherited from the C base class
    with pytest.raises(KeyError), cpu_shim(building=True):
        assert "cuda" in vars(torch.Tensor)
        assert fused_softmax.get_default_causal_mask(3).device.type == "cpu"
        raise KeyError("undone on errors too")
    assert [getattr(t, n) for t, n in targets] == before
    assert "cuda" not in vars(torch.Tensor)


@pytest.mark.parametrize("num_stages", [1, 2, 4, 8])
def test_a_stages_gradient_bytes_are_its_built_parameters(num_stages: int) -> None:
    """The table's count (what a megatron run's profile gets as `allreduce_bytes`, with no
    model built) is every built stage's fp32 parameter bytes, the tied copies included."""
    tiny = get_preset("tiny")
    built, states = [], []
    with single_process_megatron():
        for stage in range(num_stages):
            with cpu_shim(building=True):
                model = build_stage_model(tiny, stage, num_stages)
            built.append(sum(4 * p.numel() for p in model.parameters()))
            states.append(sum(t.numel() * t.element_size() for t in model.state_dict().values()
                              if isinstance(t, torch.Tensor)))  # fmt: skip
    assert tiny.gradient_bytes(num_stages) == tuple(built)
    profile = Profile.uniform(num_stages, 8, 1, 1, 1, num_replicas=2)
    given = with_model_bytes(profile, tiny)
    assert given.allreduce_bytes == tuple(built)
    # what a swap moves: the stage's whole state (its parameters; SGD keeps nothing else),
    # not the cost model's 8 x of mixed-precision Adam
    assert given.stage_state_bytes == tuple(states) == tiny.state_bytes(num_stages)
    assert [given.state_bytes(s) for s in range(num_stages)] == states
    assert with_model_bytes(given, tiny) == given


def test_a_megatron_profile_carries_the_bytes_its_stages_send() -> None:
    """`message_bytes` is what stage 0's F really hands on (the [seq, batch, hidden] fp32
    activation), not the profile's 0: what the timeout check, the planner and the simulator
    price a PP message at; the tied weight's gradient is the built copy's bytes."""
    tiny = get_preset("tiny")
    with single_process_megatron():
        first = build_initial_stage(tiny, 0, 2, seed=0, device=torch.device("cpu"))
        tokens, _ = microbatch_tokens(tiny, 0, 0)
        sent = StageRunner(first).forward(0, tokens=tokens, deferred=False)
        tied = first.shared_embedding_or_output_weight()
    assert sent is not None
    given = with_model_bytes(Profile.uniform(2, 4, 1, 1, 1), tiny)
    assert given.message_bytes == sent.numel() * sent.element_size() == 16 * 2 * 64 * 4
    assert tiny.tied_weight_bytes(2) == tied.numel() * tied.element_size() == 128 * 64 * 4
    assert tiny.tied_weight_bytes(1) == 0  # one stage holds the one copy: nothing is sent
    bytes_of = {
        name: with_model_bytes(Profile.uniform(2, 4, 1, 1, 1), preset).message_bytes
        for name, preset in MODELS.items()
    }
    assert bytes_of == {"tiny": 8192, "small": 262_144, "gpt2-124m": 3_145_728}
    assert with_model_bytes(given, tiny) == given  # its own bytes, given back, are fine


def test_a_megatron_profile_with_other_message_bytes_is_refused() -> None:
    small = Profile.uniform(2, 4, 1, 1, 1, message_bytes=262_144)  # small's, not tiny's
    with pytest.raises(
        ConfigError,
        match=r"message_bytes 262144 are not model 'tiny''s activations, 8192 "
        r"\(16 x 2 x 64 elements of 4 bytes\): give that or 0",
    ):
        with_model_bytes(small, get_preset("tiny"))
    assert with_model_bytes(small, get_preset("small")).message_bytes == 262_144


def test_any_seed_gives_its_own_tokens() -> None:
    """Seeds up to MAX_SEED draw tokens (the generator's seed is taken modulo 2^64: a seed
    of 20 million overflowed it before); a small seed's tokens are as before."""
    preset = get_preset("tiny")
    tokens = {seed: microbatch_tokens(preset, seed, 3)[0] for seed in (0, 7, 20_000_000, MAX_SEED)}
    assert len({t.numpy().tobytes() for t in tokens.values()}) == 4
    shape = (preset.micro_batch_size, preset.seq_length + 1)
    before = torch.randint(
        0, preset.vocab_size, shape, generator=torch.Generator().manual_seed(7 * 1_000_003**2 + 3)
    )
    assert torch.equal(tokens[7], before[:, :-1])


def test_initialize_parameters_sets_every_value_megatron_leaves_unset() -> None:
    """Megatron's own initialisation is off (`perform_initialization`): what a stage is built
    with is whatever its memory held, and `initialize_parameters` must overwrite all of it,
    the last stage's copy of the tied weight with the first stage's values."""
    tiny = get_preset("tiny")
    built = {}
    with single_process_megatron():
        for stage in (0, 1):
            with cpu_shim(building=True):
                model = build_stage_model(tiny, stage, 2)
            assert not model.config.perform_initialization
            for param in model.parameters():
                param.data.fill_(float("nan"))
            initialize_parameters(model, 0, stage_layer_offset(tiny, stage, 2))
            built[stage] = dict(model.named_parameters())
    for params in built.values():
        assert all(bool(p.detach().isfinite().all()) for p in params.values())
    assert torch.equal(
        built[0]["embedding.word_embeddings.weight"], built[1]["output_layer.weight"]
    )
    assert float(built[0]["embedding.word_embeddings.weight"].detach().std()) > 0  # not zeros


def test_a_worker_on_a_gpu_builds_its_whole_stage_there() -> None:
    """A worker's set-up on a GPU, on a CPU: the meta device stands in for the GPU
    (`gpu_stand_in`). The build ran megatron's GPU initialisation, which forks the CUDA RNG
    tracker, before the worker seeded it ("cuda rng state model-parallel-rng is not
    added"), and it would have left the position embedding and the layer norms, plain torch
    modules, on the host."""
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.tensor_parallel import random as mcore_random

    patched = (torch.cuda.current_device, tensor_parallel.model_parallel_cuda_manual_seed)
    with single_process_megatron(), gpu_stand_in():
        parallel_state.destroy_model_parallel()  # the worker's set-up makes its own
        mcore_random.get_cuda_rng_tracker().reset()  # a fresh worker's: no states yet
        compute = MegatronCompute("tiny")
        compute.setup(0, 1, 0, RankDevices("gloo", STAND_IN_DEVICE, "cpu"))
        placed = {name: p.device.type for name, p in compute.runner.model.named_parameters()}
        states = mcore_random.get_cuda_rng_tracker().get_states()
    assert len(placed) == 2 + 6 * 12 + 2  # 2 embeddings, 6 layers, final norm (output tied)
    assert set(placed.values()) == {"meta"}
    assert "model-parallel-rng" in states  # what attention's dropout forks
    assert (torch.cuda.current_device, tensor_parallel.model_parallel_cuda_manual_seed) == patched


def test_every_backward_op_on_a_gpu_ends_by_waiting_for_its_kernels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a GPU an op's record must be its kernels' time, so B, W and BW each end by one
    `torch.cuda.synchronize` of the compute device (W returned before it: its record was
    the launch of its weight-gradient kernels, their time charged to the next op). On a CPU:
    the forwards run on the host, then the compute device is said to be a GPU (a backward
    of one stage takes no input to move) and the synchronisations are counted."""
    profile = Profile.uniform(1, 3, 1, 1, 1)
    with single_process_megatron():
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()  # the set-up makes its own
        compute = MegatronCompute("tiny")
        compute.setup(0, 1, 0, RankDevices("gloo", "cpu", "cpu"))
        compute.begin_iteration(IterationConfig(0, one_f_one_b(profile), profile))
        for microbatch in range(3):
            compute.run(OpKind.F, microbatch, None, profile)
        calls: list[object] = []
        monkeypatch.setattr(torch.cuda, "synchronize", calls.append)
        compute._compute_device = torch.device("cuda")
        counts = []
        for kind, microbatch in ((OpKind.B, 0), (OpKind.W, 0), (OpKind.BW, 1)):
            compute.run(kind, microbatch, None, profile)
            counts.append(len(calls))
    assert counts == [1, 2, 3]
    assert calls == [torch.device("cuda")] * 3


def test_an_iteration_that_loads_a_state_on_a_gpu_waits_for_it_before_its_first_op(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Iteration 0 (the initial state) and the first after a restart (a checkpoint) load the
    stage's parameters with copies that a GPU runs asynchronously: `begin_iteration`, before
    the iteration's start, waits for them, so that the first op's record holds its own
    kernels only (it held the copies of the whole stage: every parameter). Any other
    iteration loads nothing and waits for nothing. As above: on a CPU, the compute device
    is then said to be a GPU and the synchronisations are counted."""
    profile = Profile.uniform(1, 1, 1, 1, 1)
    with single_process_megatron():
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()  # the set-up makes its own
        compute = MegatronCompute("tiny")
        compute.setup(0, 1, 0, RankDevices("gloo", "cpu", "cpu"))
        calls: list[object] = []
        monkeypatch.setattr(torch.cuda, "synchronize", calls.append)
        compute._compute_device = torch.device("cuda")
        counts = []
        for iteration in (0, 1):
            compute.begin_iteration(IterationConfig(iteration, one_f_one_b(profile), profile))
            counts.append(len(calls))
    assert counts == [1, 1]
    assert calls == [torch.device("cuda")]


def test_a_rank_swap_builds_the_stage_it_takes_over_without_drawing_its_initial_weights(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker that takes over a position in a rank swap builds its stage, then imports its
    state: drawing the stage's initial weights first was wasted, and inside the swap's
    record (gpt2-124m's stage: 0.8 s of draws and 0.2 s of copies here, for a state that
    moves in about as long). They are drawn where the stage then needs them: a move with no
    state (back to the default placement between runs), then an iteration."""
    from megatron.core import parallel_state

    from pipeline.runtime.megatron import backend

    draws: list[int] = []

    def counted(model: torch.nn.Module, seed: int, layer_offset: int) -> None:
        draws.append(layer_offset)
        initialize_parameters(model, seed, layer_offset)

    monkeypatch.setattr(backend, "initialize_parameters", counted)
    profile = Profile.uniform(1, 2, 1, 1, 1)
    with single_process_megatron():
        parallel_state.destroy_model_parallel()  # the set-up makes its own
        compute = MegatronCompute("tiny")
        compute.setup(0, 1, 0, RankDevices("gloo", "cpu", "cpu"))
        initial = compute.export_state()
        assert draws == [0]  # the set-up's stage
        draws.clear()
        compute.move(0, 0)  # a swap: the position's state comes next
        trained = torch.full((compute.state_bytes(),), 7, dtype=torch.uint8)
        compute.import_state(trained)
        compute.begin_iteration(IterationConfig(5, one_f_one_b(profile), profile))
        assert draws == []
        assert torch.equal(compute.export_state(), trained)
        compute.move(0, 0)  # back to the default placement between runs: no state moves
        assert draws == []
        compute.begin_iteration(IterationConfig(0, one_f_one_b(profile), profile))
        assert draws == [0]
        assert torch.equal(compute.export_state(), initial)
        compute.move(0, 0)  # a move no state follows: the initial state, in any iteration
        compute.begin_iteration(IterationConfig(3, one_f_one_b(profile), profile))
        assert torch.equal(compute.export_state(), initial)


def test_the_loss_is_scaled_by_the_microbatches_the_schedules_run() -> None:
    """The loss and gradient scale and each replica's first microbatch follow the schedules
    that run, not the profile's count (a 2-microbatch schedule under a 4-microbatch profile
    was scaled by 1/4: its reported loss half the batch's mean)."""
    told = Profile.uniform(2, 4, 1, 1, 1, num_replicas=2)
    ran = one_f_one_b(Profile.uniform(2, 2, 1, 1, 1))
    config = IterationConfig(0, ran, told)
    assert config.num_global_microbatches == 4
    assert [config.microbatch_offset(r) for r in (0, 1)] == [0, 2]
    three = one_f_one_b(Profile.uniform(2, 3, 1, 1, 1))
    split = IterationConfig(0, ran, told, replica_schedules=ReplicaSchedules((three, ran)))
    assert split.num_global_microbatches == 5
    assert [split.microbatch_offset(r) for r in (0, 1)] == [0, 3]
