"""Fault timeline files, read into a FaultModel (injectors.fault_model). Every error names its
row and the row's line in the file, those found later against a run too
(`FaultModel.row_error`).

- The paper's trace: rows `start_iteration;links;delay_s` separated by newlines or spaces,
  links "i_j" joined by commas; a `#` starts a comment, to the end of its line (a line of its
  own, or after a line's rows). A delay of 0 ends
  what is in force on those links; `inf` with links fails those logical links (both ways);
  `inf` with no link fails `rnic0` of the host of stage floor(S/2), replica 0 (the paper's
  NIC failure).
- YAML: a list of rows `{start_iteration, at_ms?, end_iteration?, <target>, <effect>}`:
  target `links: ["2-3", "pp1:0-1", "dp0:0-1"]`, `hosts: [a, b]` or `nic: "host1:rnic0"`;
  effect `delay_ms` (with optional `jitter_ms`), `distribution: {normal: {mean_ms, std_ms},
  redraw_every_ms: [lo, hi]}`, `bandwidth_gbps`, `stall_ms` or `down: true`.
  `delay_ms: inf` is `down: true`; `links: []` with it is the paper's NIC failure. Numbers
  are YAML's: a quoted one (`"5"`) is refused, as specs and profiles refuse it.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from pathlib import Path
from typing import Any, Literal

from injectors.fault_model import Effect, FaultEvent, FaultModel, Target, TargetKind
from pipeline.checks import MAX_DURATION_MS, MIN_BANDWIDTH_GBPS, is_number, whole_number
from pipeline.errors import ConfigError
from pipeline.files import load_yaml_lines, read_text
from pipeline.topology import Link

__all__ = ["fault_file_form", "load_faults", "parse_faults", "parse_trace", "parse_yaml"]

_TRACE_SUFFIXES = (".txt",)
_YAML_SUFFIXES = (".yaml", ".yml")

_NIC = re.compile(r"host([0-9]+):([A-Za-z][A-Za-z0-9_-]*)")
"""A NIC's name, matched whole, in ASCII (a regex's digit and word classes take other scripts')."""
_INTEGER = re.compile(r"-?[0-9]+")
_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)(e[+-]?[0-9]+)?")
"""A decimal number as a file writes one (no `1_0`, no other scripts' digits, no nan)."""
_PAPER_NIC = Target(TargetKind.NIC, hosts=(-1, 0), nic="rnic0")
_TARGETS = ("links", "hosts", "nic")
_EFFECTS = ("delay_ms", "distribution", "bandwidth_gbps", "stall_ms", "down")
_KEYS = ("start_iteration", "at_ms", "end_iteration", "jitter_ms", *_TARGETS, *_EFFECTS)
_LINE_BREAKS = {
    "\r": "carriage return",
    "\v": "vertical tab",
    "\f": "form feed",
    "\x1c": "file separator",
    "\x1d": "group separator",
    "\x1e": "record separator",
    "\x85": "next line",
    "\u2028": "line separator",
    "\u2029": "paragraph separator",
}
"""The characters str.splitlines breaks a line at besides "\n" (a "\r" before one is the
line's end)."""


def fault_file_form(path: str | Path) -> Literal["trace", "yaml"]:
    """The form of the timeline file `path`, by its suffix (in any case): the paper's trace
    (.txt) or YAML rows (.yaml/.yml); any other suffix is refused, not guessed."""
    suffix = Path(path).suffix.lower()
    if suffix not in (*_TRACE_SUFFIXES, *_YAML_SUFFIXES):
        what = f"suffix {Path(path).suffix!r}" if suffix else "no suffix"
        raise ConfigError(
            f"fault timeline {path} has {what}: give the paper's trace as .txt or YAML rows as "
            ".yaml or .yml"
        )
    return "yaml" if suffix in _YAML_SUFFIXES else "trace"


def load_faults(path: str | Path, seed: int = 0) -> FaultModel:
    """A paper trace (.txt) or a YAML timeline (.yaml/.yml)."""
    fault_file_form(path)  # before reading: a file of another kind is refused by name
    return parse_faults(read_text(path, "fault timeline"), path, seed)


