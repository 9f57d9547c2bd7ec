"""What the worker runtime costs on one host beyond a profile's op times: the calibration file.

`adaptra-bench calibrate --out HOST.json` measures these costs with microbenchmarks of the
real runtime (pipeline.runtime.calibrate); `simulate`, `run --backend sim` and specs take the
file (`--calibration`, a spec's `calibration:`), so that the simulator's `direct` and
`delegated` modes predict a real run on that host. Without one every cost is 0 (`FREE`): the
paper's model, exactly.

The file is a JSON object: `schema_version` (5; 3 and 4 are read too), the costs below (a
cost that depends on a message's size is a `CostCurve`, written as `[[bytes, ms], ...]`; the
DP ring's lag is a `RingLag`, by the number of rings running at once and the chunk's size,
`[[rings, [[bytes, ms], ...]], ...]`; the others are ms; every cost in 0..MAX_DURATION_MS,
an hour, as a profile's times), free-form `host` and
`measured_at` strings, and what a run to predict should match (only the host is checked,
with a warning): the ops' length (`op_ms`), the stages (`num_stages`) and the code's
revision (`git_revision`).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import platform
from pathlib import Path
from typing import Any

from pipeline.checks import check_ms
from pipeline.errors import ConfigError
from pipeline.files import parse_json_file

__all__ = [
    "CALIBRATION_STAGES",
    "DEFAULT_CALIBRATION_OP_MS",
    "FREE",
    "HOST_COSTS_SCHEMA_VERSION",
    "MAX_CALIBRATION_OP_MS",
    "NO_COST",
    "NO_RING_LAG",
    "CostCurve",
    "HostCosts",
    "RingLag",
]

DEFAULT_CALIBRATION_OP_MS = 10.0
"""How long a calibration's ops last unless asked (pipeline.runtime.calibrate: why)."""
CALIBRATION_STAGES = (2, 16)
"""The fewest and most stages a calibration runs (`calibrate --stages`)."""
MAX_CALIBRATION_OP_MS = 60_000.0
"""The longest ops a calibration runs (`calibrate --op-ms`)."""

HOST_COSTS_SCHEMA_VERSION = 5
"""5: the DP ring's lag is by the chunk's size too, at each number of rings (a chunk of
40 MB, sent back to back with traffic both ways, cost about 0.8 ms per MB here, where a PP
message of 8 MiB between ops cost 0.5: the lag measured at 125 kB chunks alone predicted
the default bucket's 40 MB chunks' step 1.3-5.6x short), never falling with more rings; a
delegate's transfer is measured (`delegate_transfer_ms_by_bytes`; the direct path's send and
receive lag, charged before, were 1.7-2.2x it at 1-8 MiB here); and the copy in is from the
message's arrival to its op's start (the receiver copies as messages arrive). A file with
neither new cost, whose ring lags are one number per ring count (as read from version 3 or
4), is written as 4; else every ring lag is written by chunk size. 4: records what the
runs to predict should match (`op_ms`, `num_stages`, `git_revision`); a version 3 file,
without them, is still read (and a HostCosts without them is written as one: a run
directory's kept costs stay the same). 3: the DP ring's lag is a curve by the rings running at once
(`*ring_lag_ms_by_rings`); 2 had one lag, measured with every stage's ring at once, which
over-predicts rings that run alone or apart (a lone ring's chunk here: 0.2-0.3 ms beyond its
send and receive, against 0.9-1.1 with four). 2: the per-size costs are measured curves
(`*_ms_by_bytes`); 1 had a fixed cost plus one per MiB, which a host whose cost per byte
grows with the size (sockets' buffers, copies sharing the cores) does not follow: the
line's fit lost the small messages' fixed cost."""


def _piecewise_ms(points: tuple[tuple[int, float], ...], size: int) -> float:
    """The cost at `size` of measured `points` (sizes rising): linear between them, the first
    point's cost below the first size; beyond the last, `_growth_per_size` from the last
    point; 0 without points."""
    if not points:
        return 0.0
    if len(points) == 1 or size <= points[0][0]:
        return points[0][1]
    last_size, last_ms = points[-1]
    if size > last_size:
        return last_ms + _growth_per_size(points) * (size - last_size)
    i = min(bisect.bisect_right(points, (size, math.inf)), len(points) - 1)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return y0 + (y1 - y0) / (x1 - x0) * (size - x0)


