"""What the controller sends a worker for one iteration, and what it gets back."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from pipeline.errors import ConfigError
from pipeline.faults import NO_FAULTS, IterationFaults
from pipeline.profile import Profile
from pipeline.runtime.hooks import FaultHook
from pipeline.schedule import ReplicaSchedules, Schedule
from pipeline.topology import Direction, Topology

if TYPE_CHECKING:  # torch with it: the controller's side needs not import it for this
    from pipeline.runtime.transport import Failover

__all__ = ["COMMS", "IterationConfig", "RankResult", "StateMove", "StepOutput", "replicas_loss"]

COMMS = ("direct", "delegated")


@dataclasses.dataclass(frozen=True, slots=True)
class IterationConfig:
    """One iteration's setting: workers take a new one at every iteration boundary."""

    iteration: int
    schedule: Schedule
    profile: Profile
    comm: str = "direct"
    """How PP messages go ("direct" or "delegated"), but on the link directions of
    `link_comms`."""
    link_comms: tuple[tuple[str, Direction, str], ...] = ()
    """(link, direction, comm) where a link direction goes another way than `comm`."""
    topology: Topology | None = None
    """Which worker plays which position this iteration (None: the default placement)."""
    replica_schedules: ReplicaSchedules | None = None
    """Each DP replica's own schedule on its share of the global batch (None: every replica
    runs `schedule`, on `profile.num_microbatches` microbatches)."""
    faults: IterationFaults = NO_FAULTS
    """What the faults in force this iteration do to each message (injectors build it)."""
    fault_hook: FaultHook | None = None
    """None: the runtime's own hook (FaultViewHook): the profile's `delay_ms` plus `faults`."""
    collect_grads: bool = False
    """Backends that train (megatron): return every parameter's gradient, after the DP and
    tied-embedding all-reduces and before the optimizer step (for tests; copied after the
    step time)."""
    collect_params: bool = False
    """Backends that train: return every parameter after the step (pipeline.runtime.digest;
    copied after the step time)."""
    save_checkpoint: str | None = None
    """Backends that train: after the step (and its time), write this stage's state into
    this directory (a checkpoint a restart resumes from)."""
    load_checkpoint: str | None = None
    """Backends that train: before the first op, load this stage's state from this
    directory (the first iteration after a restart)."""

    def __post_init__(self) -> None:
        for comm in (self.comm, *(c for _, _, c in self.link_comms)):
            if comm not in COMMS:
                raise ConfigError(f"comm {comm!r}: the runtime has {', '.join(COMMS)}")

    def schedule_of(self, replica: int) -> Schedule:
        """The schedule replica `replica` runs."""
        split = self.replica_schedules
        return self.schedule if split is None else split.schedules[replica]

    def microbatch_offset(self, replica: int) -> int:
        """The global batch index of replica `replica`'s microbatch 0."""
        split = self.replica_schedules
        return replica * self.schedule.num_microbatches if split is None else split.offset(replica)

    @property
    def num_global_microbatches(self) -> int:
        """The microbatches of all replicas together, as their schedules run them (not the
        profile's count, which nothing requires a schedule to match)."""
        split = self.replica_schedules
        if split is None:
            return self.profile.num_replicas * self.schedule.num_microbatches
        return sum(split.counts)

    def comm_of(self, link: str, direction: Direction) -> str:
        """How the messages of `link` ("0-1", every replica) in `direction` go."""
        for named, way, comm in self.link_comms:
            if (named, way) == (link, direction):
                return comm
        return self.comm


@dataclasses.dataclass(frozen=True, slots=True)
class StepOutput:
    """What a compute backend reports after an iteration's step (emulated: nothing)."""

    loss: float | None = None
    """A last stage's replica's part of the iteration's mean loss over the global batch (a
    training backend; `replicas_loss` sums the parts)."""
    grads: dict[str, np.ndarray] | None = None
    """Parameter gradients by the whole model's parameter names, if asked for."""
    params: tuple[tuple[str, np.ndarray], ...] | None = None
    """The stage's parameters after the step, by the whole model's names, in the stage's
    order, if asked for."""


@dataclasses.dataclass(frozen=True, slots=True)
class StateMove:
    """A worker's part in a rank swap: it left position (from_stage, from_replica) for the
    one its result names, sending that position's state on and taking in the new one's
    (`num_bytes` each way; 0 for a backend without state, or where the iteration starts
    from the initial state or a checkpoint anyway), then set the iteration up there.
    Times: monotonic s, from the swap's start to the set-up's end."""

    from_stage: int
    from_replica: int
    num_bytes: int
    start_s: float
    end_s: float


@dataclasses.dataclass(frozen=True, slots=True)
class RankResult:
    """A rank's records for one iteration; times in seconds on the host's monotonic clock."""

    rank: int
    stage: int
    replica: int
    pid: int
    ops: list[tuple[str, int, float, float]]
    """(kind, microbatch, start, end)."""
    sends: list[tuple[str, Direction, int, int, float, float, float, float, int]]
    """(link, direction, microbatch, bytes, send start, send end, fault ms, wire start,
    carrier pid): the sender is busy from send start to send end (direct: the whole send;
    delegated: the copy out), the wire carries it from wire start (direct: the send start;
    delegated: when a delegate picked it up) in the process `carrier pid`."""
    receives: list[tuple[str, Direction, int, float, float, float]]
    """(link, direction, microbatch, arrived, needed, copy in) per message an op took in:
    when it arrived (receiver.py; delegated: the receiver delegate's stamp), when the op began
    to wait for it, and how long its copy into the op's buffer took (delegated; 0 direct)."""
    step_start: float
    step_end: float
    bytes_sent: int
    """What this rank sent over gloo (the direct transport: messages, DP chunks, state moves,
    tied sums). Delegated messages are not in it: their bytes are in `sends`."""
    step_output: StepOutput = StepOutput()
    failovers: list[Failover] = dataclasses.field(default_factory=list)
    """Its sender delegates' moves to another NIC (delegated)."""
    moved: StateMove | None = None
    """Its move to another position at the start of the iteration (a rank swap)."""


def replicas_loss(results: Sequence[RankResult]) -> float | None:
    """The iteration's mean loss over the global batch: the sum of its replicas' parts (each
    last stage's `StepOutput.loss`), summed here rather than by a collective among the last
    stages, outside the transport, which a failed NIC the delegates fail over would hang.
    None where no rank gave one (the emulated backend)."""
    parts = sorted(
        (r.replica, r.step_output.loss) for r in results if r.step_output.loss is not None
    )
    return math.fsum(loss for _, loss in parts) if parts else None
