"""Checks of the numbers an input file gives: one place for what a count or a duration may be,
so every file (profiles, specs, fault timelines) refuses the same values with the same words."""

from __future__ import annotations

import math

from pipeline.errors import ConfigError

__all__ = [
    "MAX_DURATION_MS",
    "MAX_SEED",
    "MAX_WAIT_S",
    "MAX_WHOLE_DIGITS",
    "MIN_BANDWIDTH_GBPS",
    "check_count",
    "check_ms",
    "check_wait_s",
    "is_number",
    "whole_number",
]

MAX_DURATION_MS = 3_600_000.0
"""The longest op time, delay or stall an input may give: an hour (a delay longer than a
collective's timeout, 10 minutes by default, is a failure, which inputs say as `down`)."""
MIN_BANDWIDTH_GBPS = 0.001
"""The lowest bandwidth an input may give, Gbit/s: 1 Mbit/s (1 MiB in 8.4 s; less is a
failure, which inputs say as `down`). A fault timeline's cap, a profile's link and copy
rates and the cost model's hardware rates take no less."""
MAX_WAIT_S = 86_400
"""The longest wait in seconds an input may give (`check_wait_s`): a day. A planner's time
limit, every option in seconds (--timeout, launch's --run-timeout-s:
harness.cli_common.seconds) and a spec's `transport_timeout_s` take no more."""
MAX_SEED = 2**32 - 1
"""The largest seed a run takes (a spec's `seed`, `run --seed`): 32 bits, as numpy's."""
MAX_WHOLE_DIGITS = 308
"""The most digits (leading zeros aside) a whole number an input writes may have: every
number an input gives is a count, a size or a time, which a float holds, and more digits
overflowed a float where a check converted it (`mem_limit: 1e400` written out was an
internal error) or passed Python's limit on reading one (4,300 digits: another)."""


def is_number(value: object) -> bool:
    """An int or a float, not a bool (YAML's `yes`, JSON's `true`)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_count(name: str, value: object, minimum: int, maximum: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bounds = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        raise ConfigError(f"{name} must be {bounds}, got {value}")
    return value


def check_ms(name: str, value: object, maximum_ms: float = MAX_DURATION_MS) -> float:
    """A duration in ms: a finite number in [0, `maximum_ms`]."""
    if not is_number(value):
        raise ConfigError(f"{name} must be a number, got {value!r}")
    number = float(value)  # type: ignore[arg-type]
    if not math.isfinite(number) or not 0 <= number <= maximum_ms:
        raise ConfigError(f"{name} must be finite and in 0..{maximum_ms:.0f} ms, got {value!r}")
    return number


def check_wait_s(name: str, value: object) -> float:
    """A wait in seconds: a number in (0, `MAX_WAIT_S`] (what `run --timeout` takes)."""
    if not is_number(value):
        raise ConfigError(f"{name} must be a number, got {value!r}")
    number = float(value)  # type: ignore[arg-type]
    if not 0 < number <= MAX_WAIT_S:  # NaN fails it too
        raise ConfigError(f"{name} must be in (0, {MAX_WAIT_S}] s, got {value!r}")
    return number


def whole_number(text: str) -> int:
    """A whole number an input writes in decimal (`text`, its sign first if any): a file's
    (pipeline.files), a link's or an op's; one of more than MAX_WHOLE_DIGITS digits is a
    ConfigError saying so."""
    sign = text[0] if text.startswith(("+", "-")) else ""
    body = text[len(sign) :]
    if not (body.isascii() and body.isdigit()):
        return int(text, 10)  # a ValueError (a tag's `!!int 0x10`)
    digits = body.lstrip("0") or "0"
    if len(digits) > MAX_WHOLE_DIGITS:
        shown = text if len(text) <= 24 else f"{text[:20]}..."
        raise ConfigError(f"{shown} ({len(digits)} digits) is too large a number")
    return int(sign + digits, 10)
