"""Helpers shared by the command modules: loading inputs, option sets, JSON output."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from harness.loop import iteration_name
from harness.paper import preset_files
from harness.policies import GIVEN_POLICY, POLICIES, PlannedSchedule, plan
from pipeline.checks import MAX_WAIT_S
from pipeline.errors import ConfigError, ScheduleError
from pipeline.files import read_json, read_text
from pipeline.host_costs import FREE, HostCosts
from pipeline.profile import Profile
from pipeline.schedule import Schedule, check_memory, validate_schedule
from pipeline.torch_csv import from_torch_csv

__all__ = [
    "FiniteFloatRange",
    "InputFile",
    "OutputFolder",
    "SpecFile",
    "calibration_option",
    "emit_json",
    "folder_made_for",
    "given_options",
    "load_host_costs",
    "output_file_option",
    "refuse_options",
    "refuse_outputs_over_inputs",
    "resolve",
    "schedule_options",
    "seconds",
    "terminal_progress",
]

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


class FiniteFloatRange(click.FloatRange):
    """click's FloatRange that also refuses nan (which passes every bound) and inf (which
    passes a range with no upper bound): an option's number is a finite one."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{number} is not a finite number.", param, ctx)
        return number


class _GivenPath(click.Path):
    """A path that is not empty ("" names nothing: it was taken as not given, or as the
    current folder)."""

    names = "path"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value == "":
            self.fail(f"the path is empty: give a {self.names}", param, ctx)
        return super().convert(value, param, ctx)


class InputFile(_GivenPath):
    """The path of a file the command reads (and names in its own errors): not a directory,
    and not empty (`--profile ""` was "cannot read profile : Is a directory", `--spec ""`
    and `--faults ""` were taken as not given)."""

    names = "file"

    def __init__(self) -> None:
        super().__init__(dir_okay=False)


class SpecFile(InputFile):
    """An experiment spec's path or, where no such file is, a bundled preset's name (its
    `name:` or its file's stem: `--spec fig16`); a name that is neither is refused, listing
    the presets. A folder of a preset's name is no spec: the preset (`--out fig16` made one,
    and resuming that run with `--spec fig16` was refused as "a directory")."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value and not os.path.isfile(value):
            presets = preset_files()
            if value in presets:
                return str(presets[value])
            if not os.path.lexists(value) and os.sep not in value and "." not in value:
                shown = {file: name for name, file in presets.items()}  # its `name:`, else stem
                names = ", ".join(sorted(shown.values(), key=_in_number_order))
                self.fail(
                    f"{value!r} is no file, nor a bundled preset's name ({names})", param, ctx
                )
        return super().convert(value, param, ctx)  # a file (or what its reader refuses)


def _in_number_order(name: str) -> list[str | int]:
    """A sort key: fig3 before fig15."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


class OutputFolder(_GivenPath):
    """The path of a folder the command writes under: not a file, and not empty (`--out ""`
    wrote into the current folder)."""

    names = "folder"

    def __init__(self) -> None:
        super().__init__(file_okay=False)


@contextlib.contextmanager
def folder_made_for(folder: Path) -> Iterator[None]:
    """A command's output folder (`--out`), removed again where the command made it (it was
    absent) and fails with it still empty: a refused run left an empty folder."""
    absent = not os.path.lexists(folder)
    try:
        yield
    except BaseException:
        if absent:
            with contextlib.suppress(OSError):  # not empty, or not ours after all: it stays
                folder.rmdir()
        raise


def seconds(max_s: float = MAX_WAIT_S) -> FiniteFloatRange:
    """The type of an option giving a time in seconds: finite, > 0 and at most `max_s`."""
    return FiniteFloatRange(min=0, min_open=True, max=max_s)


def _load_schedule(path: str) -> tuple[Schedule, object, bool]:
    """A schedule file (JSON with `stages`, or a torch CSV: known by its first character),
    the `profile` value it embeds, if any (None: none), and whether it is a torch CSV (which
    embeds none); its errors name the file."""
    text = read_text(path, "schedule")
    if not text.lstrip().startswith(("{", "[")):
        return _named(path, "", lambda: from_torch_csv(text)), None, True
    data = read_json(path, "schedule")
    schedule = _named(path, "", lambda: Schedule.from_dict(data))
    return schedule, data.get("profile") if isinstance(data, dict) else None, False


def _named(path: str, part: str, parse: Callable[[], T]) -> T:
    """`parse()`, its error naming the schedule file `path` (and the `part` of it)."""
    try:
        return parse()
    except (ConfigError, ScheduleError) as err:
        raise type(err)(f"schedule {path}: {part}{err}") from err


