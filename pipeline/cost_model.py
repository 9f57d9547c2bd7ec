"""The GPT-2 cost model: per-stage op times, message sizes and memory of the paper's models.

FLOPs and activation sizes per transformer layer are ZeroBubble's (docs/paper.md); the
embedding and the output head each take one layer slot (docs/paper.md). A hardware
profile turns FLOPs into milliseconds; `Calibration` holds the free parameters, fitted once on
the paper's fault-free iteration times and its delegation overhead
(benchmarks/calibrate_cost_model.py) and then frozen as `CALIBRATED`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from pipeline.checks import MIN_BANDWIDTH_GBPS, check_count, check_ms, is_number
from pipeline.errors import ConfigError
from pipeline.ops import OpKind
from pipeline.profile import MAX_MICROBATCHES, MAX_REPLICAS, MAX_STAGES, Profile
from pipeline.schedule import Schedule

__all__ = [
    "CALIBRATED",
    "H800_IB400",
    "HARDWARE",
    "MAX_MODEL_COUNT",
    "MODELS",
    "Calibration",
    "GPTModel",
    "Hardware",
    "ModelCost",
    "model_cost",
    "resolve_hardware",
    "resolve_model",
]


MAX_MODEL_COUNT = 2**40
"""The most any other count of a model may be (its layers, hidden size, sequence,
vocabulary, TP; its DP, PP and microbatches: `_PROFILE_COUNTS`): far beyond any model's, and
small enough that its FLOPs and bytes, products of a few of them, stay within a float (a
spec's `hidden` of 300 digits overflowed one converting them: an internal error)."""

_PROFILE_COUNTS = {"dp": MAX_REPLICAS, "pp": MAX_STAGES, "num_microbatches": MAX_MICROBATCHES}
"""A model's counts that become its profile's replicas, stages and microbatches: at most what
a profile takes (a `dp: 0` was refused as 'in 1..1099511627776', then 2,000 as the profile's
'dp must be in 1..1024')."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class GPTModel:
    """A GPT-2-style model and its parallel layout (docs/paper.md, Table 2)."""

    name: str
    num_layers: int
    hidden: int
    num_heads: int = 32
    seq_len: int = 1024
    microbatch_size: int = 1
    vocab_size: int = 50257
    tp: int = 1
    dp: int = 1
    pp: int = 1
    num_microbatches: int | None = None
    """None: 3 x PP, as in the paper."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ConfigError(f"a model's name must be a string, got {self.name!r}")
        counts = ("num_layers", "hidden", "num_heads", "seq_len", "microbatch_size", "vocab_size")
        for field in (*counts, "tp"):
            check_count(f"model {self.name}: {field}", getattr(self, field), 1, MAX_MODEL_COUNT)
        for field, most in _PROFILE_COUNTS.items():  # what its profile takes, named as here
            if field != "num_microbatches" or self.num_microbatches is not None:
                check_count(f"model {self.name}: {field}", getattr(self, field), 1, most)
        if (self.num_layers + 2) % self.pp:
            raise ConfigError(
                f"model {self.name}: {self.num_layers} layers + embedding + head = "
                f"{self.num_layers + 2} slots do not split evenly over {self.pp} stages"
            )
        if (self.num_layers + 2) // self.pp < 2 and self.pp > 1:
            raise ConfigError(f"model {self.name}: fewer than 2 layer slots per stage")
        if self.microbatches < self.pp:
            raise ConfigError(
                f"model {self.name}: {self.microbatches} microbatches < {self.pp} stages"
            )

    @property
    def microbatches(self) -> int:
        return 3 * self.pp if self.num_microbatches is None else self.num_microbatches

    @property
    def num_gpus(self) -> int:
        return self.tp * self.dp * self.pp

    def layers_on_stage(self, stage: int) -> int:
        """Transformer layers on a stage: its slots less the embedding (first) or head (last)."""
        slots = (self.num_layers + 2) // self.pp
        return slots - (stage == 0) - (stage == self.pp - 1)


MODELS: dict[str, GPTModel] = {
    m.name: m
    for m in (
        GPTModel(name="gpt2-7b", num_layers=22, hidden=5120, pp=4),
        GPTModel(name="gpt2-7b-dp2", num_layers=22, hidden=5120, dp=2, pp=4),
        GPTModel(name="gpt2-14b", num_layers=46, hidden=5120, pp=8),
        GPTModel(name="gpt2-30b", num_layers=38, hidden=8192, tp=2, dp=4, pp=8),
        GPTModel(name="gpt2-60b", num_layers=38, hidden=11264, tp=4, dp=2, pp=8),
        GPTModel(name="gpt2-140b", num_layers=78, hidden=12288, tp=8, dp=2, pp=8),
    )
}
"""The paper's models (gpt2-7b-dp2 is Fig. 3's DP 2 x PP 4 layout of the 7B model)."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Hardware:
    """One GPU and its links: public data-sheet figures, not fitted (but `copy_gbps`)."""

    name: str
    peak_tflops: float
    """Dense fp16/bf16 tensor-core peak."""
    memory_gib: float
    """The GPU's memory in GiB (2**30 bytes): an "80 GB" H800 or H100 has 80 GiB, 85.9e9
    bytes (nvidia-smi shows 81559 MiB of it); the model's weights and activations are in
    decimal GB (1e9 bytes) and are compared with it in bytes."""
    hbm_gbyte_s: float
    """Memory bandwidth in GB/s (the optimizer step is memory-bound)."""
    nvlink_gbyte_s: float
    """Per-direction NVLink bandwidth in GB/s (TP all-reduces stay inside a node)."""
    network_gbps: float
    """Per-GPU network bandwidth in Gbit/s (PP messages and DP all-reduce: every stage's
    ring is priced over the network, also where TP x DP fills a node; BENCHMARKS.md says
    why)."""
    link_latency_ms: float
    copy_gbps: float
    """Device-host copy speed in Gbit/s (the delegated path): an assumption, not a data-sheet
    figure (PCIe Gen5 x16 carries about 512 Gbit/s each way; pinned copies reach less)."""
    gpus_per_node: int = 8
    """GPUs per host: a stage's TP x DP GPUs fill hosts of this many (the paper's models
    with TP x DP = 1 had one GPU per node, the others a node per stage)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ConfigError(f"a hardware's name must be a string, got {self.name!r}")
        for name, (floor, unit) in _HARDWARE_FLOORS.items():
            value = getattr(self, name)
            if not is_number(value):
                raise ConfigError(f"hardware {self.name}: {name} must be a number, got {value!r}")
            if not (math.isfinite(value) and value >= floor and value > 0):
                least = f">= {floor:g}" if floor else "> 0"
                raise ConfigError(
                    f"hardware {self.name}: {name} must be finite and {least} {unit}, got {value!r}"
                )
        check_ms(f"hardware {self.name}: link_latency_ms", self.link_latency_ms)
        check_count(f"hardware {self.name}: gpus_per_node", self.gpus_per_node, 1)


