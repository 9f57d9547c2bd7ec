"""The `adaptra-bench` command line: thin click commands over library calls."""

from __future__ import annotations

import sys

import click

from harness.commands_infra import cleanup, doctor, launch
from harness.commands_profile import profile
from harness.commands_run import compare, report, run
from harness.commands_schedule import schedule, simulate_cmd
from pipeline.errors import AdaptraBenchError

__all__ = ["cli", "main"]


@click.group()
@click.version_option(package_name="adaptra-bench")
def cli() -> None:
    """Fault-injection benchmarking of pipeline-parallel training schedules."""


for _command in (schedule, simulate_cmd, run, profile, report, compare, launch, doctor, cleanup):
    cli.add_command(_command)


def main(argv: list[str] | None = None) -> None:
    """Entry point: the tool's own errors become one line on stderr and exit status 1."""
    try:
        cli.main(args=argv, prog_name="adaptra-bench", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as err:
        err.show()
        sys.exit(err.exit_code)
    except AdaptraBenchError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(1)
