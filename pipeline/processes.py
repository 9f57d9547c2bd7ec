"""Which process runs: a pid with its start time, which a reused pid does not share."""

from __future__ import annotations

from pathlib import Path

__all__ = ["process_start_time"]


def process_start_time(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot), or None if it does not run."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "; comm may have spaces
    if fields[0] in ("Z", "X"):  # a zombie has ended; only its exit status is left
        return None
    return int(fields[19])  # field 22 of proc(5), counted from field 3