_GBYTE_S_RENAMED = frozenset({"hbm_gbps", "nvlink_gbps"})
"""The names `hbm_gbyte_s` and `nvlink_gbyte_s` had, refused by name: a `_gbps` in GB/s
beside those in Gbit/s took a speed given in Gbit/s as 8 times faster."""

_HARDWARE_FLOORS: dict[str, tuple[float, str]] = {
    "peak_tflops": (0.001, "TFLOPS"),  # 1 GFLOP/s
    "memory_gib": (0.0, "GiB"),  # > 0: a model that does not fit is refused by its stages
    "hbm_gbyte_s": (MIN_BANDWIDTH_GBPS / 8, "GB/s"),
    "nvlink_gbyte_s": (MIN_BANDWIDTH_GBPS / 8, "GB/s"),
    "network_gbps": (MIN_BANDWIDTH_GBPS, "Gbit/s"),
    "copy_gbps": (MIN_BANDWIDTH_GBPS, "Gbit/s"),
}
"""The least each rate of a `Hardware` may be, in its unit (and memory more than 0): a
bandwidth no less than a fault timeline's cap, 1 Mbit/s; far less made an iteration take
a number of hundreds of digits in ms."""


H800_IB400 = Hardware(
    name="h800-ib400",
    peak_tflops=989.0,
    memory_gib=80.0,
    hbm_gbyte_s=3350.0,
    nvlink_gbyte_s=200.0,
    network_gbps=400.0,
    link_latency_ms=0.01,
    copy_gbps=200.0,
)
HARDWARE: dict[str, Hardware] = {H800_IB400.name: H800_IB400}
"""The paper's cluster (16 nodes x 8 H800, 400 Gbit/s InfiniBand); others by changing fields."""


