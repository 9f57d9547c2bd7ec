"""The `megatron` compute backend: each worker runs its stage of a megatron-core GPTModel.

F, B and W are separate ops (B: input gradient only; W: the deferred weight gradients), BW
runs B then W. After the last op of an iteration the worker's DP ring sums this stage's
gradients over its replicas (`dp_gradient`: one flat fp32 buffer, over the DP links and their
faults, like every other message; each microbatch's loss is already divided by the global
batch's microbatch count, so the sum is the DP average), then the worker sums the tied
embedding's gradient of the first and the last stage (`tied_weight`: megatron's embedding
group, over the plan's transport; after the DP sum, megatron's order, so both copies keep
the same bits), and plain SGD steps. In a rank swap a worker builds the stage
it takes over and gets that stage's state from its last player (`export_state`, `import_state`).
A replica computes its microbatches of the global batch (`IterationConfig.microbatch_offset`:
a rebalance gives replicas unequal counts) and scales each loss by 1 / the global count, so
the DP sum stays the batch's mean. Its last stage reports its replica's part of the loss, and
the driver sums the parts (`replicas_loss`): no collective runs outside the transport, where
a NIC that the delegates fail over would hang it (a gloo all-reduce among the last stages
did, until the run restarted).
On a CPU, megatron's CUDA-only spots are patched around every call into megatron
(`shim.cpu_shim`); on a GPU nothing is patched. A worker on a GPU builds its stage there
(`build_initial_stage`: megatron's RNG tracker seeded first, then the model, moved whole to
the GPU); the project's machines have no GPU, so that build is tested on a CPU with the meta
device standing in for the GPU (`shim.gpu_stand_in`), and its training only by the GPU check
(benchmarks/gpu/).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from pipeline.errors import BackendError, ConfigError
from pipeline.ops import OpKind
from pipeline.profile import Profile
from pipeline.runtime.compute import GradientLayout
from pipeline.runtime.config import IterationConfig, StepOutput
from pipeline.runtime.devices import RankDevices
from pipeline.runtime.megatron.model import (
    DTYPE,
    ELEMENT_BYTES,
    GPTPreset,
    build_stage_model,
    get_preset,
    global_param_name,
    initialize_parameters,
    microbatch_tokens,
    stage_layer_offset,
    stage_state_from_reference,
)
from pipeline.runtime.megatron.shim import cpu_shim, quiet_megatron, seed_cpu_rng_tracker
from pipeline.runtime.megatron.stage import StageRunner, sgd_step

__all__ = ["MegatronCompute", "build_initial_stage", "seed_rng_tracker", "set_initial_parameters"]


class MegatronCompute:
    """Built in the controller (cheap, picklable: it only checks its settings), set up in the
    worker. `model`: a preset's name or a preset. `init_state`: a file with the whole model's
    state dict (torch.save) to start from, e.g. a single-process reference's, instead of
    seeded initialisation. `allow_tf32`: on a GPU, float32 matrix products on tensor cores
    (TF32); off by default, so a GPU run computes in float32 as a CPU run does. On a GPU
    every op ends by waiting for its kernels, so that its record is its compute time."""

    uses_gpu = True

    def __init__(
        self,
        model: str | GPTPreset = "tiny",
        *,
        seed: int = 0,
        lr: float = 0.5,
        init_state: str | None = None,
        allow_tf32: bool = False,
    ) -> None:
        self.preset = get_preset(model) if isinstance(model, str) else model
        self.allow_tf32 = allow_tf32
        if lr <= 0:
            raise ConfigError(f"lr must be > 0, got {lr:g}")
        self.seed, self.lr, self.init_state = seed, lr, init_state
        self.device = torch.device("cpu")
        """Where messages live (`RankDevices.message_device`)."""
        self._compute_device = torch.device("cpu")
        """Where the model runs: messages are copied between the two where they differ."""
        self._stage = self._num_stages = self._replica = 0
        self._runner: StageRunner | None = None
        self._initial: dict[str, Any] | None = None
        """The position's initial state (parameters and buffers), once drawn."""
        self._holds_state = False
        """Whether the model holds a state (initial, imported, loaded): not after a `move`
        until `import_state` or `begin_iteration` gives it one."""
        self._layer_offset = 0
        self._num_replicas = 1
        self._first_microbatch = 0
        """The global batch index of this replica's microbatch 0 this iteration."""
        self._dp_sums: torch.Tensor | None = None
        """The flat gradient handed to the DP ring this iteration (`dp_gradient`)."""
        self._step_grads: dict[str, torch.Tensor] | None = None
        """The gradients the step took, by whole-model name, for `after_step` to copy out
        (`collect_grads`; the step drops them from the parameters, not their values)."""

    def setup(self, stage: int, num_stages: int, replica: int, devices: RankDevices) -> None:
        with quiet_megatron():
            self._setup(stage, num_stages, replica, devices)

    def _setup(self, stage: int, num_stages: int, replica: int, devices: RankDevices) -> None:
        from megatron.core import parallel_state

        self.preset.check_stages(num_stages)
        self._stage, self._num_stages, self._replica = stage, num_stages, replica
        self.device = torch.device(devices.message_device)
        self._compute_device = torch.device(devices.compute_device)
        if self._compute_device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = self.allow_tf32
        # Ranks as the runtime numbers them (replica * S + stage): PP varies fastest after TP.
        parallel_state.initialize_model_parallel(
            pipeline_model_parallel_size=num_stages,
            order="tp-pp-dp",
            create_gloo_process_groups=False,
        )
        placed = (
            parallel_state.get_pipeline_model_parallel_rank(),
            parallel_state.get_data_parallel_rank(),
        )
        if placed != (stage, replica):
            raise BackendError(
                f"megatron placed this rank at (stage, replica) {placed}, the runtime at "
                f"{(stage, replica)}"
            )
        self._num_replicas = dist.get_world_size() // num_stages
        self._build(stage, replica)

    def _build(self, stage: int, replica: int, *, initialise: bool = True) -> None:
        """The model of position (stage, replica), at its initial parameters (`initialise`)
        or at none yet."""
        self._stage, self._replica = stage, replica
        self._layer_offset = stage_layer_offset(self.preset, stage, self._num_stages)
        model = build_initial_stage(
            self.preset,
            stage,
            self._num_stages,
            seed=self.seed,
            device=self._compute_device,
            init_state=self.init_state,
            initialise=initialise,
        )
        self._runner = StageRunner(model)
        self._initial = _state_copy(model) if initialise else None
        self._holds_state = initialise

    def _initial_state(self) -> dict[str, Any]:
        """The position's initial state, drawn into the model the first time."""
        if self._initial is None:
            model = self.runner.model
            set_initial_parameters(
                model, self.preset, self._stage, self._num_stages,
                seed=self.seed, init_state=self.init_state,
            )  # fmt: skip
            self._initial = _state_copy(model)
        return self._initial

    def ties(self, stage: int, num_stages: int) -> bool:
        return num_stages > 1 and stage in (0, num_stages - 1)

    @contextlib.contextmanager
    def _shim(self) -> Iterator[None]:
        if self._compute_device.type == "cpu":
            with cpu_shim():
                yield
        else:
            yield

    @property
    def runner(self) -> StageRunner:
        if self._runner is None:
            raise BackendError("the megatron backend is not set up (setup() was not called)")
        return self._runner

    def message_buffer(self, profile: Profile) -> torch.Tensor:
        return torch.empty(self.preset.message_shape(), dtype=DTYPE, device=self.device)

    def move(self, stage: int, replica: int) -> None:
        """Play position (stage, replica): its model, at its initial parameters until
        `import_state` gives it the state its last player had. They are drawn only where
        that does not follow (the next `begin_iteration` draws them): in a rank swap, drawing
        a whole stage's weights to overwrite them was wasted time inside the swap's record."""
        with quiet_megatron():
            self._build(stage, replica, initialise=False)

    def state_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._state_tensors())

    def export_state(self) -> torch.Tensor:
        """The model's whole training state as one byte buffer: its parameters and buffers in
        state-dict order (plain SGD keeps no other state)."""
        tensors = self._state_tensors()
        if not tensors:
            return torch.empty(0, dtype=torch.uint8)
        return torch.cat([t.detach().to("cpu").contiguous().view(-1).view(torch.uint8)
                          for t in tensors])  # fmt: skip

    @torch.no_grad()
    def import_state(self, state: torch.Tensor) -> None:
        """Set the model's state from `export_state`'s bytes of the same position."""
        tensors = self._state_tensors()
        if state.numel() != sum(t.numel() * t.element_size() for t in tensors):
            raise BackendError(
                f"a model state of {state.numel()} bytes does not fit stage {self._stage}'s model"
            )
        offset = 0
        for tensor in tensors:
            size = tensor.numel() * tensor.element_size()
            part = state[offset : offset + size].view(tensor.dtype).view(tensor.shape)
            tensor.copy_(part)
            offset += size
        self._holds_state = True

    def _state_tensors(self) -> list[torch.Tensor]:
        return [v for v in self.runner.model.state_dict(keep_vars=True).values()
                if isinstance(v, torch.Tensor)]  # fmt: skip

    def begin_iteration(self, config: IterationConfig) -> None:
        runner = self.runner
        runner.reset()
        self._dp_sums = None  # a failed iteration's
        # After a restart the last checkpoint; in a new run, or after a move that no state
        # followed, the initial weights.
        checkpoint = config.load_checkpoint
        loads = checkpoint is not None or config.iteration == 0 or not self._holds_state
        if checkpoint is not None:
            state = torch.load(
                self._checkpoint_file(checkpoint),
                map_location=self._compute_device,
                weights_only=True,
            )
            runner.model.load_state_dict(state)
        elif loads:
            runner.model.load_state_dict(self._initial_state())
        if loads:
            self._holds_state = True
            for param in runner.params:
                param.grad = None
            if self._compute_device.type == "cuda":  # the loads' copies run asynchronously:
                torch.cuda.synchronize(self._compute_device)  # not in the first op's record
        runner.loss_scale = 1.0 / config.num_global_microbatches
        self._first_microbatch = config.microbatch_offset(self._replica)

    def _checkpoint_file(self, directory: str) -> Path:
        return Path(directory) / f"stage{self._stage}-replica{self._replica}.pt"

    def _tokens(self, microbatch: int) -> tuple[torch.Tensor, torch.Tensor]:
        index = self._first_microbatch + microbatch
        tokens, labels = microbatch_tokens(self.preset, self.seed, index)
        return tokens.to(self._compute_device), labels.to(self._compute_device)

    def run(
        self, kind: OpKind, microbatch: int, inputs: torch.Tensor | None, profile: Profile
    ) -> torch.Tensor | None:
        runner = self.runner
        if inputs is not None:
            inputs = inputs.to(self._compute_device)  # the received message, off the host
        with self._shim():
            if kind is OpKind.F:
                tokens, labels = self._tokens(microbatch)
                output = runner.forward(
                    microbatch,
                    tokens=tokens if runner.first else None,
                    labels=labels if runner.last else None,
                    stage_input=None if runner.first else inputs,
                )
            elif kind is OpKind.W:
                runner.backward_weight(microbatch)
                output = None
            else:
                output = runner.backward_input(microbatch, inputs)
                if kind is OpKind.BW:
                    runner.backward_weight(microbatch)
        if self._compute_device.type == "cuda":
            torch.cuda.synchronize(self._compute_device)  # the op's record: its kernels' time
        return None if output is None else output.to(self.device)

    def tied_weight(self) -> torch.Tensor | None:
        runner = self.runner
        if self._num_stages == 1 or not (runner.first or runner.last):
            return None
        weight: torch.Tensor = runner.model.shared_embedding_or_output_weight()
        return weight

    def dp_gradient_layout(self, profile: Profile) -> GradientLayout:
        """The stage's parameters' fp32 gradients; the profile's `allreduce_bytes` for the
        stage must be 0 (it told the planner nothing) or theirs."""
        params = self.runner.params
        element_bytes = params[0].element_size() if params else ELEMENT_BYTES
        num_bytes = sum(p.numel() * p.element_size() for p in params)
        told = profile.allreduce_bytes[self._stage]
        if told not in (0, num_bytes):
            raise ConfigError(
                f"the profile's allreduce_bytes for stage {self._stage} is {told}; model "
                f"{self.preset.name!r}'s stage {self._stage} of {self._num_stages} has "
                f"{num_bytes} bytes of gradients (give 0 or that)"
            )
        return GradientLayout(num_bytes, element_bytes)

    @torch.no_grad()
    def dp_gradient(self) -> torch.Tensor:
        """Every parameter's gradient (zeros where none was made) in one flat buffer."""
        self._dp_sums = torch.cat(
            [p.grad.reshape(-1) if p.grad is not None else torch.zeros_like(p).reshape(-1)
             for p in self.runner.params]
        ).to(self.device)  # fmt: skip
        return self._dp_sums

    @torch.no_grad()
    def take_dp_sums(self) -> None:
        """The ring's sums back into the gradients (none without a ring this iteration)."""
        sums, self._dp_sums = self._dp_sums, None
        if sums is None:
            return
        offset = 0
        for param in self.runner.params:
            part = sums[offset : offset + param.numel()].view_as(param)
            if param.grad is None:
                param.grad = part.to(param.device, copy=True)
            else:
                param.grad.copy_(part)
            offset += param.numel()

    def end_iteration(self, config: IterationConfig) -> StepOutput:
        runner = self.runner
        runner.check_drained()
        model = runner.model
        loss = None
        if runner.last:  # this replica's part: the driver sums the replicas' (`replicas_loss`)
            loss = float(sum(runner.losses.values()) * runner.loss_scale)
        self._step_grads = None
        if config.collect_grads:
            self._step_grads = {
                global_param_name(name, self._layer_offset): p.grad
                for name, p in model.named_parameters()
                if p.grad is not None
            }
        sgd_step(runner.params, self.lr)  # plain SGD: the parameters are the whole state
        if self._compute_device.type == "cuda":
            torch.cuda.synchronize(self._compute_device)  # the step's record: its kernels' time
        return StepOutput(loss)

    def after_step(self, config: IterationConfig, output: StepOutput) -> StepOutput:
        """The checkpoint, then the copies asked for (outside the step time)."""
        model = self.runner.model
        if config.save_checkpoint is not None:
            path = self._checkpoint_file(config.save_checkpoint)
            torch.save(model.state_dict(), path.with_suffix(".tmp"))
            path.with_suffix(".tmp").replace(path)  # whole or absent
        taken, self._step_grads = self._step_grads, None
        grads = None if taken is None else {name: _to_numpy(g) for name, g in taken.items()}
        params = None
        if config.collect_params:
            params = tuple(
                (global_param_name(name, self._layer_offset), _to_numpy(p))
                for name, p in model.named_parameters()
            )
        return dataclasses.replace(output, grads=grads, params=params)


