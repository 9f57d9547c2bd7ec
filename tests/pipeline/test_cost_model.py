import dataclasses
import math

import pytest

from pipeline.allreduce import DEFAULT_BUCKET_BYTES
from pipeline.checks import MIN_BANDWIDTH_GBPS
from pipeline.cost_model import (
    CALIBRATED,
    H800_IB400,
    MAX_MODEL_COUNT,
    MODELS,
    GPTModel,
    model_cost,
    resolve_hardware,
    resolve_model,
)
from pipeline.errors import ConfigError
from pipeline.ops import Op, OpKind
from pipeline.runtime.megatron.model import GPTPreset
from pipeline.schedule import Schedule


@pytest.mark.parametrize(
    ("name", "billions"),
    [("gpt2-7b", 7), ("gpt2-14b", 14), ("gpt2-30b", 30), ("gpt2-60b", 60), ("gpt2-140b", 140)],
)
def test_models_have_their_nominal_size(name: str, billions: int) -> None:
    cost = model_cost(MODELS[name])
    model = cost.model
    # weights_gb is 16 bytes of state per parameter per GPU; a stage's GPUs split it by TP.
    params = sum(cost.weights_gb) * 1e9 / 16 * model.tp
    assert params / 1e9 == pytest.approx(billions, rel=0.1)
    assert cost.profile.num_stages == model.pp
    assert cost.profile.num_microbatches == 3 * model.pp


@pytest.mark.parametrize("pp", [1, 2, 4])
def test_the_last_stage_holds_the_tied_copy_and_the_final_layernorm(pp: int) -> None:
    """The first stage holds the word and position embeddings, the last the final LayerNorm
    (2h) and its copy of the tied output weight (Vh), not the position table: 7B's last
    stage had s*h - 2h = 5,232,640 parameters (10.5 MB of gradient) too many. Each stage's
    count is the megatron preset's of the same shape."""
    model = resolve_model({"base": "gpt2-7b", "num_layers": 6, "hidden": 256, "pp": pp})
    preset = GPTPreset(name="x", num_layers=6, hidden_size=256, num_attention_heads=32,
                       vocab_size=50257, seq_length=1024, micro_batch_size=1)  # fmt: skip
    grad_bytes = model_cost(model).profile.allreduce_bytes
    assert grad_bytes == tuple(2 * preset.stage_num_params(i, pp) for i in range(pp))
    h, v = 5120, 50257
    last = model_cost(MODELS["gpt2-7b"]).profile.allreduce_bytes[3]
    assert last == 2 * (5 * (12 * h * h + 13 * h) + v * h + 2 * h) == 3_661_045_760


def test_layer_slots_give_the_embedding_and_head_one_each() -> None:
    model = MODELS["gpt2-7b"]  # 22 layers + 2 slots over 4 stages: 6 slots each
    assert [model.layers_on_stage(i) for i in range(4)] == [5, 6, 6, 5]
    profile = model_cost(model).fused_profile
    # ZeroBubble's per-layer FLOPs: T_W < T_F < T_B on the middle stages.
    assert profile.t_w_ms[1] < profile.t_f_ms[1] < profile.t_b_ms[1]
    # Stage 0 has one layer fewer and only an embedding lookup: the cheapest forward.
    assert profile.t_f_ms[0] == min(profile.t_f_ms)


def test_split_backward_costs_more_than_fused() -> None:
    cost = model_cost(MODELS["gpt2-14b"])
    ratio = 1 + CALIBRATED.split_backward_overhead
    for split, fused in zip(cost.profile.t_b_ms, cost.fused_profile.t_b_ms, strict=True):
        assert split == pytest.approx(fused * ratio)
    assert cost.profile.t_f_ms == cost.fused_profile.t_f_ms
    fused_order = Schedule(stages=tuple((Op(OpKind.F, 0), Op(OpKind.BW, 0)) for _ in range(8)))
    split_order = Schedule(
        stages=tuple((Op(OpKind.F, 0), Op(OpKind.B, 0), Op(OpKind.W, 0)) for _ in range(8))
    )
    assert cost.profile_for(fused_order) is cost.fused_profile
    assert cost.profile_for(split_order) is cost.profile


def test_tensor_parallelism_divides_compute_and_adds_its_all_reduce() -> None:
    one = model_cost(MODELS["gpt2-14b"]).profile
    two = model_cost(dataclasses.replace(MODELS["gpt2-14b"], tp=2, name="tp2")).profile
    assert one.t_w_ms[1] / 2 == pytest.approx(two.t_w_ms[1])  # W has no TP communication
    assert two.t_f_ms[1] > one.t_f_ms[1] / 2