def _resolve(entry: Any, table: Mapping[str, Any], kind: str) -> Any:
    """An entry of `table` by name, or a mapping: `base` (a name) with fields to change, or
    every field of the table's dataclass."""
    if isinstance(entry, str):
        if entry not in table:
            raise ConfigError(f"unknown {kind} {entry!r}; valid: {', '.join(table)}")
        return table[entry]
    if not isinstance(entry, Mapping):
        raise ConfigError(f"a {kind} is a name or a mapping, got {entry!r}")
    cls = type(next(iter(table.values())))
    fields = dict(entry)
    base_name = fields.pop("base", None)
    valid = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(map(str, set(fields) - valid))  # (YAML's `1:` is a key 1: no TypeError)
    if unknown:
        raise ConfigError(
            f"unknown {kind} field(s) {', '.join(unknown)}; valid: base, {', '.join(sorted(valid))}"
        )
    if base_name is None:
        missing = sorted(
            f.name
            for f in dataclasses.fields(cls)
            if f.init
            and f.name not in fields
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        )
        if missing:  # (else Python's "__init__() missing 3 required keyword-only arguments")
            raise ConfigError(
                f"{kind} {entry!r} names no base: give base (one of {', '.join(table)}) and the "
                f"fields to change, or every field (missing: {', '.join(missing)})"
            )
    try:
        if base_name is None:
            return cls(**fields)
        base = _resolve(str(base_name), table, kind)
        fields.setdefault("name", f"{base.name}-custom")
        return dataclasses.replace(base, **fields)
    except TypeError as err:
        raise ConfigError(f"{kind} {entry!r}: {err}") from err


def resolve_model(entry: str | Mapping[str, Any]) -> GPTModel:
    """A model by name (MODELS), or a mapping: `base` with fields to change, or every field."""
    model: GPTModel = _resolve(entry, MODELS, "model")
    return model


def hardware_fields(entry: Any) -> Any:
    """The fields but its name of the hardware `entry` (a name or a mapping) resolves to, to
    tell two entries apart (a preset and a mapping of it that changes no field are one), or
    `entry` itself where it resolves to nothing (a name this version lacks)."""
    try:
        fields = dataclasses.asdict(resolve_hardware(entry))
    except ConfigError:
        return entry
    del fields["name"]
    return fields


def resolve_hardware(entry: str | Mapping[str, Any]) -> Hardware:
    """A hardware profile by name (HARDWARE), or a mapping like a model's."""
    if isinstance(entry, Mapping) and "memory_gb" in entry:
        raise ConfigError(
            "hardware memory_gb is memory_gib now: the card's memory in GiB (an 80 GB card "
            "has 80 GiB)"
        )
    for old in _GBYTE_S_RENAMED.intersection(entry if isinstance(entry, Mapping) else ()):
        new = old.replace("_gbps", "_gbyte_s")
        raise ConfigError(
            f"hardware {old} is {new} now: its speed in GB/s, where every *_gbps is in Gbit/s"
        )
    hardware: Hardware = _resolve(entry, HARDWARE, "hardware")
    return hardware


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Calibration:
    """The free parameters, fitted on fault-free iteration times and the fault-free overhead of
    delegating every PP message."""

    mfu: float
    """Achieved fraction of peak FLOPs in every op."""
    split_backward_overhead: float
    """Extra time, as a fraction, of running B and W as two ops instead of one fused BW (ZB's
    split: smaller kernels, a second pass over saved tensors)."""
    allreduce_efficiency: float
    """Achieved fraction of network bandwidth in the DP ring all-reduce."""
    host_delegate_gbps: float
    """A host's CPU-side send rate in Gbit/s (its delegates' gloo over TCP through its NIC),
    shared evenly by the GPUs of a stage on that host: a delegated message goes at its GPU's
    share, not at the GPU's 400 Gbit/s."""

    def __post_init__(self) -> None:
        if not 0 < self.mfu <= 1 or not 0 < self.allreduce_efficiency <= 1:
            raise ConfigError("mfu and allreduce_efficiency must be in (0, 1]")
        if self.split_backward_overhead < 0:
            raise ConfigError("split_backward_overhead must be >= 0")
        if not self.host_delegate_gbps > 0:
            raise ConfigError("host_delegate_gbps must be > 0")


CALIBRATED = Calibration(
    mfu=0.449, split_backward_overhead=0.149, allreduce_efficiency=0.796, host_delegate_gbps=180.3
)
"""Fitted by benchmarks/calibrate_cost_model.py on 14B 1F1B 0.86 s, 14B ZB 0.79 s and 7B
DP 2 x PP 4 ZB 0.49 s (fault-free), and on the paper's overhead of delegating every PP
message with no straggler at 30B and 60B (+10.6 % and +16.4 %, one delegate per link
direction), then frozen: every other paper number is a prediction."""


