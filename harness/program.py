"""The `adaptra-bench` program (its console script, and `python -m harness`): its shutdown
signals are handled before the command line's modules load (torch, pandas and click: about a
quarter of a second), so that a Ctrl-C or a `kill` in that time ends it as later (one line,
exit status 128 + the signal), not with a traceback, and is not lost where it started with
SIGINT ignored (a script's background job)."""

from __future__ import annotations

from pipeline.signals import run_script

__all__ = ["main"]


def main() -> None:
    run_script(_command_line)


def _command_line() -> None:
    from harness.cli import main  # under the handlers: the heavy imports

    main()
