"""The tool's exception hierarchy: one base class, specific subclasses a caller can catch."""

from __future__ import annotations

__all__ = [
    "AdaptraBenchError",
    "BackendError",
    "ConfigError",
    "DeadlockError",
    "LaunchError",
    "LinkFailure",
    "MemoryLimitError",
    "ScheduleError",
]


class AdaptraBenchError(Exception):
    """Base of every error the tool raises on purpose; the CLI prints it as one line."""


class ConfigError(AdaptraBenchError, ValueError):
    """A profile, spec or option is malformed or out of range."""


class ScheduleError(AdaptraBenchError, ValueError):
    """A schedule is not a valid order of ops for its profile."""


class DeadlockError(ScheduleError):
    """The ops cannot all run: some stage waits on an op that never ends."""


class MemoryLimitError(ScheduleError):
    """A schedule's activation-memory count exceeds the profile's `mem_limit`."""


class BackendError(AdaptraBenchError, RuntimeError):
    """A compute backend was driven out of order (e.g. W before its B) or cannot run here."""


class LaunchError(AdaptraBenchError, RuntimeError):
    """A torchrun run on this machine (`launch --run`) failed or ran past its time."""


class LinkFailure(AdaptraBenchError, ConnectionError):
    """A message was sent on a link or through a NIC that has failed (the fault injectors
    raise it in the sending worker; the controller reports it as a `WorkerLinkFailure`)."""

    def __init__(self, message: str, *, at_ms: float | None = None) -> None:
        super().__init__(message)
        self.at_ms = at_ms
        """How far into its iteration the failed message went, ms (None where not known)."""