def _growth_per_size(points: tuple[tuple[int, float], ...]) -> float:
    """The slope past the last of `points`: from the last point whose cost is below the last
    one's to the last point (the last segment's slope where it rises; 0 where no point costs
    less than the last). A flat tail is out-of-order means that `calibrate` pooled (a tail
    caught in one), not a cost that stopped growing: the last segment's slope there, 0,
    charged every message past 8 MiB what 8 MiB cost. The slope across the pool is the
    growth measured over it."""
    last_size, last_ms = points[-1]
    for size, ms in reversed(points[:-1]):
        if ms < last_ms:
            return (last_ms - ms) / (last_size - size)
    return 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class CostCurve:
    """A cost in ms by message size (or, for the DP ring's lag, by the number of rings
    running at once), measured at some sizes: linear between them, the first point's cost
    below the first size, and beyond the last the slope from the last point that costs less
    than the last one (the last segment's where it rises; across a flat tail, out-of-order
    means that `calibrate` pooled, the growth over the pool: the cost per byte grows with
    the size; 0 where no point costs less). No points: free."""

    points: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        sizes = [size for size, _ in self.points]
        if sizes != sorted(set(sizes)) or any(size < 0 for size in sizes):
            raise ConfigError(f"a cost curve's sizes must rise from >= 0, got {sizes}")
        for _, ms in self.points:
            check_ms("a cost curve's cost", ms)

    def ms(self, num_bytes: int) -> float:
        return _piecewise_ms(self.points, num_bytes)

    @classmethod
    def line(cls, fixed_ms: float, ms_per_mib: float = 0.0) -> CostCurve:
        """`fixed_ms` plus `ms_per_mib` per MiB, at every size."""
        return cls(((0, fixed_ms), (_MIB, fixed_ms + ms_per_mib)))

    def to_json(self) -> list[list[float]]:
        return [[size, ms] for size, ms in self.points]

    @classmethod
    def parse(
        cls, value: Any, name: str, unit: str = "bytes", starts_at_zero: bool = True
    ) -> CostCurve:
        """From `[[size, ms], ...]`, sizes in `unit` ("bytes" or "rings"); `name` in errors.
        A file's curve is what `calibrate` writes: sizes rising from the smallest there is
        (0 bytes, 1 ring: the first point's cost is charged below it; unless not
        `starts_at_zero`: a DP chunk's smallest measured size) and costs that never fall
        with the size (`calibrate` pools out-of-order means, a tail caught in one)."""
        pairs = _whole_number_pairs(
            value, name, f"[{unit}, ms]", f"a size must be a whole number of {unit}"
        )
        points = [(size, check_ms(name, ms)) for size, ms in pairs]
        try:
            curve = cls(tuple(points))
        except ConfigError as err:
            raise ConfigError(f"{name}: {err}") from None
        _check_measured_shape(curve, name, unit, starts_at_zero)
        return curve


def _whole_number_pairs(value: Any, name: str, form: str, whole: str) -> list[tuple[int, Any]]:
    """`value` as a list of pairs written `form`, each first a whole number (`whole`: the
    error where it is not); `name` in errors."""
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{name} must be a list of {form} pairs, got {value!r}")
    pairs = []
    for pair in value:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ConfigError(f"{name}: {pair!r} is not a {form} pair")
        first, second = pair
        if isinstance(first, bool) or not isinstance(first, int):
            raise ConfigError(f"{name}: {whole}, got {first!r}")
        pairs.append((first, second))
    return pairs


def _check_measured_shape(curve: CostCurve, name: str, unit: str, starts_at_zero: bool) -> None:
    """Refuse a file's curve that `calibrate` cannot have written: one whose first size is
    not the smallest (a one-point curve at 8 MiB would charge its cost at 0 B) or whose
    cost falls with the size (a longer message, or more rings at once, never costs less)."""
    if not curve.points:
        return
    first = 1 if unit == "rings" else 0
    if starts_at_zero and curve.points[0][0] != first:
        raise ConfigError(
            f"{name} must start at {first} {unit} (its cost there is charged below its first "
            f"size), got {curve.points[0][0]}: run `adaptra-bench calibrate` again"
        )
    for (size_a, ms_a), (size_b, ms_b) in itertools.pairwise(curve.points):
        if ms_b < ms_a:
            raise ConfigError(
                f"{name} falls from {ms_a} ms at {size_a} {unit} to {ms_b} ms at {size_b}: "
                f"a cost never falls with the size; run `adaptra-bench calibrate` again"
            )


