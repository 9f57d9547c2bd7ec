"""GPT configurations by name, and one pipeline stage of a megatron-core GPTModel.

Stages come from megatron's own split (`parallel_state` must be initialised first): the
transformer layers, the embedding and the output head (with the loss) count as one layer slot
each (`account_for_embedding_in_pipeline_split`, `account_for_loss_in_pipeline_split`), and
the slots are split evenly, so (num_layers + 2) must be divisible by the number of stages.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from collections.abc import Mapping
from typing import Any

import torch

from pipeline.errors import BackendError, ConfigError
from pipeline.profile import Profile

__all__ = [
    "DTYPE",
    "ELEMENT_BYTES",
    "MODELS",
    "GPTPreset",
    "build_stage_model",
    "get_preset",
    "global_param_name",
    "initialize_parameters",
    "microbatch_tokens",
    "stage_layer_offset",
    "stage_state_from_reference",
    "with_model_bytes",
]


DTYPE = torch.float32
"""What a megatron worker's parameters, gradients and stage-boundary messages are made of
(the model's `params_dtype` and `pipeline_dtype`): the one place the backend's element type
is set."""

ELEMENT_BYTES = DTYPE.itemsize
"""Bytes of one element of `DTYPE`: what every byte count of a megatron run is a multiple of."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class GPTPreset:
    """A GPT configuration: the model and the shape of one microbatch."""

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    vocab_size: int
    seq_length: int
    """Tokens per sequence (also the size of the learned position table)."""
    micro_batch_size: int
    """Sequences per microbatch."""

    def __post_init__(self) -> None:
        for field in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size"):
            if getattr(self, field) < 1:
                raise ConfigError(f"{field} must be >= 1")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError("hidden_size must be divisible by num_attention_heads")
        if self.seq_length < 2 or self.micro_batch_size < 1:
            raise ConfigError("seq_length must be >= 2 and micro_batch_size >= 1")

    @property
    def num_slots(self) -> int:
        """Layer slots the pipeline split divides: the layers, the embedding, the head."""
        return self.num_layers + 2

    def valid_stage_counts(self) -> list[int]:
        return [s for s in range(1, self.num_slots + 1) if self.num_slots % s == 0]

    def check_stages(self, num_stages: int) -> None:
        if num_stages < 1 or (num_stages > 1 and self.num_slots % num_stages):
            valid = ", ".join(map(str, self.valid_stage_counts()))
            raise ConfigError(
                f"model {self.name!r} has {self.num_layers} layers + embedding + head = "
                f"{self.num_slots} slots, which {num_stages} stages cannot split evenly; "
                f"valid stage counts: {valid}"
            )

    def stage_num_params(self, stage: int, num_stages: int) -> int:
        """Parameters stage `stage` of `num_stages` holds (megatron's local layer spec): per
        layer 12 h^2 + 13 h (QKV, projection, two MLP matrices, their biases, two layer
        norms), the word and position embeddings on the first stage, the final layer norm
        and, with more than one stage, its own copy of the tied output weight on the last."""
        h = self.hidden_size
        first = stage_layer_offset(self, stage, num_stages)
        end = (
            self.num_layers
            if stage == num_stages - 1
            else stage_layer_offset(self, stage + 1, num_stages)
        )
        count = (end - first) * (12 * h * h + 13 * h)
        if stage == 0:
            count += (self.vocab_size + self.seq_length) * h
        if stage == num_stages - 1:
            count += 2 * h + (self.vocab_size * h if num_stages > 1 else 0)
        return count

    def gradient_bytes(self, num_stages: int) -> tuple[int, ...]:
        """Each stage's fp32 gradient: the bytes its DP all-reduce sums
        (`Profile.allreduce_bytes`)."""
        return tuple(
            ELEMENT_BYTES * self.stage_num_params(s, num_stages) for s in range(num_stages)
        )

    def state_bytes(self, num_stages: int) -> tuple[int, ...]:
        """Each stage's training state as the megatron backend keeps it: its fp32 parameters
        (plain SGD, no optimizer state; `Profile.stage_state_bytes`, what a swap moves)."""
        return self.gradient_bytes(num_stages)

    def message_shape(self) -> tuple[int, int, int]:
        """A stage boundary's activation (and gradient): [sequence, batch, hidden]."""
        return (self.seq_length, self.micro_batch_size, self.hidden_size)

    def message_bytes(self) -> int:
        """The bytes of every stage-boundary message, an activation or its gradient
        (`Profile.message_bytes`)."""
        return math.prod(self.message_shape()) * ELEMENT_BYTES

    def tied_weight_bytes(self, num_stages: int) -> int:
        """The bytes of the tied weight's gradient that the first and the last stage swap
        after the DP ring (the word embedding, [vocab, hidden]); 0 with one stage, which
        holds the one copy."""
        return self.vocab_size * self.hidden_size * ELEMENT_BYTES if num_stages > 1 else 0

    def transformer_config(self, num_stages: int, *, use_cpu_initialization: bool) -> Any:
        """Megatron's config of a `num_stages` split. Megatron's own initialisation is off
        (`perform_initialization`): `initialize_parameters` (or a saved state) sets every
        parameter, and megatron's draws on a GPU fork its CUDA RNG tracker, which a build
        need not have seeded yet."""
        from megatron.core.transformer.transformer_config import TransformerConfig

        self.check_stages(num_stages)
        split = num_stages > 1  # megatron counts the extra slots only with a pipeline
        return TransformerConfig(
            num_layers=self.num_layers,
            hidden_size=self.hidden_size,
            num_attention_heads=self.num_attention_heads,
            pipeline_model_parallel_size=num_stages,
            account_for_embedding_in_pipeline_split=split,
            account_for_loss_in_pipeline_split=split,
            use_cpu_initialization=use_cpu_initialization,
            perform_initialization=False,
            hidden_dropout=0.0,  # deterministic: a pipelined run must equal one process
            attention_dropout=0.0,
            params_dtype=DTYPE,
            pipeline_dtype=DTYPE,
            gradient_accumulation_fusion=False,
            bias_activation_fusion=False,
            masked_softmax_fusion=False,
            bias_dropout_fusion=False,
            apply_rope_fusion=False,
            persist_layer_norm=False,
        )


MODELS: dict[str, GPTPreset] = {
    p.name: p
    for p in (
        # Trains on a CPU in seconds; 6 layers: 8 slots split over 1, 2, 4 or 8 stages.
        GPTPreset(
            name="tiny",
            num_layers=6,
            hidden_size=64,
            num_attention_heads=4,
            vocab_size=128,
            seq_length=16,
            micro_batch_size=2,
        ),
        # Large enough that GEMMs, not Python, dominate a CPU backward (the B + W measurement).
        GPTPreset(
            name="small",
            num_layers=6,
            hidden_size=256,
            num_attention_heads=8,
            vocab_size=1024,
            seq_length=256,
            micro_batch_size=1,
        ),
        # GPT-2 (124M) shapes with a vocabulary padded to a multiple of 128, for GPUs.
        GPTPreset(
            name="gpt2-124m",
            num_layers=12,
            hidden_size=768,
            num_attention_heads=12,
            vocab_size=50304,
            seq_length=1024,
            micro_batch_size=1,
        ),
    )
}


def get_preset(name: str) -> GPTPreset:
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}; valid models: {', '.join(MODELS)}")
    return MODELS[name]