def _embedded_profile(path: str, embedded: object) -> Profile:
    """The profile a schedule file embeds: an object in the profile file's form."""
    if not isinstance(embedded, dict):
        raise ConfigError(
            f"schedule {path}: 'profile' must be an object (the profile file's form), got "
            f"{type(embedded).__name__} {embedded!r:.40}"
        )
    return _named(path, "profile: ", lambda: Profile.from_dict(embedded))


def resolve(
    profile_path: str | None,
    policy: str | None,
    schedule_path: str | None,
    time_limit_s: float | None = None,
) -> tuple[Profile, PlannedSchedule]:
    """The profile and the schedule a command works on, from --profile and --policy/--schedule
    (with --schedule, a --time-limit would be ignored: refused)."""
    if (policy is None) == (schedule_path is None):
        raise ConfigError("give exactly one of --policy and --schedule")
    if schedule_path is not None and time_limit_s is not None:
        refuse_options({"time_limit_s"}, "a --schedule is run as given, nothing is solved")
    schedule, embedded, csv = (
        _load_schedule(schedule_path) if schedule_path else (None, None, False)
    )
    if profile_path is not None:
        profile = Profile.from_file(profile_path)
    elif schedule_path is not None and embedded is not None:
        profile = _embedded_profile(schedule_path, embedded)
    elif schedule_path is None:
        raise ConfigError("--profile is required: give the profile file (its format: the README)")
    else:
        carries = "is a torch CSV, which carries no profile" if csv else "has no 'profile' key"
        raise ConfigError(f"--profile is required: the schedule file {schedule_path} {carries}")
    if schedule is None or schedule_path is None:
        return profile, plan(str(policy), profile, time_limit_s=time_limit_s)
    ordered = schedule  # its order's errors name the file too
    _named(
        schedule_path,
        "",
        lambda: validate_schedule(ordered, profile.num_stages, profile.num_microbatches),
    )
    check_memory(schedule, profile.mem_limit, f"the schedule in {schedule_path}")
    return profile, PlannedSchedule(GIVEN_POLICY, f"schedule file {schedule_path}", schedule, 0.0)


def _refuse_system(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:
        raise click.UsageError(
            f"--system is run's (a policy with its comm and controller); {ctx.info_name} takes "
            f"--policy {value}"
        )


def schedule_options(func: F, *, refuses_system: bool = True) -> F:
    """--profile, --policy, --time-limit and --schedule; a hidden --system refused with a
    pointer to --policy unless the command has one of its own (`refuses_system` False)."""
    if refuses_system:
        func = click.option("--system", hidden=True, expose_value=False, callback=_refuse_system)(
            func
        )
    func = click.option(
        "--schedule",
        "schedule_path",
        type=InputFile(),
        help="JSON object with a 'stages' key (or a torch CSV): run exactly that order.",
    )(func)
    func = click.option(
        "--time-limit",
        "time_limit_s",
        type=seconds(),
        help=(
            "Wall-clock seconds for the exact solver: `milp` (default 30), `adaptra` (default:"
            " a deterministic solve of at most 150 ops only)."
        ),
    )(func)
    func = click.option(
        "--policy",
        "policy",
        type=click.Choice(list(POLICIES)),
        help="Policy that orders the ops.",
    )(func)
    func = click.option(
        "--profile",
        "profile_path",
        type=InputFile(),
        help="Profile JSON file (its format: the README).",
    )(func)
    return func


def calibration_option(func: F) -> F:
    return click.option(
        "--calibration",
        "calibration_path",
        type=InputFile(),
        help="This host's runtime costs (`adaptra-bench calibrate --out HOST.json`): the "
        "direct and delegated models then predict a real run here.",
    )(func)


def load_host_costs(path: str | None) -> HostCosts:
    """The calibration file's costs (FREE without one), warning in one line where it was
    measured on another host (HostCosts.other_host_warning)."""
    if path is None:
        return FREE
    costs = HostCosts.from_file(path)
    warning = costs.other_host_warning()
    if warning is not None:
        click.echo(warning, err=True)
    return costs


def given_options() -> set[str]:
    """The running command's parameters that the command line (or the environment) set."""
    ctx = click.get_current_context()
    return {
        name
        for name in ctx.params
        if ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT)
    }


def refuse_options(names: set[str], why: str) -> None:
    """An option the command would ignore is a mistake: refuse `names`, saying `why`."""
    if not names:
        return
    ctx = click.get_current_context()
    flags = [p.opts[0] for p in ctx.command.params if p.name in names]
    raise ConfigError(f"{', '.join(flags)}: {why}")


