"""The `adaptra-bench` command line: thin click commands over library calls."""

from __future__ import annotations

import gc
import os
import signal
import sys
import tempfile
import traceback
from typing import Any

import click

from harness.commands_compare import compare
from harness.commands_infra import cleanup, doctor, launch
from harness.commands_profile import calibrate, profile
from harness.commands_run import collect, report, run
from harness.commands_schedule import schedule, simulate_cmd
from pipeline.errors import AdaptraBenchError
from pipeline.signals import (
    Terminated,
    handled_shutdown,
    say_ending,
    signals_unwrapped,
    wait_for_redelivery,
)

__all__ = ["cli", "main"]


class _Interrupted(BaseException):
    """A KeyboardInterrupt in a command, past click's `main`: that prints a blank line to
    stderr before it raises Abort (for a terminal's ^C echo), a second line of stderr."""


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as err:
            raise _Interrupted from err


@click.group(cls=_Group)
@click.version_option(package_name="adaptra-bench")
def cli() -> None:
    """Fault-injection benchmarking of pipeline-parallel training schedules."""


for _command in (
    schedule,
    simulate_cmd,
    run,
    profile,
    calibrate,
    report,
    collect,
    compare,
    launch,
    doctor,
    cleanup,
):
    cli.add_command(_command)


def main(argv: list[str] | None = None) -> None:
    """The command line, run in this process (the program's entry point,
    `harness.program.main`, calls it once its own handlers are in). Exit status: 0 done, 1
    a refused input or a failed run (the tool's own errors, one line on stderr), 2 a usage
    error, 3 an internal error (a bug: one line on stderr naming a log file with the
    traceback), 128 + n on signal n (SIGINT 130, SIGHUP 129, SIGTERM 143) after every
    cleanup."""
    # The program's own command line ends its process after this: a signal from then on ends
    # it by that signal (Python's SIGINT handler put back raised a KeyboardInterrupt as it
    # exited: a traceback after the results, and exit status 0).
    with handled_shutdown(put_back=argv is not None):
        _main(argv)


def _main(argv: list[str] | None) -> None:
    try:
        with signals_unwrapped():
            cli.main(args=argv, prog_name="adaptra-bench", standalone_mode=False)
            # A signal that a finalizer swallowed as the command ended is handled here, as
            # one not swallowed is (else it came once the handlers were gone: no line, no
            # 128 + n).
            wait_for_redelivery()
    except (click.exceptions.Abort, KeyboardInterrupt, _Interrupted) as err:
        past_the_echo = "\n" if isinstance(err, _Interrupted) and sys.stderr.isatty() else ""
        say_ending(past_the_echo + "interrupted (SIGINT)")  # past the terminal's ^C
        sys.exit(128 + signal.SIGINT)
    except Terminated as err:
        say_ending(f"terminated ({err})")
        sys.exit(128 + err.signum)
    except click.exceptions.NoArgsIsHelpError as err:
        click.echo(err.format_message(), err=True)  # the help, as asked for by giving nothing
        sys.exit(err.exit_code)
    except click.ClickException as err:
        click.echo(f"error: {_one_line(err)}", err=True)
        sys.exit(err.exit_code)
    except (AdaptraBenchError, OSError) as err:  # OSError: a file or the system said no
        click.echo(f"error: {_clipped(_escaped_line_breaks(str(err)))}", err=True)
        sys.exit(1)
    except Exception as err:
        log = _write_crash_log(argv)
        summary = f"{type(err).__name__}: {err}".splitlines()[0]
        click.echo(f"internal error: {summary} (a bug; traceback in {log})", err=True)
        sys.exit(3)
    finally:
        if argv is None:
            # Its exit then skips collecting what it imported (torch): about 0.13 s where it
            # took 0.5 s here, after the last line (BENCHMARKS.md, "Shutdown").
            gc.freeze()


MAX_ERROR_CHARS = 2000
"""The most of an error's message the command line prints: a message quotes the value it
refuses, which may be as long as the input (a spec's list of 100,000 models)."""


def _clipped(message: str) -> str:
    if len(message) <= MAX_ERROR_CHARS:
        return message
    return f"{message[:MAX_ERROR_CHARS]}... ({len(message):,} characters in all)"


_LINE_BREAKS = {ord(c): repr(c)[1:-1] for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"}
"""What str.splitlines breaks a line at, each to its escape as repr writes it ("\\n")."""


def _escaped_line_breaks(message: str) -> str:
    """`message` on one line: an error may quote an input's value as it is (an unknown system
    or spec key), and a line break in that value would start a line of its own."""
    return message.translate(_LINE_BREAKS)


def _one_line(err: click.ClickException) -> str:
    """click's message on one line, clipped; a usage error then names the help to read
    (click's own form prints the usage and a hint on lines of their own; clipped after it,
    a long message cut the hint)."""
    message = _clipped(" ".join(err.format_message().split()))
    if isinstance(err, click.UsageError) and err.ctx is not None:
        message += f" (see {err.ctx.command_path} --help)"
    return message


def _write_crash_log(argv: list[str] | None) -> str:
    """The current exception's traceback in a new file under the temp directory, and its
    path; on stderr if no file can be written."""
    command = " ".join(sys.argv[1:] if argv is None else argv)
    try:
        handle, path = tempfile.mkstemp(prefix="adaptra-bench-internal-error-", suffix=".log")
        with os.fdopen(handle, "w") as log:
            log.write(f"adaptra-bench {command}\n\n{traceback.format_exc()}")
    except OSError as err:
        traceback.print_exc()
        return f"stderr above (no log file: {err.strerror})"
    return path