def parse_faults(text: str, path: str | Path, seed: int = 0) -> FaultModel:
    """The timeline file `path` holds as `text` (read earlier): its suffix says the form."""
    yaml_file = fault_file_form(path) == "yaml"
    try:
        timeline = parse_yaml(text, seed) if yaml_file else parse_trace(text, seed)
    except ConfigError as err:
        raise ConfigError(f"fault timeline {path}: {err}") from err
    return dataclasses.replace(timeline, source=str(path))


def _iteration(row: int, value: Any, name: str = "start iteration", *, trace: bool = False) -> int:
    """A whole number >= 0: a trace's field as written, a YAML value as YAML read it."""
    if not trace and (not isinstance(value, int) or isinstance(value, bool)):
        raise ConfigError(f"fault row {row}: {name} must be an integer, got {value!r}")
    text = str(value).strip()
    if not _INTEGER.fullmatch(text):
        raise ConfigError(f"fault row {row}: {name} {value!r} is not an integer")
    try:  # (thousands of digits were past Python's limit on reading a number)
        number = whole_number(text)
    except ConfigError as err:
        raise ConfigError(f"fault row {row}: {name} {err}") from None
    if number < 0:
        raise ConfigError(f"fault row {row}: {name} must be >= 0, got {number}")
    return number


def _ms(
    row: int,
    value: Any,
    name: str,
    scale: float = 1.0,
    *,
    inf: bool = False,
    unit: str = "ms",
    trace: bool = False,
) -> float:
    """A number in 0..MAX_DURATION_MS (after `scale`), or `inf` where `inf` is allowed: a
    trace's field as written; a YAML value as YAML read it, a number, not a string of one
    (`"5"` is refused, as the specs and profiles refuse it), but for `inf` (YAML reads it as
    a string; `.inf`, the float, is `inf` too)."""
    text = str(value).strip().lower()
    if inf and text == "inf":  # `inf` itself: a huge number is an error, not a failure
        return math.inf
    what = "a number or inf" if inf else "a number"
    if not trace and not is_number(value):  # a bool too (YAML's `yes`)
        raise ConfigError(f"fault row {row}: {name} must be {what}, got {value!r}")
    if not _NUMBER.fullmatch(text):  # a trace's `1_0`, YAML's `.nan`
        raise ConfigError(f"fault row {row}: {name} {value!r} is not {what}")
    number = float(text) * scale
    if not 0 <= number <= MAX_DURATION_MS:  # inf too (1e999, an overflow by `scale`)
        bound = " (inf: down)" if inf else ""
        raise ConfigError(
            f"fault row {row}: {name} must be in 0..{MAX_DURATION_MS / scale:.0f} {unit}{bound}, "
            f"got {value!r}"
        )
    return number


def _timeline(events: list[FaultEvent], seed: int) -> FaultModel:
    """The rows as a timeline: at least one, in the order they start (a row out of order is
    a mistake in the file, not something to sort silently)."""
    if not events:
        raise ConfigError(
            "the timeline has no rows (a run without faults names no timeline: no run --faults, "
            "no spec faults)"
        )
    for before, after in itertools.pairwise(events):
        if (after.start_iteration, after.at_ms) < (before.start_iteration, before.at_ms):
            raise ConfigError(
                f"fault row {after.row} starts before row {before.row} (iteration "
                f"{after.start_iteration} at {after.at_ms:g} ms after iteration "
                f"{before.start_iteration} at {before.at_ms:g} ms): order rows by when they start"
                f" (lines {before.line} and {after.line})"
            )
    return FaultModel(tuple(events), seed)


def _trace_links(row: int, names: list[str]) -> tuple[Link, ...]:
    links = []
    for name in names:
        text = name.strip()
        try:
            if text.count("_") != 1:
                raise ConfigError("not i_j")
            link = Link.parse(text.replace("_", "-"))
        except ConfigError:
            raise ConfigError(
                f"fault row {row}: {name!r} is not a PP link between neighbouring stages "
                "(e.g. '2_3')"
            ) from None
        links.append(link)
    return _each_once(row, links, names)


def _each_once(row: int, links: list[Link], names: list[str]) -> tuple[Link, ...]:
    """`links` (as `names` gave them), refused where one repeats another (a spec refuses the
    same; the row would slow the link once all the same)."""
    for k, link in enumerate(links):
        if link in links[:k]:
            first = links.index(link)
            raise ConfigError(
                f"fault row {row}: {names[k]!r} repeats link {link} ({names[first]!r}); "
                "list each link once"
            )
    return tuple(links)