@dataclasses.dataclass(frozen=True, slots=True)
class ModelCost:
    """What the cost model gives for one model on one hardware profile."""

    model: GPTModel
    profile: Profile
    """Op times of schedules that split the backward into B and W, and the DP step (replicas,
    each stage's gradient bytes, the DP links' bandwidth, the optimizer)."""
    fused_profile: Profile
    """Op times of schedules that fuse it (BW = t_b + t_w, with no split overhead)."""
    weights_gb: tuple[float, ...]
    """Parameters, gradients and optimizer state per GPU of each stage."""
    activation_gb: tuple[float, ...]
    """Activation memory of one in-flight microbatch per GPU of each stage."""
    max_in_flight: tuple[int, ...]
    """Microbatches whose activations fit next to the weights, per stage."""

    def profile_for(self, schedule: Schedule) -> Profile:
        """The op times `schedule` sees: fused ones if it runs BW ops (1F1B), split otherwise."""
        fused = any(op.kind is OpKind.BW for ops in schedule.stages for op in ops)
        return self.fused_profile if fused else self.profile


_GIB = 1 << 30
_BYTES_PER_ELEMENT = 2  # fp16 activations, messages and gradients
_BYTES_PER_PARAM_STATE = 16  # fp16 weight and grad, fp32 master weight and two Adam moments
_ADAM_BYTES_MOVED_PER_PARAM = 32  # read and write of the fp32 state plus the fp16 copies


def _layer_flops(m: GPTModel) -> tuple[float, float, float]:
    s, b, h = m.seq_len, m.microbatch_size, m.hidden
    return s * b * h * (24 * h + 4 * s), s * b * h * (24 * h + 8 * s), 24.0 * s * b * h * h


def _head_flops(m: GPTModel) -> float:
    """One of the logits GEMM's three passes (forward, input gradient, weight gradient)."""
    return 2.0 * m.seq_len * m.microbatch_size * m.hidden * m.vocab_size


def _tp_allreduce_ms(m: GPTModel, hw: Hardware) -> float:
    """One TP all-reduce of an activation inside a node (two per layer per F and per B)."""
    if m.tp == 1:
        return 0.0
    num_bytes = m.seq_len * m.microbatch_size * m.hidden * _BYTES_PER_ELEMENT
    return 2 * (m.tp - 1) / m.tp * num_bytes / (hw.nvlink_gbyte_s * 1e6)


def _one_f_one_b_in_flight(num_stages: int, num_microbatches: int, stage_idx: int) -> int:
    """Microbatches stage `stage_idx` holds at 1F1B's peak: its warm-up, min(N, S - i)."""
    return min(num_microbatches, num_stages - stage_idx)