def build_initial_stage(
    preset: GPTPreset,
    stage: int,
    num_stages: int,
    *,
    seed: int,
    device: torch.device,
    init_state: str | None = None,
    initialise: bool = True,
) -> Any:
    """Stage `stage` of `num_stages` as a worker builds it, whole on `device` (its GPU's
    index must be `torch.cuda.current_device()`): megatron's RNG tracker seeded first (what
    forks it then finds its states), the model built, then, if `initialise`, its initial
    parameters set (`set_initial_parameters`). Inside megatron's parallel state (`setup`,
    `single_process_megatron`)."""
    torch.manual_seed(seed)  # torch's own modules draw an initialisation that is replaced
    seed_rng_tracker(seed, device)
    on_cpu = device.type == "cpu"
    with cpu_shim(building=True) if on_cpu else contextlib.nullcontext():
        model = build_stage_model(preset, stage, num_stages, device=device)
    if initialise:
        set_initial_parameters(model, preset, stage, num_stages, seed=seed, init_state=init_state)
    return model


def set_initial_parameters(
    model: Any,
    preset: GPTPreset,
    stage: int,
    num_stages: int,
    *,
    seed: int,
    init_state: str | None = None,
) -> None:
    """Stage `stage`'s initial parameters into its `model`: from `seed`
    (`initialize_parameters`) or from the whole model's state in file `init_state`."""
    layer_offset = stage_layer_offset(preset, stage, num_stages)
    if init_state is not None:
        reference = torch.load(init_state, map_location="cpu", weights_only=True)
        model.load_state_dict(stage_state_from_reference(model, reference, layer_offset))
    else:
        initialize_parameters(model, seed, layer_offset)


def seed_rng_tracker(seed: int, device: torch.device) -> None:
    """Seed megatron's CUDA RNG tracker for a model on `device` (on a CPU its twin with CPU
    generator states, `seed_cpu_rng_tracker`): attention forks it in every forward, and
    megatron's own initialisation on a GPU (which `build_stage_model` leaves out) while
    a model is built."""
    if device.type == "cpu":
        seed_cpu_rng_tracker(seed)
    else:
        from megatron.core import tensor_parallel

        tensor_parallel.model_parallel_cuda_manual_seed(seed)


def _state_copy(model: Any) -> dict[str, Any]:
    return {
        k: v.detach().clone() if isinstance(v, torch.Tensor) else v
        for k, v in model.state_dict().items()
    }


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to("cpu").numpy().copy()