def test_tensor_parallelism_splits_activations_but_not_the_layernorm_inputs() -> None:
    """No sequence parallelism (as the paper's runs): per layer 10 sbh bytes stay whole on
    each TP rank and 24 sbh + 5 a s^2 b are split; the PP message is the whole activation."""
    one = model_cost(MODELS["gpt2-14b"])
    four = model_cost(dataclasses.replace(MODELS["gpt2-14b"], tp=4, name="tp4"))
    m = MODELS["gpt2-14b"]
    s, b, h, a = m.seq_len, m.microbatch_size, m.hidden, m.num_heads
    layers = m.layers_on_stage(1)
    assert one.activation_gb[1] == pytest.approx(layers * s * b * (34 * h + 5 * a * s) / 1e9)
    split = layers * s * b * (10 * h + (24 * h + 5 * a * s) / 4) / 1e9
    assert four.activation_gb[1] == pytest.approx(split)
    assert four.profile.message_bytes == one.profile.message_bytes == s * b * h * 2


def test_the_dp_step_is_in_the_profile() -> None:
    profile = model_cost(MODELS["gpt2-30b"]).profile  # DP 4, TP 2
    assert profile.num_replicas == 4
    assert profile.dp_bucket_bytes == DEFAULT_BUCKET_BYTES
    assert profile.dp_bandwidth_gbps == pytest.approx(400 * CALIBRATED.allreduce_efficiency)
    # fp16 gradients of a middle stage's 5 layers, halved by TP.
    assert profile.allreduce_bytes[1] == int(5 * (12 * 8192**2 + 13 * 8192) / 2 * 2)
    assert all(t > 0 for t in profile.optimizer_ms)
    fused = model_cost(MODELS["gpt2-30b"]).fused_profile
    assert (fused.num_replicas, fused.allreduce_bytes) == (4, profile.allreduce_bytes)
    assert model_cost(MODELS["gpt2-14b"]).profile.num_replicas == 1


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("gpt2-1t", "unknown model 'gpt2-1t'"),
        ({"base": "gpt2-14b", "colour": 1}, "unknown model field"),
        ({"base": "gpt2-14b", 1: 2, "x": 3}, r"unknown model field\(s\) 1, x; valid: base, "),
        ({"base": "gpt2-14b", "pp": 7}, "do not split evenly over 7 stages"),
        ({"base": "gpt2-14b", "num_microbatches": 4}, "4 microbatches < 8 stages"),
        # (said as Python's "GPTModel.__init__() missing 3 required keyword-only arguments")
        (
            {"dp": 2},
            r"model \{'dp': 2\} names no base: give base \(one of [^()]*gpt2-7b[^()]*\) and the "
            r"fields to change, or every field \(missing: hidden, name, num_layers\)",
        ),
    ],
)
def test_bad_models_are_clear_errors(entry: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve_model(entry)  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["hidden", "seq_len", "microbatch_size", "num_heads"])
def test_a_model_count_past_any_model_s_is_refused_before_it_is_priced(field: str) -> None:
    """A spec's model of `hidden: 111...` (300 digits; seq_len, microbatch_size too) was an
    internal error (OverflowError) pricing its FLOPs, products of its counts past a float.
    Each count is at most MAX_MODEL_COUNT (far beyond any model's), whose products stay
    within a float: such a model is priced, and refused as one that does not fit."""
    with pytest.raises(ConfigError, match=f"{field} must be in 1..{MAX_MODEL_COUNT}, got 1111"):
        resolve_model({"base": "gpt2-7b", field: int("1" * 300)})
    most = {f: MAX_MODEL_COUNT for f in ("hidden", "seq_len", "microbatch_size", "num_heads")}
    largest = resolve_model({"base": "gpt2-7b", **most, "num_layers": MAX_MODEL_COUNT - 2})
    with pytest.raises(ConfigError, match="does not fit 4 stages"):
        model_cost(largest)


def test_a_model_that_does_not_fit_its_stages_is_refused() -> None:
    model = resolve_model({"base": "gpt2-140b", "pp": 2})
    with pytest.raises(ConfigError, match="does not fit 2 stages.*use more stages"):
        model_cost(model)


def test_tensor_parallelism_past_a_node_is_refused() -> None:
    """A TP all-reduce is priced at NVLink speed: TP larger than a node's GPUs is refused
    (it was priced as if inside one), and fits once the hardware has nodes that large."""
    model = resolve_model({"base": "gpt2-140b", "tp": 16, "pp": 4})
    with pytest.raises(ConfigError, match="tp 16 is more than h800-ib400's 8 GPUs per node"):
        model_cost(model)
    wide = resolve_hardware({"base": "h800-ib400", "gpus_per_node": 16})
    assert model_cost(model, wide).profile.num_stages == 4