def with_model_bytes(profile: Profile, preset: GPTPreset) -> Profile:
    """`profile` with the bytes a megatron worker really sends and holds: its messages the
    model's fp32 activations (`GPTPreset.message_bytes`), its DP all-reduce's bytes the
    model's real gradients and its training state its fp32 parameters (`state_bytes`, plain
    SGD keeps nothing else), so that what plans, predicts and checks a megatron run sees the
    traffic its pipeline and its DP ring send and the state a rank swap moves; a profile that
    gives other non-zero bytes is refused, and so is a bucket size of part-elements."""
    preset.check_stages(profile.num_stages)
    message = preset.message_bytes()
    real = preset.gradient_bytes(profile.num_stages)
    state = preset.state_bytes(profile.num_stages)
    if profile.message_bytes and profile.message_bytes != message:
        shape = " x ".join(map(str, preset.message_shape()))
        raise ConfigError(
            f"the profile's message_bytes {profile.message_bytes} are not model "
            f"{preset.name!r}'s activations, {message} ({shape} elements of {ELEMENT_BYTES} "
            "bytes): give that or 0"
        )
    if any(profile.allreduce_bytes) and profile.allreduce_bytes != real:
        raise ConfigError(
            f"the profile's allreduce_bytes {list(profile.allreduce_bytes)} are not model "
            f"{preset.name!r}'s gradients at {profile.num_stages} stage(s), "
            f"{list(real)}: give those or 0"
        )
    if profile.stage_state_bytes and profile.stage_state_bytes != state:
        raise ConfigError(
            f"the profile's state_bytes {list(profile.stage_state_bytes)} are not what model "
            f"{preset.name!r}'s workers hold at {profile.num_stages} stage(s), "
            f"{list(state)}: give those or none"
        )
    if profile.dp_bucket_bytes % ELEMENT_BYTES:
        raise ConfigError(
            f"dp_bucket_bytes {profile.dp_bucket_bytes} must be a multiple of {ELEMENT_BYTES} "
            "(the fp32 gradient's elements) with the megatron backend"
        )
    return dataclasses.replace(
        profile, message_bytes=message, allreduce_bytes=real, stage_state_bytes=state
    )


class _PlayedStage:
    """What a model's construction asks of its pipeline group (`rank()`, `size()`), for the
    stage it is built for: megatron reads the stage from the group's rank, so a worker can
    build any stage, also one it took over in a rank swap."""

    def __init__(self, stage: int, num_stages: int) -> None:
        self._stage, self._num_stages = stage, num_stages

    def rank(self) -> int:
        return self._stage

    def size(self) -> int:
        return self._num_stages