def model_cost(
    model: GPTModel, hardware: Hardware = H800_IB400, calibration: Calibration = CALIBRATED
) -> ModelCost:
    """Per-stage times, message bytes, memory and the DP step of `model` (its all-reduce in
    buckets of megatron's default size: pipeline.allreduce)."""
    m, hw, cal = model, hardware, calibration
    if m.tp > hw.gpus_per_node:
        raise ConfigError(
            f"model {m.name}: tp {m.tp} is more than {hw.name}'s {hw.gpus_per_node} GPUs per "
            "node; the model prices a TP all-reduce at NVLink speed, inside one node (use tp "
            f"<= {hw.gpus_per_node}, or set the hardware's gpus_per_node)"
        )
    if hw.network_gbps * cal.allreduce_efficiency < MIN_BANDWIDTH_GBPS:
        raise ConfigError(
            f"hardware {hw.name}: network_gbps must be >= "
            f"{math.ceil(MIN_BANDWIDTH_GBPS / cal.allreduce_efficiency * 1e6) / 1e6:g} Gbit/s "
            "for this cost model, "
            f"got {hw.network_gbps!r}: its DP all-reduce gets {cal.allreduce_efficiency:g} of "
            f"it, and no link less than {MIN_BANDWIDTH_GBPS:g} Gbit/s (1 Mbit/s)"
        )
    flops_per_ms = hw.peak_tflops * 1e9 * cal.mfu
    layer_f, layer_b, layer_w = _layer_flops(m)
    tp_ms = _tp_allreduce_ms(m, hw)
    head = _head_flops(m)
    params_per_layer = 12 * m.hidden**2 + 13 * m.hidden
    # The first stage holds the word and position embeddings; the last the final LayerNorm
    # and, with more than one stage, its own copy of the tied output weight (megatron's
    # layout: pipeline.runtime.megatron.model.GPTPreset.stage_num_params), not the positions.
    embedding_params = (m.vocab_size + m.seq_len) * m.hidden
    head_params = 2 * m.hidden + (m.vocab_size * m.hidden if m.pp > 1 else 0)
    t_f, t_b, t_w, weights_gb, activation_gb, grad_bytes, optimizer_ms = [], [], [], [], [], [], []
    for stage in range(m.pp):
        layers = m.layers_on_stage(stage)
        has_head = stage == m.pp - 1
        flops_f = layers * layer_f + has_head * head
        flops_b = layers * layer_b + has_head * head
        flops_w = layers * layer_w + has_head * head
        t_f.append(flops_f / m.tp / flops_per_ms + 2 * layers * tp_ms)
        t_b.append(flops_b / m.tp / flops_per_ms + 2 * layers * tp_ms)
        t_w.append(flops_w / m.tp / flops_per_ms)
        params = layers * params_per_layer + (stage == 0) * embedding_params
        params += has_head * head_params
        params_per_gpu = params / m.tp
        weights_gb.append(params_per_gpu * _BYTES_PER_PARAM_STATE / 1e9)
        grad_bytes.append(int(params_per_gpu * _BYTES_PER_ELEMENT))
        optimizer_ms.append(params_per_gpu * _ADAM_BYTES_MOVED_PER_PARAM / (hw.hbm_gbyte_s * 1e6))
        s, b, h, a = m.seq_len, m.microbatch_size, m.hidden, m.num_heads
        # Tensor parallelism without sequence parallelism (the authors' artifact passes no
        # --sequence-parallel, megatron's default): a layer's LayerNorm and dropout inputs,
        # 10 sbh bytes, are whole on every TP rank, the rest (24 sbh + 5 a s^2 b) split
        # (Korthikanti et al., "Reducing Activation Recomputation", Table 2); the PP messages
        # are then whole too (megatron-core splits them only under sequence parallelism).
        per_layer = s * b * (10 * h + (24 * h + 5 * a * s) / m.tp)
        logits = has_head * s * b * m.vocab_size * 4 / m.tp  # fp32 logits for the loss
        activation_gb.append((layers * per_layer + logits) / 1e9)
    memory_gb = hw.memory_gib * _GIB / 1e9
    max_in_flight = tuple(
        math.floor((memory_gb - w) / a) if a > 0 else m.microbatches
        for w, a in zip(weights_gb, activation_gb, strict=True)
    )
    for stage, fit in enumerate(max_in_flight):
        needed = _one_f_one_b_in_flight(m.pp, m.microbatches, stage)
        if fit < needed:
            raise ConfigError(
                f"model {m.name} does not fit {m.pp} stages on {hw.name}: stage {stage} holds "
                f"{weights_gb[stage]:.1f} GB of weights and optimizer state and room for "
                f"{max(fit, 0)} microbatches of {activation_gb[stage]:.2f} GB, but needs "
                f"{needed}; use more stages or more tensor parallelism"
            )
    try:
        fused_profile = Profile(
            num_stages=m.pp,
            num_microbatches=m.microbatches,
            t_f_ms=tuple(t_f),
            t_b_ms=tuple(t_b),
            t_w_ms=tuple(t_w),
            message_bytes=m.seq_len * m.microbatch_size * m.hidden * _BYTES_PER_ELEMENT,
            link_latency_ms=hw.link_latency_ms,
            link_bandwidth_gbps=hw.network_gbps,
            copy_gbps=hw.copy_gbps,
            delegate_gbps=cal.host_delegate_gbps / min(m.tp * m.dp, hw.gpus_per_node),
            num_replicas=m.dp,
            allreduce_bytes=tuple(grad_bytes),
            dp_bandwidth_gbps=hw.network_gbps * cal.allreduce_efficiency,
            optimizer_ms=tuple(optimizer_ms),
        )
        split = 1.0 + cal.split_backward_overhead
        profile = dataclasses.replace(
            fused_profile,
            t_b_ms=tuple(t * split for t in t_b),
            t_w_ms=tuple(t * split for t in t_w),
        )
    except ConfigError as err:  # e.g. a time past an hour, of a rate given too low
        raise ConfigError(
            f"the cost model's profile of {m.name} on hardware {hw.name}: {err}"
        ) from err
    return ModelCost(
        m,
        profile,
        fused_profile,
        tuple(weights_gb),
        tuple(activation_gb),
        max_in_flight,
    )
