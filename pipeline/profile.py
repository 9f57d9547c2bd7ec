"""The profile: per-stage op times, per-link delays, message and transport parameters, and
the DP step after the pipeline (replicas, gradient bytes and buckets, optimizer).

It is the input of every engine; `Profile.from_dict` is the strict reader of the profile file
described in docs/design.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.allreduce import DEFAULT_BUCKET_BYTES, check_ring_messages, largest_chunk_bytes
from pipeline.checks import (
    MAX_DURATION_MS,
    MIN_BANDWIDTH_GBPS,
    check_count,
    check_ms,
    is_number,
)
from pipeline.errors import ConfigError
from pipeline.files import parse_json_file
from pipeline.link_rates import LinkRates
from pipeline.topology import Link, Topology

__all__ = ["MAX_BYTES", "STATE_BYTES_PER_GRADIENT_BYTE", "Profile"]

_REQUIRED_KEYS = ("stages", "microbatches", "t_f", "t_b", "t_w")
_OPTIONAL_KEYS = (
    "delay_ms",
    "mem_limit",
    "message_bytes",
    "link_latency_ms",
    "link_bandwidth_gbps",
    "num_delegates",
    "copy_gbps",
    "delegate_gbps",
    "dp",
    "allreduce_bytes",
    "dp_bucket_bytes",
    "dp_bandwidth_gbps",
    "dp_delay_ms",
    "optimizer_ms",
    "state_bytes",
)
_FIELD_OF_KEY = {"dp": "num_replicas", "state_bytes": "stage_state_bytes"}

MAX_STAGES, MAX_MICROBATCHES, MAX_REPLICAS = 512, 4096, 1024
"""Far beyond any pipeline in use (the paper's largest: 8 stages, 128 microbatches, DP 4), and
small enough that a schedule of them fits in memory."""
MAX_BYTES = 2**40
"""The most bytes a profile's message, gradient, bucket or training state may have: 1 TiB,
far beyond any stage's (a message of it at the lowest rate, MIN_BANDWIDTH_GBPS, would take
over 100 days: a message's time is checked against MAX_DURATION_MS too)."""


def _check_rate(name: str, value: object) -> float | None:
    """Bandwidths and memory limits: None means unlimited, otherwise finite and > 0."""
    if value is None:
        return None
    if not is_number(value) or not 0 < float(value) < math.inf:  # type: ignore[arg-type]
        raise ConfigError(f"{name} must be finite and > 0 (or null for unlimited), got {value!r}")
    return float(value)  # type: ignore[arg-type]


def _check_gbps(name: str, value: object) -> float | None:
    """A link's or a copy's rate, Gbit/s: None (unlimited) or finite and >= MIN_BANDWIDTH_GBPS."""
    rate = _check_rate(name, value)
    if rate is not None and rate < MIN_BANDWIDTH_GBPS:
        raise ConfigError(
            f"{name} must be >= {MIN_BANDWIDTH_GBPS:g} Gbit/s (1 Mbit/s; or null for "
            f"unlimited), got {value!r}"
        )
    return rate


def _check_mem_limit(value: object) -> float | None:
    """None (unlimited) or >= 1: every F holds one microbatch of activations."""
    limit = _check_rate("mem_limit", value)
    if limit is not None and limit < 1:
        raise ConfigError(
            f"mem_limit {limit:g} admits no schedule: every F holds one microbatch of "
            "activations, so mem_limit must be >= 1"
        )
    return limit


def _per_stage(name: str, value: object, num_stages: int) -> tuple[float, ...]:
    if is_number(value):
        return (check_ms(name, value),) * num_stages
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise ConfigError(f"{name} must be a number or a list of {num_stages} numbers")
    if len(value) != num_stages:
        raise ConfigError(f"{name} has {len(value)} entries, expected one per stage ({num_stages})")
    return tuple(check_ms(f"{name}[{i}]", v) for i, v in enumerate(value))


def _per_stage_count(name: str, value: object, num_stages: int) -> tuple[int, ...]:
    if not isinstance(value, Sequence) or isinstance(value, str):
        return (check_count(name, value, 0, MAX_BYTES),) * num_stages
    if len(value) != num_stages:
        raise ConfigError(f"{name} has {len(value)} entries, expected one per stage ({num_stages})")
    return tuple(check_count(f"{name}[{i}]", v, 0, MAX_BYTES) for i, v in enumerate(value))


def _or_none(value: object, none: object) -> object:
    """`none` for a per-stage field's own default, the empty tuple (the file's absent key);
    any value given, an empty list too, as it is."""
    return none if isinstance(value, tuple) and not value else value


def _dp_delays(value: object, topology: Topology) -> tuple[tuple[Link, float], ...]:
    """DP ring links and their delays (a mapping, or (link, delay) pairs), links checked,
    each once (however spelled), sorted, zero delays left out."""
    items = value.items() if isinstance(value, Mapping) else value
    if not isinstance(items, Iterable) or isinstance(items, str):
        raise ConfigError("dp_delay_ms must map DP links to delays, e.g. {'dp1:0-1': 30}")
    delays: dict[Link, float] = {}
    spelled: dict[Link, object] = {}  # each link's key as given
    for item in items:
        if not isinstance(item, tuple | list) or len(item) != 2:
            raise ConfigError(f"dp_delay_ms must map DP links to delays, got {item!r}")
        name, delay = item
        link = name if isinstance(name, Link) else Link.parse(str(name))
        if link in spelled:  # ("dp0:0-01" and " dp0:0-1 " are dp0:0-1: the last one won)
            raise ConfigError(
                f"dp_delay_ms: link {link} given twice, as {str(spelled[link])!r} and {str(name)!r}"
            )
        spelled[link] = name
        if link.is_pp:
            raise ConfigError(
                f"dp_delay_ms: {link} is a PP link (delay_ms has those); DP ring links are "
                "dp<stage>:a-b"
            )
        topology.check(link)
        checked = check_ms(f"dp_delay_ms[{link}]", delay)
        if checked:
            delays[link] = checked
    return tuple(sorted(delays.items()))


STATE_BYTES_PER_GRADIENT_BYTE = 8
"""Mixed-precision Adam: 16 bytes of state per parameter against its 2-byte gradient."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Profile:
    """What an engine needs to time a schedule; validated at construction."""

    num_stages: int
    num_microbatches: int
    t_f_ms: tuple[float, ...]
    t_b_ms: tuple[float, ...]
    t_w_ms: tuple[float, ...]
    delay_ms: tuple[float, ...] = ()
    """Extra delay per message on PP link i (both directions); missing entries are 0."""
    mem_limit: float | None = None
    """Bound on each stage's running activation count, in microbatches; None: unlimited."""
    message_bytes: int = 0
    link_latency_ms: float = 0.0
    link_bandwidth_gbps: float | None = None
    num_delegates: int | None = None
    """Delegates per link direction and side in `delegated` mode, 1 to `num_microbatches`;
    None: the paper's rule (`delegates_needed`)."""
    copy_gbps: float | None = None
    """Device-host copy speed in `delegated` mode; None: copies are free."""
    delegate_gbps: float | None = None
    """One delegate's own send rate in `delegated` mode (a CPU-side send, e.g. gloo over one
    TCP connection): a delegated message's bytes go at this rate; None: the link's."""
    num_replicas: int = 1
    """DP replicas (the file's `dp`): each runs the pipeline, then the DP step
    (pipeline.allreduce) reduces each stage's gradients over its replicas."""
    allreduce_bytes: tuple[int, ...] = ()
    """Each stage's gradient bytes (per GPU) that its DP all-reduce reduces; missing: 0."""
    dp_bucket_bytes: int = DEFAULT_BUCKET_BYTES
    """The gradient is reduced in buckets of this many bytes (the last one smaller)."""
    dp_bandwidth_gbps: float | None = None
    """Bandwidth of a DP ring link; None: `link_bandwidth_gbps`. A DP message also pays
    `link_latency_ms`."""
    dp_delay_ms: tuple[tuple[Link, float], ...] = ()
    """Extra delay per message on DP ring links (both directions), as (link, delay) pairs."""
    optimizer_ms: tuple[float, ...] = ()
    """Each stage's optimizer step, after its all-reduce; missing: 0."""
    stage_state_bytes: tuple[int, ...] = ()
    """Each stage's training state (the file's `state_bytes`), what a rank swap moves; empty:
    the cost model's assumption (`state_bytes`)."""

    def __post_init__(self) -> None:
        num_stages = check_count("stages", self.num_stages, 1, MAX_STAGES)
        num_microbatches = check_count("microbatches", self.num_microbatches, 1, MAX_MICROBATCHES)
        if num_microbatches < num_stages:
            raise ConfigError(
                f"microbatches ({num_microbatches}) must be >= stages ({num_stages}): "
                "a pipeline needs at least one microbatch per stage"
            )
        for name in ("t_f_ms", "t_b_ms", "t_w_ms"):
            object.__setattr__(self, name, _per_stage(name[:-3], getattr(self, name), num_stages))
        delays = self.delay_ms
        if is_number(delays) or not isinstance(delays, Sequence) or isinstance(delays, str):
            raise ConfigError(
                f"delay_ms must be a list of numbers, one per link ({_links(num_stages - 1)})"
            )
        if len(delays) > num_stages - 1:
            raise ConfigError(
                f"delay_ms has {_entries(len(delays))} but {num_stages} stages have "
                f"{_links(num_stages - 1)}"
            )
        checked = [check_ms(f"delay_ms[{i}]", d) for i, d in enumerate(delays)]
        object.__setattr__(
            self, "delay_ms", tuple(checked) + (0.0,) * (num_stages - 1 - len(checked))
        )
        object.__setattr__(self, "mem_limit", _check_mem_limit(self.mem_limit))
        check_count("message_bytes", self.message_bytes, 0, MAX_BYTES)
        object.__setattr__(
            self, "link_latency_ms", check_ms("link_latency_ms", self.link_latency_ms)
        )
        object.__setattr__(
            self,
            "link_bandwidth_gbps",
            _check_gbps("link_bandwidth_gbps", self.link_bandwidth_gbps),
        )
        if self.num_delegates is not None:
            num_delegates = check_count("num_delegates", self.num_delegates, 1)
            if num_delegates > num_microbatches:  # (10**9 of them were a MemoryError)
                raise ConfigError(
                    f"num_delegates ({num_delegates}) must be at most microbatches "
                    f"({num_microbatches}): a PP link direction carries one message per "
                    "microbatch an iteration, message k going to delegate k mod num_delegates, "
                    "so more would sit idle there (the paper's rule gives at most one per "
                    "microbatch)"
                )
        object.__setattr__(self, "copy_gbps", _check_gbps("copy_gbps", self.copy_gbps))
        object.__setattr__(self, "delegate_gbps", _check_gbps("delegate_gbps", self.delegate_gbps))
        num_replicas = check_count("dp", self.num_replicas, 1, MAX_REPLICAS)
        object.__setattr__(
            self,
            "allreduce_bytes",
            # (only the field's own default, (), is "none": a file's [] is a list of 0 entries)
            _per_stage_count("allreduce_bytes", _or_none(self.allreduce_bytes, 0), num_stages),
        )
        check_count("dp_bucket_bytes", self.dp_bucket_bytes, 1, MAX_BYTES)
        # (counted, before anything lists the buckets: 2**40 one-byte buckets were a MemoryError)
        check_ring_messages(self.allreduce_bytes, self.dp_bucket_bytes, num_replicas)
        object.__setattr__(
            self, "dp_bandwidth_gbps", _check_gbps("dp_bandwidth_gbps", self.dp_bandwidth_gbps)
        )
        object.__setattr__(
            self, "dp_delay_ms", _dp_delays(self.dp_delay_ms, Topology(num_stages, num_replicas))
        )
        object.__setattr__(
            self,
            "optimizer_ms",
            _per_stage("optimizer_ms", _or_none(self.optimizer_ms, 0.0), num_stages),
        )
        if self.stage_state_bytes != ():
            object.__setattr__(
                self,
                "stage_state_bytes",
                _per_stage_count("state_bytes", self.stage_state_bytes, num_stages),
            )
        self._check_message_times()

    def _check_message_times(self) -> None:
        """Refuse a message whose time on the wire (its bytes at its rate, plus the latency),
        or whose device-host copy, is over MAX_DURATION_MS: a PP message at the link's rate
        and at a delegate's, its copy, and each stage's largest DP ring chunk."""
        times = [
            ("message_bytes at link_bandwidth_gbps", self.wire_ms()),
            ("message_bytes at delegate_gbps", self.delegated_wire_ms()),
            ("message_bytes at copy_gbps (a copy)", self.copy_ms()),
        ]
        if self.num_replicas > 1:
            chunk = max(
                largest_chunk_bytes(grad, self.dp_bucket_bytes, self.num_replicas)
                for grad in self.allreduce_bytes
            )
            times.append(("a DP ring chunk at dp_bandwidth_gbps", self.dp_wire_ms(chunk)))
        for what, ms in times:
            if ms > MAX_DURATION_MS:
                raise ConfigError(
                    f"{what} takes {ms:.4g} ms a message: more than {MAX_DURATION_MS:.0f} ms "
                    "(an hour); give fewer bytes or a higher rate"
                )

    @classmethod
    def uniform(
        cls,
        num_stages: int,
        num_microbatches: int,
        t_f_ms: float,
        t_b_ms: float,
        t_w_ms: float,
        **options: Any,
    ) -> Profile:
        """The same op times on every stage."""
        return cls(
            num_stages=num_stages,
            num_microbatches=num_microbatches,
            t_f_ms=(float(t_f_ms),) * num_stages,
            t_b_ms=(float(t_b_ms),) * num_stages,
            t_w_ms=(float(t_w_ms),) * num_stages,
            **options,
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Profile:
        """Read the profile-file form (docs/design.md); unknown or missing keys are errors."""
        if not isinstance(data, Mapping):
            raise ConfigError("a profile must be a JSON object")
        # (as names: YAML reads `1:` as a key 1, which sorting and joining refused as a TypeError)
        unknown = sorted(map(str, set(data) - set(_REQUIRED_KEYS) - set(_OPTIONAL_KEYS)))
        if unknown:
            valid = ", ".join(_REQUIRED_KEYS + _OPTIONAL_KEYS)
            raise ConfigError(f"unknown profile key(s) {', '.join(unknown)}; valid keys: {valid}")
        missing = [key for key in _REQUIRED_KEYS if key not in data]
        if missing:
            raise ConfigError(f"profile is missing required key(s): {', '.join(missing)}")
        optional = {
            _FIELD_OF_KEY.get(key, key): data[key]
            for key in _OPTIONAL_KEYS
            if data.get(key) is not None
        }
        if "dp_delay_ms" in optional and not isinstance(optional["dp_delay_ms"], Mapping):
            raise ConfigError("dp_delay_ms must map DP links to delays, e.g. {'dp1:0-1': 30}")
        profile = cls(
            num_stages=data["stages"],
            num_microbatches=data["microbatches"],
            t_f_ms=data["t_f"],
            t_b_ms=data["t_b"],
            t_w_ms=data["t_w"],
            **optional,
        )
        given = data.get("delay_ms")
        if given is not None and len(given) != profile.num_stages - 1:
            raise ConfigError(  # in a file, a short list is a mistake, not "the rest 0"
                f"delay_ms has {_entries(len(given))}; {profile.num_stages} stages have "
                f"{_links(profile.num_stages - 1)}, one delay each"
            )
        return profile

    @classmethod
    def from_file(cls, path: str | Path) -> Profile:
        return parse_json_file(path, "profile", cls.from_dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "stages": self.num_stages,
            "microbatches": self.num_microbatches,
            "t_f": list(self.t_f_ms),
            "t_b": list(self.t_b_ms),
            "t_w": list(self.t_w_ms),
            "delay_ms": list(self.delay_ms),
            "mem_limit": self.mem_limit,
            "message_bytes": self.message_bytes,
            "link_latency_ms": self.link_latency_ms,
            "link_bandwidth_gbps": self.link_bandwidth_gbps,
            "num_delegates": self.num_delegates,
            "copy_gbps": self.copy_gbps,
            "delegate_gbps": self.delegate_gbps,
            "dp": self.num_replicas,
            "allreduce_bytes": list(self.allreduce_bytes),
            "dp_bucket_bytes": self.dp_bucket_bytes,
            "dp_bandwidth_gbps": self.dp_bandwidth_gbps,
            "dp_delay_ms": {str(link): delay for link, delay in self.dp_delay_ms},
            "optimizer_ms": list(self.optimizer_ms),
            "state_bytes": list(self.stage_state_bytes) if self.stage_state_bytes else None,
        }

    @property
    def topology(self) -> Topology:
        """Its stages and replicas under the default placement."""
        return Topology(self.num_stages, self.num_replicas)

    def with_delays(
        self,
        delay_ms: Sequence[float],
        dp_delay_ms: Mapping[Link, float] | tuple[tuple[Link, float], ...] | None = None,
    ) -> Profile:
        """PP link delays `delay_ms`, and DP link delays `dp_delay_ms` (None: this profile's)."""
        dp = self.dp_delay_ms if dp_delay_ms is None else dp_delay_ms
        pairs = tuple(dp.items()) if isinstance(dp, Mapping) else dp
        return dataclasses.replace(self, delay_ms=tuple(delay_ms), dp_delay_ms=pairs)

    @property
    def has_dp_step(self) -> bool:
        """The iteration ends with a DP step: an all-reduce over replicas or an optimizer."""
        return self.num_replicas > 1 or any(self.optimizer_ms)

    def dp_delay_for(self, link: Link) -> float:
        """The static delay of each message on DP link `link`."""
        return dict(self.dp_delay_ms).get(link, 0.0)

    def state_bytes(self, stage: int) -> int:
        """The training state a stage's worker holds: what a rank swap moves (the simulator;
        Falcon's swap cost). The profile's `stage_state_bytes` where given (a megatron run's:
        its stage's fp32 parameters, plain SGD keeping nothing else), otherwise as the cost
        model assumes it: mixed-precision Adam's 16 bytes per parameter (fp16 weight and
        gradient, fp32 master weight, momentum and variance), 8 x the stage's 2-byte gradient
        (`allreduce_bytes`)."""
        if self.stage_state_bytes:
            return self.stage_state_bytes[stage]
        return STATE_BYTES_PER_GRADIENT_BYTE * self.allreduce_bytes[stage]

    @property
    def link_rates(self) -> LinkRates:
        """Each link's own rate (a DP ring link's: `dp_bandwidth_gbps`, else the PP one's):
        what the simulator times a message's bytes at, what the testbed caps each host pair
        at, and what a fault's cap replaces where slower (pipeline.link_rates)."""
        dp_gbit_s = self.link_bandwidth_gbps
        if self.dp_bandwidth_gbps is not None:
            dp_gbit_s = self.dp_bandwidth_gbps
        return LinkRates(pp_gbit_s=self.link_bandwidth_gbps, dp_gbit_s=dp_gbit_s)

    def dp_wire_ms(self, num_bytes: int) -> float:
        """Latency plus serialisation time of one DP message of `num_bytes`."""
        bandwidth = self.link_rates.dp_gbit_s
        if bandwidth is None:
            return self.link_latency_ms
        return self.link_latency_ms + num_bytes * 8 / (bandwidth * 1e6)

    def wire_ms(self) -> float:
        """Latency plus serialisation time of one message, before any injected delay."""
        if self.link_bandwidth_gbps is None:
            return self.link_latency_ms
        return self.link_latency_ms + self.message_bytes * 8 / (self.link_bandwidth_gbps * 1e6)

    def transfer_ms(self, link_idx: int) -> float:
        """Time one message spends on PP link `link_idx`: injected delay + latency + bytes/bw."""
        return self.delay_ms[link_idx] + self.wire_ms()

    def delegates_needed(self, extra_delay_ms: float = 0.0) -> int:
        """The paper's rule for the delegate count (docs/paper.md, CPU delegation; the
        paper: "8 activations/s produced, 2/s per delegate: D >= 4"): per PP link direction,
        enough delegates that sending keeps up with production. A message holds its delegate
        for its link's delay (plus `extra_delay_ms` a fault timeline may add) and its wire at
        the delegate's own rate (`delegated_wire_ms`); the sending stage makes one per F
        (forward) or per B (backward), so D = ceil(that hold / that op's time) (the artifact:
        3 at 30 ms and 6 at 60 ms, with ops of about 10 ms). A host's own delegate costs
        (pipeline.host_costs) are no profile's and are left out. At least 1, at most one per
        microbatch."""
        needed = 1
        for link in range(self.num_stages - 1):
            held_ms = self.delay_ms[link] + extra_delay_ms + self.delegated_wire_ms()
            if held_ms <= 0:  # (against a stage whose op takes 0 ms: 0 >= 0 asked for N)
                continue  # a message that holds its delegate no time: one keeps up
            for made_every_ms in (self.t_f_ms[link], self.t_b_ms[link + 1]):
                # (compared, not divided, first: an op of 5e-324 ms made the ratio inf)
                if held_ms >= made_every_ms * self.num_microbatches:
                    return self.num_microbatches
                needed = max(needed, math.ceil(held_ms / made_every_ms - 1e-9))
        return min(needed, self.num_microbatches)

    def delegate_count(self) -> int:
        """Delegates per link direction and side: `num_delegates`, or the paper's rule
        (`delegates_needed`) where the profile gives none; every engine takes this."""
        return self.num_delegates if self.num_delegates is not None else self.delegates_needed()

    def delegated_wire_ms(self) -> float:
        """Latency plus serialisation time of one message a delegate sends (`delegate_gbps`,
        else the link's), before any injected delay."""
        if self.delegate_gbps is None:
            return self.wire_ms()
        return self.link_latency_ms + self.message_bytes * 8 / (self.delegate_gbps * 1e6)

    def copy_ms(self) -> float:
        """One device-host copy of a message in `delegated` mode."""
        if self.copy_gbps is None:
            return 0.0
        return self.message_bytes * 8 / (self.copy_gbps * 1e6)


def _entries(count: int) -> str:
    return f"{count} {'entry' if count == 1 else 'entries'}"


def _links(count: int) -> str:
    return f"{count} link{'' if count == 1 else 's'}"