def output_file_option(flag: str, suffixes: tuple[str, ...], **kwargs: Any) -> Callable[[F], F]:
    """An output file: its suffix one of `suffixes` and its folder existing and writable (a
    file made there and removed), checked before the command does any work (so nothing
    computed is lost to a bad path)."""

    def check(_ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value is None:
            return None
        path = Path(value)
        if path.name.lower() in ("", *suffixes):  # ".png" is a hidden file with no suffix
            raise click.BadParameter(
                f"{value!r} names no file: give a name ending in {' or '.join(suffixes)}, "
                f"e.g. out{suffixes[0]}",
                param_hint=flag,
            )
        if path.suffix.lower() not in suffixes:
            raise click.BadParameter(
                f"{value!r} must end in {' or '.join(suffixes)}", param_hint=flag
            )
        if not path.parent.is_dir():
            raise click.BadParameter(
                f"{value!r}: the folder {str(path.parent)!r} does not exist", param_hint=flag
            )
        try:  # as the write will: a file beside it (root writes where access(2) says so)
            fd, probe = tempfile.mkstemp(dir=path.parent, prefix=".adaptra-probe-")
        except OSError as err:
            raise click.BadParameter(
                f"{value!r}: the folder {str(path.parent)!r} cannot be written ({err.strerror})",
                param_hint=flag,
            ) from err
        os.close(fd)
        os.unlink(probe)
        return value

    return click.option(flag, type=_OutputFile(dir_okay=False), callback=check, **kwargs)


class _OutputFile(click.Path):
    """The type of `output_file_option`'s options (`refuse_outputs_over_inputs` finds them
    by it)."""


def refuse_outputs_over_inputs() -> None:
    """A ConfigError where an output file the running command was given (`output_file_option`)
    is one of its input files (an `InputFile`: the same file, by any path or link): `simulate
    --profile p.json --trace p.json` wrote its trace over the profile, and exited 0."""
    ctx = click.get_current_context()
    given = [(p, ctx.params.get(p.name or "")) for p in ctx.command.params]
    inputs = [(p, path) for p, path in given if isinstance(p.type, InputFile) and path]
    for param, out in given:
        if not isinstance(param.type, _OutputFile) or not out or not os.path.exists(out):
            continue
        for source, path in inputs:
            if os.path.exists(path) and os.path.samefile(out, path):
                raise ConfigError(
                    f"{param.opts[0]} {out} is the {source.opts[0]} file it reads: writing it "
                    "would overwrite that input; give another file name"
                )


def emit_json(data: dict[str, Any]) -> None:
    click.echo(json.dumps(data, indent=1))


class IterationProgress:
    """One line on a terminal's stderr, rewritten as each iteration ends: which (the
    warm-ups first, numbered apart from the measured ones, each from 0 as the fault timeline,
    the results and the errors number them: `iteration_name`; one run again after a restart
    says so), how long so far, about how long left (at the mean pace so far)."""

    def __init__(self, num_iterations: int, num_warmup_iterations: int = 0) -> None:
        self.num_iterations, self.num_warmup_iterations = num_iterations, num_warmup_iterations
        self.started, self.num_ended, self.reached = time.monotonic(), 0, 0

    def step(self, iteration: int | None = None) -> None:
        """Iteration `iteration` ended (the engine's index, warm-ups included; None: the one
        after the last). One not after the furthest so far is a restart's re-run."""
        number = self.reached + 1 if iteration is None else iteration + 1
        again = number <= self.reached
        self.reached = max(self.reached, number)
        self.num_ended += 1
        total = self.num_warmup_iterations + self.num_iterations
        elapsed_s = time.monotonic() - self.started
        left_s = elapsed_s / self.num_ended * max(total - number, 0)
        which = iteration_name(number - 1, self.num_warmup_iterations, self.num_iterations)
        if again:
            which += " again (after a restart)"
        click.echo(f"\r{which}, {elapsed_s:.0f} s, ~{left_s:.0f} s left ", err=True, nl=False)

    def done(self) -> None:
        click.echo("", err=True)


def terminal_progress(
    num_iterations: int, num_warmup_iterations: int, fmt: str
) -> IterationProgress | None:
    """Progress for a long command when a person watches: text output on a terminal (none
    with --format json or when stderr is a file or a pipe)."""
    if fmt != "text" or not sys.stderr.isatty():
        return None
    return IterationProgress(num_iterations, num_warmup_iterations)