NO_COST = CostCurve()


@dataclasses.dataclass(frozen=True, slots=True)
class RingLag:
    """The DP ring's lag per chunk (`HostCosts.ring_lag_ms_by_rings`): for each number of
    rings running at once that was measured, a `CostCurve` by the chunk's bytes. Between and
    beyond the ring counts, as a CostCurve by rings at that chunk size. No curves: free."""

    by_rings: tuple[tuple[int, CostCurve], ...] = ()

    def __post_init__(self) -> None:
        counts = [rings for rings, _ in self.by_rings]
        if counts != sorted(set(counts)) or any(rings < 1 for rings in counts):
            raise ConfigError(f"a ring lag's ring counts must rise from >= 1, got {counts}")
        if not all(isinstance(curve, CostCurve) and curve.points for _, curve in self.by_rings):
            raise ConfigError(
                "a ring lag holds a CostCurve by chunk bytes, with points, for each ring count"
            )

    def first_fall(self) -> tuple[int, int, int] | None:
        """(chunk bytes, rings, more rings) where the lag falls from one measured ring count
        to the next at a measured chunk size, or None where it never does (more rings at once
        never cost less)."""
        sizes = sorted({size for _, curve in self.by_rings for size, _ in curve.points})
        for (rings_a, curve_a), (rings_b, curve_b) in itertools.pairwise(self.by_rings):
            for size in sizes:
                if curve_b.ms(size) < curve_a.ms(size):
                    return size, rings_a, rings_b
        return None

    def ms(self, chunk_bytes: int, num_rings: int) -> float:
        points = tuple((rings, curve.ms(chunk_bytes)) for rings, curve in self.by_rings)
        return _piecewise_ms(points, num_rings)

    @classmethod
    def by_rings_alone(cls, curve: CostCurve) -> RingLag:
        """One lag per ring count at every chunk size (`curve`: by rings)."""
        return cls(tuple((rings, CostCurve(((0, ms),))) for rings, ms in curve.points))

    def is_by_rings_alone(self) -> bool:
        """Whether each ring count's lag is one number at every chunk size (a version 3 or
        4 file's)."""
        return all(curve.points[:1] == curve.points and curve.points[0][0] == 0
                   for _, curve in self.by_rings)  # fmt: skip

    def to_json(self, by_bytes: bool) -> list[list[Any]]:
        """`[[rings, [[bytes, ms], ...]], ...]` (`by_bytes`), or `[[rings, ms], ...]` (only
        where `is_by_rings_alone`)."""
        if by_bytes:
            return [[rings, curve.to_json()] for rings, curve in self.by_rings]
        assert self.is_by_rings_alone(), "a ring lag by chunk bytes written by rings alone"
        return [[rings, curve.points[0][1]] for rings, curve in self.by_rings]

    @classmethod
    def parse(cls, value: Any, name: str, by_bytes: bool) -> RingLag:
        """From `[[rings, ms], ...]` (`by_bytes` False: a version 3 or 4 file's) or, with
        `by_bytes`, `[[rings, [[bytes, ms], ...]], ...]`. A ring count's curve by bytes is
        what `calibrate` writes: sizes rising from its smallest chunk, costs never falling."""
        if not by_bytes:
            return cls.by_rings_alone(CostCurve.parse(value, name, "rings"))
        pairs = _whole_number_pairs(
            value, name, "[rings, [[bytes, ms], ...]]", "a ring count must be a whole number"
        )
        by_rings = []
        for rings, points in pairs:
            label = f"{name} at {rings} rings"
            curve = CostCurve.parse(points, label, "bytes", starts_at_zero=False)
            if not curve.points:
                raise ConfigError(f"{label}: no [bytes, ms] points")
            by_rings.append((rings, curve))
        try:
            ring_lag = cls(tuple(by_rings))
        except ConfigError as err:
            raise ConfigError(f"{name}: {err}") from None
        if ring_lag.by_rings and ring_lag.by_rings[0][0] != 1:
            raise ConfigError(
                f"{name} must start at 1 rings (its lag there is charged below), got "
                f"{ring_lag.by_rings[0][0]}: run `adaptra-bench calibrate` again"
            )
        fall = ring_lag.first_fall()
        if fall is not None:
            size, rings_a, rings_b = fall
            raise ConfigError(
                f"{name} falls from {rings_a} to {rings_b} rings at {size} bytes: more rings at "
                "once never cost less; run `adaptra-bench calibrate` again"
            )
        return ring_lag