def parse_trace(text: str, seed: int = 0) -> FaultModel:
    """The paper's trace: rows separated by newlines or spaces, fields by ';'; a '#' starts
    a comment, to the end of its line. A row's error names its row and its line in the file,
    lines counted by their newlines ("\n", "\r\n"): another character that breaks a line
    for some readers (a form feed, U+2028) is refused, naming its line."""
    rows = [
        (number, row_text)
        for number, line in enumerate(_trace_lines(text), 1)
        for row_text in line.partition("#")[0].split()
    ]
    events = []
    for row, (line, row_text) in enumerate(rows, 1):
        try:
            events.append(dataclasses.replace(_trace_event(row, row_text), line=line))
        except ConfigError as err:
            raise ConfigError(f"{err} (line {line})") from None
    return _timeline(events, seed)


def _trace_lines(text: str) -> list[str]:
    """`text`'s lines, split at newlines only (str.splitlines also splits at a form feed,
    U+2028 and the like, so a line's number was not the one an editor shows)."""
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    for number, line in enumerate(lines, 1):
        odd = next((char for char in line if char in _LINE_BREAKS), None)
        if odd is not None:
            raise ConfigError(
                f"line {number} holds a {_LINE_BREAKS[odd]} (U+{ord(odd):04X}), which breaks "
                "a line for some readers and not for others: end lines with a newline only"
            )
    return lines


def _trace_event(row: int, text: str) -> FaultEvent:
    fields = text.split(";")
    if len(fields) != 3:
        raise ConfigError(
            f"fault row {row}: {text!r} needs 3 fields 'start_iteration;links;delay_s' "
            "(spaces separate rows: none inside one)"
        )
    links = _trace_links(row, [n for n in fields[1].split(",") if n.strip()])
    delay_ms = _ms(row, fields[2], "delay", 1000.0, inf=True, unit="s", trace=True)
    if not links and delay_ms != math.inf:
        raise ConfigError(
            f"fault row {row}: a delay needs at least one link (a row with none fails a NIC, "
            "`;;inf`, and no row of this format ends a failure: a YAML row's end_iteration "
            "does)"
        )
    target = Target(TargetKind.LINKS, links=links) if links else _PAPER_NIC
    effect = Effect(down=True) if delay_ms == math.inf else Effect(delay_ms=delay_ms)
    return FaultEvent(_iteration(row, fields[0], trace=True), target, effect, row=row)


def _target(row: int, item: dict[str, Any], failure: bool) -> Target:
    given = [key for key in _TARGETS if key in item]
    if len(given) != 1:
        raise ConfigError(f"fault row {row}: give one target: links, hosts or nic")
    value = item[given[0]]
    if given[0] == "links":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"fault row {row}: links must be a list like ['0-1']")
        if not value:
            if failure:
                return _PAPER_NIC
            raise ConfigError(f"fault row {row}: a delay needs at least one link")
        try:
            links = [Link.parse(v) for v in value]
        except ConfigError as err:
            raise ConfigError(f"fault row {row}: {err}") from None
        return Target(TargetKind.LINKS, links=_each_once(row, links, value))
    if given[0] == "hosts":
        ok = isinstance(value, list) and len(value) == 2
        hosts = [_iteration(row, h, "host") for h in value] if ok else []
        if not ok or hosts[0] == hosts[1]:
            raise ConfigError(f"fault row {row}: hosts is a pair of two hosts, like [0, 1]")
        return Target(TargetKind.HOSTS, hosts=(min(hosts), max(hosts)))
    match = _NIC.fullmatch(str(value))
    if match is None:
        raise ConfigError(f"fault row {row}: nic {value!r} is not like 'host1:rnic0'")
    try:
        host = whole_number(match.group(1))
    except ConfigError as err:
        raise ConfigError(f"fault row {row}: nic host {err}") from None
    return Target(TargetKind.NIC, hosts=(host, 0), nic=match.group(2))


