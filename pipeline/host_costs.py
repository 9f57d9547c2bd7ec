"""What the worker runtime costs on one host beyond a profile's op times: the calibration file.

`adaptra-bench calibrate --out HOST.json` measures these costs with microbenchmarks of the
real runtime (pipeline.runtime.calibrate); `simulate`, `run --backend sim` and specs take the
file (`--calibration`, a spec's `calibration:`), so that the simulator's `direct` and
`delegated` modes predict a real run on that host. Without one every cost is 0 (`FREE`): the
paper's model, exactly.

The file is a JSON object: `schema_version` (1), the five costs below in ms, and free-form
`host` and `measured_at` strings.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError
from pipeline.files import parse_json_file

__all__ = ["FREE", "HOST_COSTS_SCHEMA_VERSION", "HostCosts"]

HOST_COSTS_SCHEMA_VERSION = 1
_COSTS = (
    "send_fixed_ms",
    "send_ms_per_mib",
    "receive_lag_ms",
    "receive_lag_ms_per_mib",
    "op_overhead_ms",
)
_DELEGATE_COSTS = (
    "copy_out_fixed_ms",
    "copy_out_ms_per_mib",
    "delegate_pickup_ms",
    "copy_in_fixed_ms",
    "copy_in_ms_per_mib",
    "failover_ms",
)
"""The delegated path's costs: optional in a file (one measured without delegates: 0)."""
_RING_COSTS = ("ring_lag_ms", "delegated_ring_lag_ms")
"""The DP ring's: optional in a file (one written before it was measured: 0)."""
_MIB = 1 << 20


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class HostCosts:
    send_fixed_ms: float = 0.0
    """A blocking send holds its sender this long per message (sizes aside)..."""
    send_ms_per_mib: float = 0.0
    """...plus this long per MiB of payload."""
    receive_lag_ms: float = 0.0
    """From a send's return to the start of the op that waited for the message (sizes
    aside: the receiver still reads what the sender's socket took)..."""
    receive_lag_ms_per_mib: float = 0.0
    """...plus this long per MiB."""
    op_overhead_ms: float = 0.0
    """The runtime's own time between one op and the next on a stage (bookkeeping)."""
    copy_out_fixed_ms: float = 0.0
    """Delegated: handing a message to its delegate holds the sender this long (its copy
    into a slot and the job), plus..."""
    copy_out_ms_per_mib: float = 0.0
    """...this long per MiB."""
    delegate_pickup_ms: float = 0.0
    """Delegated: from the hand-over until a free delegate has picked the message up."""
    copy_in_fixed_ms: float = 0.0
    """Delegated: the copy of an arrived message into its op's buffer, before the op, plus..."""
    copy_in_ms_per_mib: float = 0.0
    """...this long per MiB."""
    failover_ms: float = 0.0
    """Delegated: a link direction's move to another NIC, from its sender delegate noticing
    the failure to the connection over the next NIC taking over (adaptra.transport)."""
    ring_lag_ms: float = 0.0
    """A DP ring's chunk can be forwarded this much later than a PP message of its size
    could be used: the ring's receiver hand-off and its share of the host's cores while every
    stage runs its ring at once (pipeline.runtime.dp_ring)."""
    delegated_ring_lag_ms: float = 0.0
    """The same, for a ring whose chunks go over the delegates (the plan delegates its link
    directions), in place of `ring_lag_ms`."""
    host: str = ""
    measured_at: str = ""

    def __post_init__(self) -> None:
        for name in (*_COSTS, *_DELEGATE_COSTS, *_RING_COSTS):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{name} must be a number of ms, got {value!r}")
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"{name} must be finite and >= 0 ms, got {value!r}")
            object.__setattr__(self, name, float(value))

    def send_ms(self, num_bytes: int) -> float:
        """How long a blocking send of `num_bytes` holds its sender."""
        return self.send_fixed_ms + self.send_ms_per_mib * num_bytes / _MIB

    def receive_lag_for_ms(self, num_bytes: int) -> float:
        """From a send's return until the message can be used, when the receiver waits."""
        return self.receive_lag_ms + self.receive_lag_ms_per_mib * num_bytes / _MIB

    def copy_out_ms(self, num_bytes: int) -> float:
        return self.copy_out_fixed_ms + self.copy_out_ms_per_mib * num_bytes / _MIB

    def copy_in_ms(self, num_bytes: int) -> float:
        return self.copy_in_fixed_ms + self.copy_in_ms_per_mib * num_bytes / _MIB

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": HOST_COSTS_SCHEMA_VERSION, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data: Any) -> HostCosts:
        if not isinstance(data, dict):
            raise ConfigError("a calibration is a JSON object of costs in ms")
        values = dict(data)
        version = values.pop("schema_version", None)
        if version != HOST_COSTS_SCHEMA_VERSION:
            raise ConfigError(
                f"calibration schema_version {version!r} is not supported "
                f"(expected {HOST_COSTS_SCHEMA_VERSION}; run `adaptra-bench calibrate` again)"
            )
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - fields)
        missing = [name for name in _COSTS if name not in values]
        if unknown or missing:
            raise ConfigError(
                f"calibration: unknown key(s) {unknown or 'none'}, missing {missing or 'none'}; "
                f"keys: schema_version, {', '.join(sorted(fields))}"
            )
        for name in ("host", "measured_at"):
            values[name] = str(values.get(name, ""))
        return cls(**values)

    @classmethod
    def from_file(cls, path: str | Path) -> HostCosts:
        return parse_json_file(path, "calibration", cls.from_dict)


FREE = HostCosts()
"""No costs: the simulator's plain model."""