def test_each_stage_needs_room_for_its_own_1f1b_warm_up() -> None:
    """Stage i holds min(N, S - i) microbatches under 1F1B, not stage 0's S."""
    big_vocab = dataclasses.replace(MODELS["gpt2-14b"], vocab_size=400_000)
    fits = model_cost(big_vocab, resolve_hardware({"base": "h800-ib400", "memory_gib": 67.0}))
    assert fits.max_in_flight == (8, 20, 20, 20, 20, 20, 20, 4)  # the head's stage needs 1
    short = resolve_model({"base": "gpt2-7b", "num_layers": 6, "vocab_size": 400_000})
    roomy, tight = (
        resolve_hardware({"base": "h800-ib400", "memory_gib": gib}) for gib in (37.3, 36.8)
    )
    assert model_cost(short, roomy).max_in_flight == (6, 43, 43, 1)
    with pytest.raises(ConfigError, match="stage 3 holds .* room for 0 microbatches .* needs 1;"):
        model_cost(short, tight)


def test_an_80_gb_card_holds_80_gib() -> None:
    """The H800's 80 GB is 80 GiB (85.9e9 bytes), compared with weights and activations in
    bytes: 14B's middle stage holds 30.21 GB of state and 2.076 GB per microbatch, room for
    floor((85.90 - 30.21) / 2.076) = 26 microbatches (read as 80e9 bytes: 23, fewer than a
    real card holds)."""
    cost = model_cost(MODELS["gpt2-14b"])
    assert H800_IB400.memory_gib == 80.0
    w, a = cost.weights_gb[1], cost.activation_gb[1]
    assert (round(w, 2), round(a, 3)) == (30.21, 2.076)
    assert cost.max_in_flight[1] == math.floor((80 * 2**30 / 1e9 - w) / a) == 26
    assert cost.max_in_flight == (32, 26, 26, 26, 26, 26, 26, 29)


def test_custom_models_take_every_field() -> None:
    model = resolve_model({"name": "tiny", "num_layers": 2, "hidden": 64, "pp": 2})
    assert isinstance(model, GPTModel) and model.layers_on_stage(0) == 1
    assert model_cost(model).profile.num_stages == 2


