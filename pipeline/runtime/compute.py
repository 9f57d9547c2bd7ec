"""Compute backends: what a worker does for an op. `emulated` sleeps the profiled time (and
the optimizer's, `Profile.optimizer_ms`, at the end of the iteration)."""

from __future__ import annotations

import dataclasses
from typing import Protocol

import torch

from pipeline.ops import OpKind
from pipeline.profile import Profile
from pipeline.runtime.config import IterationConfig, StepOutput
from pipeline.runtime.devices import RankDevices
from pipeline.runtime.sleep import PreciseSleep

__all__ = ["ComputeBackend", "EmulatedCompute", "GradientLayout"]


@dataclasses.dataclass(frozen=True, slots=True)
class GradientLayout:
    """What a position's DP ring sums with its stage's other replicas (pipeline.runtime.
    dp_ring): `num_bytes` in elements of `element_bytes` each (1: bytes of zeros, an emulated
    gradient; 4: a real fp32 one, whose chunks hold whole elements)."""

    num_bytes: int
    element_bytes: int = 1


class ComputeBackend(Protocol):
    """Built inside the worker by `setup`; `run` executes one op of this worker's stage.

    `inputs` is the received activation (F) or gradient (B, BW) or None; the returned tensor
    is the message to send (F: activation downstream, B/BW: gradient upstream) or None.
    """

    device: torch.device
    """Where messages live (`RankDevices.message_device`): the host, where gloo sends from;
    a backend that computes elsewhere (a GPU) copies its messages here and back."""

    uses_gpu: bool
    """Whether the backend computes on a GPU where the host has one: only then does its
    worker take one (`pipeline.runtime.devices`), whose CUDA context it would otherwise
    make for nothing (memory, start-up time, and on an exclusive-process GPU a refusal)."""

    def setup(self, stage: int, num_stages: int, replica: int, devices: RankDevices) -> None: ...

    def run(
        self, kind: OpKind, microbatch: int, inputs: torch.Tensor | None, profile: Profile
    ) -> torch.Tensor | None: ...

    def message_buffer(self, profile: Profile) -> torch.Tensor:
        """An empty receive buffer for one message."""
        ...

    def begin_iteration(self, config: IterationConfig) -> None:
        """Before the iteration's first op (iteration 0 starts from the initial state)."""
        ...

    def move(self, stage: int, replica: int) -> None:
        """Play position (stage, replica) from now on (a rank swap): a backend with model
        state builds that stage's model, at its initial state until `import_state`."""
        ...

    def state_bytes(self) -> int:
        """The size of `export_state`'s buffer for the position played now (0: no state)."""
        ...

    def export_state(self) -> torch.Tensor:
        """The position's whole training state as one uint8 buffer (what a rank swap moves to
        the position's next player)."""
        ...

    def import_state(self, state: torch.Tensor) -> None:
        """Take the state its last player exported for the position played now."""
        ...

    def ties(self, stage: int, num_stages: int) -> bool:
        """Whether stage `stage` has a `tied_weight` (known before its model is built)."""
        ...

    def tied_weight(self) -> torch.Tensor | None:
        """The parameter this stage shares with another stage of its replica: the first
        stage's with the last's (megatron's tied embedding and output weight, S > 1). After
        the DP ring the worker sums its gradient with the other stage's (pipeline.topology's
        `tied_link`); None where nothing is tied."""
        ...

    def dp_gradient_layout(self, profile: Profile) -> GradientLayout:
        """The gradient the DP ring sums for the position played now: the model's own, or
        the profile's `allreduce_bytes` where the backend has none."""
        ...

    def dp_gradient(self) -> torch.Tensor | None:
        """After the last op, where the stage has replicas: its gradient as one flat tensor of
        `dp_gradient_layout`'s size, which the DP ring sums in place (`take_dp_sums` takes the
        sums from it); None: nothing real to sum (the ring carries zeros)."""
        ...

    def take_dp_sums(self) -> None:
        """After the DP ring (every iteration; nothing to do without one or without a real
        gradient): its sums, in `dp_gradient`'s tensor, into the gradients, before the tied
        sum adds the other stage's summed copy to `tied_weight`'s."""
        ...

    def end_iteration(self, config: IterationConfig) -> StepOutput:
        """After the last op and the DP and tied gradient sums, inside the step time: the
        optimizer step (its output: the loss)."""
        ...

    def after_step(self, config: IterationConfig, output: StepOutput) -> StepOutput:
        """After `end_iteration`, once the step's end is stamped (outside the step time):
        what the iteration reports or keeps beyond the step, added to `output` (gradients,
        parameters for a digest: `collect_grads`, `collect_params`; a checkpoint:
        `save_checkpoint`)."""
        ...


class EmulatedCompute:
    """Each op sleeps its profiled duration; messages have the profile's size in bytes."""

    uses_gpu = False

    def __init__(self) -> None:
        self._stage = 0
        self.device = torch.device("cpu")
        self._payload = torch.empty(0, dtype=torch.uint8)
        self._sleep = PreciseSleep()

    def setup(self, stage: int, num_stages: int, replica: int, devices: RankDevices) -> None:
        self._stage = stage
        self.device = torch.device(devices.message_device)

    def message_buffer(self, profile: Profile) -> torch.Tensor:
        return torch.empty(profile.message_bytes, dtype=torch.uint8, device=self.device)

    def begin_iteration(self, config: IterationConfig) -> None:
        pass

    def move(self, stage: int, replica: int) -> None:
        self._stage = stage

    def state_bytes(self) -> int:
        return 0

    def export_state(self) -> torch.Tensor:
        return torch.empty(0, dtype=torch.uint8)

    def import_state(self, state: torch.Tensor) -> None:
        pass

    def ties(self, stage: int, num_stages: int) -> bool:
        return False

    def tied_weight(self) -> torch.Tensor | None:
        return None

    def dp_gradient_layout(self, profile: Profile) -> GradientLayout:
        return GradientLayout(profile.allreduce_bytes[self._stage])

    def dp_gradient(self) -> torch.Tensor | None:
        return None

    def take_dp_sums(self) -> None:
        return None

    def end_iteration(self, config: IterationConfig) -> StepOutput:
        optimizer_ms = config.profile.optimizer_ms[self._stage]
        if optimizer_ms > 0:
            self._sleep(optimizer_ms / 1000.0)
        return StepOutput()

    def after_step(self, config: IterationConfig, output: StepOutput) -> StepOutput:
        return output

    def run(
        self, kind: OpKind, microbatch: int, inputs: torch.Tensor | None, profile: Profile
    ) -> torch.Tensor | None:
        stage = self._stage
        duration_ms = {
            OpKind.F: profile.t_f_ms[stage],
            OpKind.B: profile.t_b_ms[stage],
            OpKind.W: profile.t_w_ms[stage],
            OpKind.BW: profile.t_b_ms[stage] + profile.t_w_ms[stage],
        }[kind]
        self._sleep(duration_ms / 1000.0)  # on time; idle but for its last ~0.3 ms
        if kind is OpKind.W:
            return None
        if self._payload.numel() != profile.message_bytes:
            self._payload = torch.zeros(
                profile.message_bytes, dtype=torch.uint8, device=self.device
            )
        return self._payload
