"""What `launch --spec` wrote a cluster job for (its folder's `launch.json`): the spec, and
for each srun step the configuration it runs, its folder and the plan it runs, which is what
`collect` needs to turn the steps' timelines into a run directory (harness.collect)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.resolved import ConfigurationKey
from harness.results import write_json_atomic
from pipeline.checks import is_number
from pipeline.errors import ConfigError
from pipeline.files import parse_json_file
from pipeline.torchrun_launch import LAUNCH_ID

__all__ = ["JOB_FILE", "JOB_VERSION", "ClusterJob", "ClusterStep"]

JOB_FILE = "launch.json"
JOB_VERSION = 2
"""2: a launch's id (its steps' workers write it beside their results)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterStep:
    """One srun step: a configuration's repeat, the folder its timeline goes to (relative to
    the job's folder), and what its plan is (its controller's first, run fixed), as a run's
    iterations.csv reports it."""

    configuration: ConfigurationKey
    """(model, system, scenario, repeat) as runs.csv names it."""
    folder: str
    policy: str
    comm: str
    """The plan's comm mode (`pipeline.simulator.CommMode` value)."""
    link_comms: dict[str, str]
    """Each PP link's comm mode (`Plan.comm_by_link`)."""
    believed_ms: dict[str, float]
    """The delays the plan was made for (`Plan.believed_ms`: an oracle's knowledge)."""

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "configuration": list(self.configuration)}

    @classmethod
    def from_dict(cls, data: Any) -> ClusterStep:
        if not isinstance(data, dict) or set(data) != {f.name for f in dataclasses.fields(cls)}:
            raise ConfigError("a step is not what launch writes: damaged?")
        key = data["configuration"]
        texts = (data["folder"], data["policy"], data["comm"])
        if (
            not (isinstance(key, list) and len(key) == 4 and all(isinstance(v, str) for v in key))
            or not all(isinstance(text, str) for text in texts)
            or not _mapping_of(data["link_comms"], str)
            or not _mapping_of(data["believed_ms"], float)
        ):
            raise ConfigError(f"step {data.get('folder')!r} is not what launch writes: damaged?")
        folder = Path(data["folder"])
        if folder.is_absolute() or ".." in folder.parts or not folder.parts:
            raise ConfigError(f"step folder {data['folder']!r} is not inside the job's folder")
        model, system, scenario, repeat = key
        return cls(
            (model, system, scenario, repeat),
            data["folder"],
            data["policy"],
            data["comm"],
            dict(data["link_comms"]),
            {link: float(ms) for link, ms in data["believed_ms"].items()},
        )


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterJob:
    """A cluster job's record: the spec it runs (`ExperimentSpec.to_dict`), the revision of
    the code that wrote it, the launch's id (its steps give it their workers, which write it
    beside their results: a job of an earlier launch into the same folder, queued or running
    when this one was written, writes its own), its steps, and the configurations it skipped
    (a line each, with why)."""

    spec: dict[str, Any]
    git_revision: str
    launch_id: str
    steps: tuple[ClusterStep, ...]
    skipped: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_version": JOB_VERSION,
            "git_revision": self.git_revision,
            "launch_id": self.launch_id,
            "spec": self.spec,
            "steps": [step.to_dict() for step in self.steps],
            "skipped": list(self.skipped),
        }

    @classmethod
    def from_dict(cls, data: Any) -> ClusterJob:
        if not isinstance(data, dict):
            raise ConfigError("not a cluster job's record (an object)")
        version = data.get("job_version")
        if version != JOB_VERSION:
            raise ConfigError(
                f"job version {version!r}; this version reads {JOB_VERSION} only "
                "(launch the spec again with this version)"
            )
        spec, revision, launch_id, steps, skipped = (
            data.get("spec"),
            data.get("git_revision"),
            data.get("launch_id"),
            data.get("steps"),
            data.get("skipped"),
        )
        if (
            not isinstance(spec, dict)
            or not isinstance(revision, str)
            or not (isinstance(launch_id, str) and LAUNCH_ID.fullmatch(launch_id))
            or not isinstance(steps, list)
            or not steps
            or not isinstance(skipped, list)
            or not all(isinstance(line, str) for line in skipped)
        ):
            raise ConfigError(
                "not what launch writes (spec, revision, launch id, steps, skipped): damaged?"
            )
        parsed = tuple(ClusterStep.from_dict(step) for step in steps)
        if len({step.configuration for step in parsed}) != len(parsed):
            raise ConfigError("a configuration has two steps: damaged?")
        return cls(spec, revision, launch_id, parsed, tuple(skipped))

    def write(self, job_dir: Path) -> Path:
        path = job_dir / JOB_FILE
        write_json_atomic(path, self.to_dict())
        return path

    @classmethod
    def read(cls, job_dir: Path) -> ClusterJob:
        """The record `launch --spec` wrote in `job_dir`; a folder without one is no job of
        this version's (ConfigError)."""
        path = job_dir / JOB_FILE
        if not path.is_file():
            raise ConfigError(
                f"{job_dir} is not a cluster job's folder: it has no {JOB_FILE} "
                "(`adaptra-bench launch --spec FILE --out DIR` writes one)"
            )
        return parse_json_file(path, "cluster job", cls.from_dict)


def _mapping_of(value: Any, kind: type) -> bool:
    """`value` is a JSON object of string keys and `kind` values (float: a finite number)."""
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        return False
    if kind is float:
        return all(is_number(v) and math.isfinite(v) for v in value.values())
    return all(isinstance(v, kind) for v in value.values())