def _effect(row: int, item: dict[str, Any]) -> Effect:
    given = [key for key in _EFFECTS if key in item]
    if len(given) != 1:
        raise ConfigError(
            f"fault row {row}: give one effect: delay_ms (with jitter_ms), distribution, "
            "bandwidth_gbps, stall_ms or down"
        )
    kind, value = given[0], item[given[0]]
    if "jitter_ms" in item and kind != "delay_ms":
        raise ConfigError(f"fault row {row}: jitter_ms goes with delay_ms")
    if kind == "delay_ms":
        delay_ms = _ms(row, value, "delay_ms", inf=True)
        if delay_ms == math.inf:
            if "jitter_ms" in item:
                raise ConfigError(f"fault row {row}: jitter_ms cannot go with delay_ms inf (down)")
            return Effect(down=True)
        return Effect(delay_ms=delay_ms, jitter_ms=_ms(row, item.get("jitter_ms", 0), "jitter_ms"))
    if kind == "distribution":
        normal = value.get("normal") if isinstance(value, dict) else None
        every = value.get("redraw_every_ms") if isinstance(value, dict) else None
        if (
            not isinstance(normal, dict)
            or set(normal) != {"mean_ms", "std_ms"}
            or set(value) != {"normal", "redraw_every_ms"}
            or not (isinstance(every, list) and len(every) == 2)
        ):
            raise ConfigError(
                f"fault row {row}: distribution is {{normal: {{mean_ms, std_ms}}, "
                "redraw_every_ms: [lo, hi]}"
            )
        lo, hi = (_ms(row, v, "redraw_every_ms") for v in every)
        if not 1.0 <= lo <= hi:  # (a shorter one draws up to 1024 hi / lo values per block)
            raise ConfigError(f"fault row {row}: redraw_every_ms needs 1 <= lo <= hi (ms)")
        mean, std = _ms(row, normal["mean_ms"], "mean_ms"), _ms(row, normal["std_ms"], "std_ms")
        return Effect(normal_ms=(mean, std), redraw_every_ms=(lo, hi))
    if kind == "bandwidth_gbps":
        rate = _ms(row, value, "bandwidth_gbps", unit="Gbit/s")
        if not rate >= MIN_BANDWIDTH_GBPS:
            raise ConfigError(
                f"fault row {row}: bandwidth_gbps must be >= {MIN_BANDWIDTH_GBPS:g} (1 Mbit/s; "
                f"less is a failure: down: true), got {value!r}"
            )
        return Effect(bandwidth_gbps=rate)
    if kind == "stall_ms":
        stall_ms = _ms(row, value, "stall_ms")
        if not stall_ms > 0:  # Effect(stall_ms=0) is Effect(): the row would end every effect
            raise ConfigError(
                f"fault row {row}: stall_ms must be > 0 (a stall of 0 holds nothing; a row that "
                "ends the effects on its target is delay_ms: 0)"
            )
        return Effect(stall_ms=stall_ms)
    if value is not True:
        raise ConfigError(f"fault row {row}: down takes true")
    return Effect(down=True)


def parse_yaml(text: str, seed: int = 0) -> FaultModel:
    """YAML rows; a row's error names its row and the line it starts on in the file."""
    data, lines = load_yaml_lines(text, "the timeline")
    if not isinstance(data, list):
        raise ConfigError("a YAML fault timeline is a list of rows {start_iteration, ...}")
    events = []
    for row, (item, line) in enumerate(zip(data, lines, strict=True), 1):
        try:
            events.append(dataclasses.replace(_yaml_event(row, item), line=line))
        except ConfigError as err:
            raise ConfigError(f"{err} (line {line})") from None
    return _timeline(events, seed)


def _yaml_event(row: int, item: Any) -> FaultEvent:
    if not isinstance(item, dict) or "start_iteration" not in item:
        raise ConfigError(f"fault row {row}: a mapping with start_iteration")
    unknown = sorted(str(key) for key in set(item) - set(_KEYS))
    if unknown:
        raise ConfigError(
            f"fault row {row}: unknown key(s) {', '.join(unknown)}; keys: {', '.join(_KEYS)}"
        )
    effect = _effect(row, item)
    start = _iteration(row, item["start_iteration"])
    end = item.get("end_iteration")
    end_iteration = None if end is None else _iteration(row, end, "end iteration")
    if end_iteration is not None and end_iteration <= start:
        raise ConfigError(f"fault row {row}: end_iteration must come after start_iteration")
    return FaultEvent(
        start,
        _target(row, item, effect.down),
        effect,
        at_ms=_ms(row, item.get("at_ms", 0), "at_ms"),
        end_iteration=end_iteration,
        row=row,
    )