def build_stage_model(
    preset: GPTPreset, stage: int, num_stages: int, *, device: str | torch.device = "cpu"
) -> Any:
    """Stage `stage` of the GPTModel (local layer spec, tied embeddings), whichever rank
    builds it (`parallel_state` must be initialised), with every parameter on `device` and
    none initialised: `initialize_parameters` (or a saved state) sets them all, the tied
    weight's two copies too (megatron's own start-up sum of them is left out). Off the CPU,
    megatron allocates its parallel layers on `torch.cuda.current_device()` (which must be
    `device`) and the rest (position embedding, layer norms) as plain torch modules on the
    host: the model is moved to `device` whole, as megatron's own training does. Call inside
    `cpu_shim(building=True)` on a CPU."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.process_groups_config import ProcessGroupCollection

    preset.check_stages(num_stages)
    if not 0 <= stage < num_stages:
        raise ConfigError(f"stage {stage} does not exist with {num_stages} stages")
    groups = ProcessGroupCollection.use_mpu_process_groups()
    groups.pp = _PlayedStage(stage, num_stages)
    groups.embd = None
    on_cpu = torch.device(device).type == "cpu"
    config = preset.transformer_config(num_stages, use_cpu_initialization=on_cpu)
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=preset.vocab_size,
        max_sequence_length=preset.seq_length,
        pre_process=stage == 0,
        post_process=stage == num_stages - 1,
        share_embeddings_and_output_weights=True,
        pg_collection=groups,
    )
    return model if on_cpu else model.to(device)


def stage_layer_offset(preset: GPTPreset, stage: int, num_stages: int) -> int:
    """Global index of the stage's first transformer layer (megatron's even slot split)."""
    preset.check_stages(num_stages)
    if num_stages == 1:
        return 0
    per_stage = preset.num_slots // num_stages
    return 0 if stage == 0 else stage * per_stage - 1  # the embedding holds stage 0's slot


_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")
_SHARED = "embedding.word_embeddings.weight"


def global_param_name(local_name: str, layer_offset: int) -> str:
    """A stage's parameter name as the whole model (one stage) names it; the last stage's
    copy of the tied embedding is named as the embedding."""
    if local_name == "output_layer.weight":
        return _SHARED
    match = _LAYER.match(local_name)
    if match is None:
        return local_name
    return f"decoder.layers.{int(match.group(1)) + layer_offset}.{local_name[match.end() :]}"


_SCALED_INIT = ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight")
"""Weights megatron initialises with its scaled (output-layer) method: std / sqrt(2 L)."""


def _initial_value(name: str, shape: torch.Size, seed: int, config: Any) -> torch.Tensor:
    """Megatron's GPT initialisation of the parameter called `name` in the whole model,
    drawn from a generator of its own: norms' weights 1, biases 0, weights N(0, std) (the
    residual outputs N(0, std / sqrt(2 L)))."""
    if name.endswith("layernorm.weight"):
        return torch.ones(shape)
    if name.endswith(".bias"):
        return torch.zeros(shape)
    if not (name.endswith(".weight") and ("embedding" in name or "decoder.layers." in name)):
        raise BackendError(f"no initialisation is known for parameter {name!r}")
    std = config.init_method_std
    if name.endswith(_SCALED_INIT):
        std /= math.sqrt(2.0 * config.num_layers)
    digest = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
    return torch.empty(shape).normal_(0.0, std, generator=generator)


@torch.no_grad()
def initialize_parameters(model: torch.nn.Module, seed: int, layer_offset: int) -> None:
    """Set a stage's parameters from the seed and each one's name in the whole model only,
    never from the split: every stage count starts from the same model (a stage's draws are
    made on the CPU, then copied to its device; the tied output weight equals the
    embedding)."""
    config = model.config  # type: ignore[attr-defined]
    for local_name, param in model.named_parameters():
        name = global_param_name(local_name, layer_offset)
        param.copy_(_initial_value(name, param.shape, seed, config))


def stage_state_from_reference(
    model: torch.nn.Module, reference: Mapping[str, torch.Tensor], layer_offset: int
) -> dict[str, torch.Tensor]:
    """The entries of a one-stage model's state dict that this stage's model holds."""
    state = {}
    for name, value in model.state_dict().items():
        if name.endswith("_extra_state"):
            state[name] = value
            continue
        source = global_param_name(name, layer_offset)
        if source not in reference:
            raise ConfigError(f"the reference state has no {source!r} (for {name!r})")
        state[name] = reference[source]
    return state


def microbatch_tokens(
    preset: GPTPreset, seed: int, index: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic (input ids, labels) of the global batch's microbatch `index` (replica r's
    microbatch m is index r x M + m with M microbatches per replica; a rebalance moves
    microbatches, not their data): fixed by (seed, index), the same in every iteration and
    under every policy and split, so a model can learn them (any seed: the generator's is
    taken modulo 2^64, what it holds)."""
    generator = torch.Generator().manual_seed((seed * 1_000_003**2 + index) % 2**64)
    shape = (preset.micro_batch_size, preset.seq_length + 1)
    tokens = torch.randint(0, preset.vocab_size, shape, generator=generator)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
