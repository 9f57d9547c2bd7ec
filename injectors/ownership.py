"""Who owns a testbed's namespaces, and the cleanup of those whose owner is gone.

A testbed writes an owner record (its process id and that process's start time, which a
reused pid does not share) before it creates any namespace, and removes it after its
teardown. `cleanup` removes only namespaces whose owner process no longer runs, so it is safe
beside a live run; it leaves the others and says why.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from pathlib import Path

from pipeline.files import write_atomic
from pipeline.processes import process_start_time

__all__ = [
    "OWNER_DIR",
    "CleanupReport",
    "OwnerRecord",
    "cleanup",
]

OWNER_DIR = Path("/run/adaptra-bench/testbeds")
"""On tmpfs, like the namespaces themselves (/run/netns): both are gone after a reboot."""


@dataclasses.dataclass(frozen=True, slots=True)
class OwnerRecord:
    """The testbed `testbed` with `namespaces`, made by process `pid` started at
    `start_time`."""

    testbed: str
    pid: int
    start_time: int
    namespaces: tuple[str, ...]

    @classmethod
    def for_this_process(cls, testbed: str, namespaces: tuple[str, ...]) -> OwnerRecord:
        pid = os.getpid()
        start_time = process_start_time(pid)
        assert start_time is not None  # this process runs
        return cls(testbed, pid, start_time, namespaces)

    def owner_alive(self) -> bool:
        return process_start_time(self.pid) == self.start_time

    def path(self, directory: Path = OWNER_DIR) -> Path:
        return directory / f"{self.testbed}.json"

    def write(self, directory: Path = OWNER_DIR) -> None:
        write_atomic(self.path(directory), json.dumps(dataclasses.asdict(self)))

    def remove(self, directory: Path = OWNER_DIR) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path(directory).unlink()

    @classmethod
    def read_all(cls, directory: Path = OWNER_DIR) -> list[OwnerRecord]:
        """Every readable record; unreadable ones are skipped (their namespaces then have no
        known owner, and cleanup leaves them)."""
        records = []
        for path in sorted(directory.glob("*.json")):
            try:
                data = json.loads(path.read_text())
                records.append(
                    cls(
                        str(data["testbed"]),
                        int(data["pid"]),
                        int(data["start_time"]),
                        tuple(str(n) for n in data["namespaces"]),
                    )
                )
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return records


@dataclasses.dataclass(frozen=True, slots=True)
class CleanupReport:
    removed: tuple[str, ...]
    left: tuple[tuple[str, str], ...]
    """(namespace, why it was left)"""
    failed: tuple[tuple[str, str], ...]
    """(namespace, the error removing it gave)"""


def cleanup(prefix: str = "adb-", directory: Path = OWNER_DIR) -> CleanupReport:
    """Remove every namespace whose name starts with `prefix` and whose testbed's owner
    process is gone; leave the others, and say why."""
    from pyroute2 import netns

    records = OwnerRecord.read_all(directory)
    owners = {ns: record for record in records for ns in record.namespaces}
    removed: list[str] = []
    left: list[tuple[str, str]] = []
    failed: list[tuple[str, str]] = []
    for name in sorted(netns.listnetns()):
        if not name.startswith(prefix):
            continue
        record = owners.get(name)
        if record is None:
            left.append(
                (name, "no owner record (not a testbed's of this version): `ip netns delete` it")
            )
        elif record.owner_alive():
            left.append((name, f"in use: its testbed's process {record.pid} still runs"))
        else:
            try:
                netns.remove(name)
                removed.append(name)
            except FileNotFoundError:
                pass  # gone meanwhile (another cleanup, or its owner's late teardown)
            except OSError as err:
                failed.append((name, err.strerror or str(err)))
    present = set(netns.listnetns())
    for record in records:
        if not record.owner_alive() and not present.intersection(record.namespaces):
            record.remove(directory)
    return CleanupReport(tuple(removed), tuple(left), tuple(failed))