def test_hardware_is_configurable() -> None:
    slow_net = resolve_hardware({"base": "h800-ib400", "network_gbps": 100})
    assert slow_net.name == "h800-ib400-custom" and slow_net.peak_tflops == 989.0
    fast, slow = (
        model_cost(MODELS["gpt2-30b"], hw) for hw in (resolve_hardware("h800-ib400"), slow_net)
    )
    chunk = DEFAULT_BUCKET_BYTES // 4  # one DP message of a full bucket's ring at DP 4
    latency_ms = fast.profile.link_latency_ms
    assert slow.profile.dp_wire_ms(chunk) - latency_ms == pytest.approx(
        4 * (fast.profile.dp_wire_ms(chunk) - latency_ms)
    )
    assert slow.profile.t_f_ms == fast.profile.t_f_ms  # compute does not move
    smaller = resolve_hardware({"base": "h800-ib400", "memory_gib": 37})
    with pytest.raises(ConfigError, match="does not fit"):
        model_cost(MODELS["gpt2-14b"], smaller)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("tpu", "unknown hardware 'tpu'"),
        ({"base": "h800-ib400", "network_gbps": 0}, "network_gbps must be finite and >= 0.001"),
        ({"base": "h800-ib400", "warp": 9}, "unknown hardware field"),
        ({"base": "h800-ib400", "memory_gb": 80}, "memory_gb is memory_gib now"),
        # GB/s beside Gbit/s under one suffix: NVLink given in Gbit/s ran 8 times too fast
        (
            {"base": "h800-ib400", "nvlink_gbps": 3600},
            "nvlink_gbps is nvlink_gbyte_s now: its speed in GB/s, where every [*]_gbps is in "
            "Gbit/s",
        ),
        ({"hbm_gbps": 3350}, "hbm_gbps is hbm_gbyte_s now"),
        ({"base": "h800-ib400", "memory_gib": "lots"}, "memory_gib must be a number, got 'lots'"),
        (
            {"network_gbps": 200},
            r"names no base: give base \(one of h800-ib400\) and the fields to change, or every "
            r"field \(missing: copy_gbps, hbm_gbyte_s, link_latency_ms, memory_gib, name, ",
        ),
    ],
)
def test_bad_hardware_is_a_clear_error(entry: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve_hardware(entry)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        # YAML 1.1 reads 1e-300 as a string: "'>' not supported between instances of 'str'
        # and 'int'" leaked; true passed as 1 and was refused as the profile's
        # link_bandwidth_gbps.
        ("network_gbps", "1e-300", "network_gbps must be a number, got '1e-300'"),
        ("network_gbps", True, "network_gbps must be a number, got True"),
        # 1.0e-300 ran: a median iteration of hundreds of digits in ms.
        ("network_gbps", 1e-300, "network_gbps must be finite and >= 0.001 Gbit/s, got 1e-300"),
        ("copy_gbps", 0.0009, "copy_gbps must be finite and >= 0.001 Gbit/s, got 0.0009"),
        ("nvlink_gbyte_s", 1e-5, "nvlink_gbyte_s must be finite and >= 0.000125 GB/s, got 1e-05"),
        ("hbm_gbyte_s", math.inf, "hbm_gbyte_s must be finite and >= 0.000125 GB/s, got inf"),
        ("peak_tflops", 1e-6, "peak_tflops must be finite and >= 0.001 TFLOPS, got 1e-06"),
        ("memory_gib", 0, "memory_gib must be finite and > 0 GiB, got 0"),
        ("link_latency_ms", math.nan, "link_latency_ms must be finite and in 0..3600000 ms"),
        ("gpus_per_node", True, "gpus_per_node must be an integer, got True"),
    ],
)
def test_hardware_fields_are_type_checked_and_rates_have_a_floor(
    field: str, value: object, message: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        resolve_hardware({"base": "h800-ib400", field: value})
    assert str(refused.value).startswith(f"hardware h800-ib400-custom: {message}")
    floor = {"network_gbps": MIN_BANDWIDTH_GBPS, "copy_gbps": MIN_BANDWIDTH_GBPS}
    slowest = resolve_hardware({"base": "h800-ib400", **floor})
    assert (slowest.network_gbps, slowest.copy_gbps) == (0.001, 0.001)


def test_a_network_whose_dp_share_is_under_the_floor_is_refused_by_its_own_name() -> None:
    """The DP all-reduce gets `allreduce_efficiency` (0.796) of the network: a network at the
    hardware's floor gave a DP link under it, refused as `dp_bandwidth_gbps`, a field no spec
    gives. The least network the cost model takes: 0.001 / 0.796 Gbit/s, said rounded up."""
    model = MODELS["gpt2-7b"]
    slow = resolve_hardware({"base": "h800-ib400", "network_gbps": 0.001})
    with pytest.raises(ConfigError) as refused:
        model_cost(model, slow)
    assert str(refused.value) == (
        "hardware h800-ib400-custom: network_gbps must be >= 0.001257 Gbit/s for this cost "
        "model, got 0.001: its DP all-reduce gets 0.796 of it, and no link less than 0.001 "
        "Gbit/s (1 Mbit/s)"
    )
    least = resolve_hardware({"base": "h800-ib400", "network_gbps": 0.001257})  # as it says
    assert model_cost(model, least).profile.dp_bandwidth_gbps == pytest.approx(0.001, rel=1e-3)


def test_a_rate_too_low_for_a_model_names_the_model_and_the_hardware() -> None:
    """hbm_gbyte_s at its least (1 Mbit/s) makes gpt2-14b's optimizer step take days: refused
    naming `optimizer_ms[0]`, a field the user never wrote; now the model and hardware too."""
    slow = resolve_hardware({"base": "h800-ib400", "hbm_gbyte_s": 0.000125})
    with pytest.raises(
        ConfigError,
        match=r"^the cost model's profile of gpt2-14b on hardware h800-ib400-custom: "
        r"optimizer_ms\[0\] must be finite",
    ):
        model_cost(MODELS["gpt2-14b"], slow)


@pytest.mark.parametrize(("field", "most"), [("dp", 1024), ("pp", 512), ("num_microbatches", 4096)])
def test_a_model_s_profile_counts_are_refused_in_the_profile_s_range(field: str, most: int) -> None:
    """A model's DP, PP and microbatches become its profile's replicas, stages and
    microbatches: `dp: 0` was refused as 'in 1..1099511627776' and then `dp: 2000` as the
    profile's 'dp must be in 1..1024'; both now say the range a model takes, naming its field."""
    for value in (0, most + 1):
        with pytest.raises(
            ConfigError, match=f"model gpt2-7b-custom: {field} must be in 1..{most},"
        ):
            resolve_model({"base": "gpt2-7b", field: value})