NO_RING_LAG = RingLag()
_MIB = 1 << 20
_CURVES = ("send_ms_by_bytes", "receive_lag_ms_by_bytes")
"""Required in a file."""
_COSTS = ("op_overhead_ms",)
_DELEGATE_CURVES = ("copy_out_ms_by_bytes", "delegate_transfer_ms_by_bytes", "copy_in_ms_by_bytes")
_DELEGATE_COSTS = ("delegate_pickup_ms", "failover_ms")
"""The delegated path's costs: optional in a file (one measured without delegates: 0)."""
_RING_LAGS = ("ring_lag_ms_by_rings", "delegated_ring_lag_ms_by_rings")
"""The DP ring's (`RingLag`): optional in a file (free)."""
_FROM_VERSION_5 = ("delegate_transfer_ms_by_bytes",)
"""Absent from versions 3 and 4."""
_MEASURED_WITH = ("op_ms", "num_stages", "git_revision")
"""What the calibration ran with: required from version 4 on, absent from a version 3."""
_READABLE_VERSIONS = (3, 4, HOST_COSTS_SCHEMA_VERSION)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class HostCosts:
    send_ms_by_bytes: CostCurve = NO_COST
    """How long a blocking send holds its sender, by the message's size."""
    receive_lag_ms_by_bytes: CostCurve = NO_COST
    """From a send's return to the start of the op that waited for the message, by size
    (the receiver still reads what the sender's socket took)."""
    op_overhead_ms: float = 0.0
    """The runtime's own time between one op and the next on a stage (bookkeeping)."""
    copy_out_ms_by_bytes: CostCurve = NO_COST
    """Delegated: handing a message to its delegate holds the sender this long (its copy
    into a slot and the job), by size."""
    delegate_pickup_ms: float = 0.0
    """Delegated: from the hand-over until a free delegate has picked the message up."""
    delegate_transfer_ms_by_bytes: CostCurve = NO_COST
    """Delegated: from the pick-up until the message is at the receiving side (beyond the
    wire's time and delay), the delegate busy meanwhile, by size; not measured (a version 3
    or 4 file's, or one measured without delegates): the direct path's send and receive
    lag."""
    copy_in_ms_by_bytes: CostCurve = NO_COST
    """Delegated: from an arrived message's arrival until the op that waited for it may
    start (the receiver thread learning of it and copying it into the op's buffer, as it
    arrives: an op that asks later does not wait for it)."""
    failover_ms: float = 0.0
    """Delegated: a link direction's move to another NIC, from its sender delegate noticing
    the failure to the connection over the next NIC taking over (adaptra.transport)."""
    ring_lag_ms_by_rings: RingLag = NO_RING_LAG
    """A DP ring's chunk can be forwarded this much later than a PP message of its size
    could be used: the ring's receiver hand-off, chunks sent back to back both ways, and its
    share of the host's cores, by how many stages' rings run at that moment and the chunk's
    size (pipeline.runtime.dp_ring; the runs it predicts put every worker on this host)."""
    delegated_ring_lag_ms_by_rings: RingLag = NO_RING_LAG
    """The same, for a ring whose chunks go over the delegates (the plan delegates its link
    directions), in place of `ring_lag_ms_by_rings`."""
    host: str = ""
    measured_at: str = ""
    op_ms: float | None = None
    """How long the calibration's ops lasted (`calibrate --op-ms`; None: not recorded, a
    version 3 file): the runs to predict should have ops as long."""
    num_stages: int | None = None
    """The calibration's stages (`calibrate --stages`; None with `op_ms`): as many as the
    runs to predict, since concurrent transfers share the host's cores."""
    git_revision: str = ""
    """The code that measured it (harness.results.git_revision; "" where not recorded)."""

    def __post_init__(self) -> None:
        for name in (*_COSTS, *_DELEGATE_COSTS):
            object.__setattr__(self, name, check_ms(name, getattr(self, name)))
        self._check_measured_with()
        for name in (*_CURVES, *_DELEGATE_CURVES):
            if not isinstance(getattr(self, name), CostCurve):
                raise ConfigError(f"{name} must be a CostCurve")
        for name in _RING_LAGS:
            if not isinstance(getattr(self, name), RingLag):
                raise ConfigError(f"{name} must be a RingLag")

    def _check_measured_with(self) -> None:
        """`op_ms` and `num_stages` both recorded (finite > 0 ms, a whole number >= 1) or
        neither; `git_revision` a string, only with them."""
        if (self.op_ms is None) != (self.num_stages is None):
            raise ConfigError("a calibration records op_ms and num_stages both, or neither")
        if self.op_ms is not None:
            op_ms = check_ms("op_ms", self.op_ms)
            if op_ms <= 0:
                raise ConfigError(f"op_ms must be > 0 ms, got {self.op_ms!r}")
            object.__setattr__(self, "op_ms", op_ms)
        stages = self.num_stages
        if stages is not None and (isinstance(stages, bool) or not isinstance(stages, int)):
            raise ConfigError(f"num_stages must be a whole number, got {stages!r}")
        if stages is not None and stages < 1:
            raise ConfigError(f"num_stages must be >= 1, got {stages!r}")
        if not isinstance(self.git_revision, str):
            raise ConfigError(f"git_revision must be a string, got {self.git_revision!r}")
        if self.git_revision and self.op_ms is None:
            raise ConfigError("a calibration's git_revision goes with its op_ms and num_stages")

    def send_ms(self, num_bytes: int) -> float:
        """How long a blocking send of `num_bytes` holds its sender."""
        return self.send_ms_by_bytes.ms(num_bytes)

    def receive_lag_for_ms(self, num_bytes: int) -> float:
        """From a send's return until the message can be used, when the receiver waits."""
        return self.receive_lag_ms_by_bytes.ms(num_bytes)

    def copy_out_ms(self, num_bytes: int) -> float:
        return self.copy_out_ms_by_bytes.ms(num_bytes)

    def copy_in_ms(self, num_bytes: int) -> float:
        return self.copy_in_ms_by_bytes.ms(num_bytes)

    def delegate_transfer_ms(self, num_bytes: int) -> float:
        """From a delegate's pick-up until the message is there, beyond the wire."""
        if self.delegate_transfer_ms_by_bytes.points:
            return self.delegate_transfer_ms_by_bytes.ms(num_bytes)
        return self.send_ms(num_bytes) + self.receive_lag_for_ms(num_bytes)

    def ring_lag(self, delegated: bool) -> RingLag:
        """The DP ring's lag, over the delegates or not."""
        return self.delegated_ring_lag_ms_by_rings if delegated else self.ring_lag_ms_by_rings

    def to_dict(self) -> dict[str, Any]:
        """The file's JSON in the oldest version that holds it: 3 where nothing of what the
        calibration ran with is recorded, 4 where the ring's lags are by rings alone (as read
        from those versions: a run directory that kept those costs is resumed with the
        same), else 5."""
        recorded = self.op_ms is not None
        by_bytes = not all(getattr(self, name).is_by_rings_alone() for name in _RING_LAGS)
        newer = by_bytes or any(getattr(self, name) != NO_COST for name in _FROM_VERSION_5)
        # (version 5 writes every ring lag by chunk bytes, version 4 by rings alone)
        if not recorded and newer:
            raise ConfigError(
                "a ring lag by chunk bytes or a delegate's transfer goes with the calibration's "
                "op_ms"
            )
        version = 3 if not recorded else HOST_COSTS_SCHEMA_VERSION if newer else 4
        data: dict[str, Any] = {"schema_version": version}
        for field in dataclasses.fields(self):
            if (field.name in _MEASURED_WITH and not recorded) or (
                field.name in _FROM_VERSION_5 and not newer
            ):
                continue
            value = getattr(self, field.name)
            if isinstance(value, CostCurve):
                value = value.to_json()
            elif isinstance(value, RingLag):
                value = value.to_json(newer)
            data[field.name] = value
        return data

    def other_host_warning(self, this_host: str | None = None) -> str | None:
        """One line where the file was measured on another host than this one (`this_host`,
        default platform.node()), or None: a user may model another host on purpose, but by
        mistake its costs predict this host's runs wrong."""
        here = platform.node() if this_host is None else this_host
        if not self.host or self.host == here:
            return None
        return (
            f"warning: the calibration was measured on host {self.host!r}, not on this one "
            f"({here!r}): its costs predict runs there"
        )

    def shape_warning(self, num_stages: int, forward_ms: float) -> str | None:
        """One line where the runs to predict, of `num_stages` stages with forwards of
        `forward_ms` (their median), differ in shape from the calibration's: its per-op
        overhead depends on how long an op sleeps, and its transfers' costs on how many
        workers share the host's cores; None where they match as well as `calibrate` can
        (its stages, `CALIBRATION_STAGES`; ops within 2x, where the run's take time), or the
        file did not record its shape."""
        if self.op_ms is None or self.num_stages is None:
            return None
        fewest, most = CALIBRATION_STAGES
        stages = min(max(num_stages, fewest), most)
        op_ms = forward_ms if forward_ms > 0 else self.op_ms
        if stages == self.num_stages and 0.5 <= op_ms / self.op_ms <= 2:
            return None
        return (
            f"warning: the calibration ran {self.num_stages} stages with {self.op_ms:g} ms "
            f"ops, this run {num_stages} with {forward_ms:g} ms forwards: its costs predict "
            f"runs of its own shape (calibrate --stages {stages} --op-ms "
            f"{min(op_ms, MAX_CALIBRATION_OP_MS):g})"
        )

    @classmethod
    def from_dict(cls, data: Any) -> HostCosts:
        if not isinstance(data, dict):
            raise ConfigError("a calibration is a JSON object of costs in ms")
        values = dict(data)
        if "schema_version" not in values:  # (it read "must be a whole number, got None")
            keys = ", ".join(sorted(map(str, values))[:5]) or "none"
            raise ConfigError(
                f"a calibration has a schema_version, as `adaptra-bench calibrate` writes it; "
                f"this has none (its keys: {keys}{', ...' if len(values) > 5 else ''}): not a "
                "calibration file?"
            )
        version = values.pop("schema_version")
        if isinstance(version, bool) or not isinstance(version, int):
            raise ConfigError(
                f"calibration schema_version must be a whole number, got {version!r} "
                f"(run `adaptra-bench calibrate` again)"
            )
        if version not in _READABLE_VERSIONS:
            raise ConfigError(
                f"calibration schema_version {version!r} is not supported "
                f"(expected {', '.join(map(str, _READABLE_VERSIONS))}; run `adaptra-bench "
                f"calibrate` again)"
            )
        fields = {f.name for f in dataclasses.fields(cls)}
        required: tuple[str, ...] = (*_CURVES, *_COSTS)
        if version == 3:
            fields -= set(_MEASURED_WITH)
        else:
            required += _MEASURED_WITH
        if version < 5:
            fields -= set(_FROM_VERSION_5)
        unknown = sorted(set(values) - fields)
        missing = [name for name in required if name not in values]
        if unknown or missing:
            raise ConfigError(
                f"calibration: unknown key(s) {unknown or 'none'}, missing {missing or 'none'}; "
                f"keys: schema_version, {', '.join(sorted(fields))}"
            )
        for name in (*_CURVES, *_DELEGATE_CURVES):
            if name in values:
                values[name] = CostCurve.parse(values[name], name)
        for name in _RING_LAGS:
            if name in values:
                values[name] = RingLag.parse(values[name], name, by_bytes=version >= 5)
        for name in ("host", "measured_at"):
            value = values.setdefault(name, "")
            if not isinstance(value, str):
                raise ConfigError(f"calibration {name} must be a string, got {value!r}")
        return cls(**values)

    @classmethod
    def from_file(cls, path: str | Path) -> HostCosts:
        return parse_json_file(path, "calibration", cls.from_dict)


FREE = HostCosts()
"""No costs: the simulator's plain model."""
