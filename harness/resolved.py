"""What a run's spec resolved to when it ran (spec.json's `resolved`), and how many of its
configurations a run directory's runs.csv holds: what `report` and `compare` read instead of
resolving the models again with the cost model of the version reading them."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from pipeline.errors import ConfigError

__all__ = ["ConfigurationKey", "Coverage", "ResolvedSpec", "configuration_name", "coverage"]

ConfigurationKey = tuple[str, str, str, str]
"""(model, system, scenario, repeat) as runs.csv writes them: what names a configuration."""


def configuration_name(key: ConfigurationKey) -> str:
    """A configuration as messages name it: "fig4 zb 0-1@10ms (repeat 0)"."""
    model, system, scenario, repeat = key
    return f"{model} {system} {scenario} (repeat {repeat})"


@dataclasses.dataclass(frozen=True, slots=True)
class ResolvedSpec:
    """What a run's spec resolved to when it ran, as spec.json keeps it (`resolved`): each
    model's label and samples per iteration (its global batch), in the spec's order, and every
    configuration's key (model, system, scenario, repeat) in the order the run runs them. A
    report, and compare's check that a run finished, read these rather than resolve the
    models with the cost model of the version reading them (a preset changed or renamed since
    would count other samples, or none)."""

    samples_per_iteration: dict[str, int]
    configurations: tuple[ConfigurationKey, ...]

    @property
    def first_model(self) -> str:
        return next(iter(self.samples_per_iteration))

    def to_dict(self) -> dict[str, Any]:
        return {
            "samples_per_iteration": dict(self.samples_per_iteration),
            "configurations": [list(key) for key in self.configurations],
        }

    @classmethod
    def from_dict(cls, data: Any) -> ResolvedSpec:
        """The `to_dict` form; anything else is spec.json's damage (ConfigError)."""
        samples = data.get("samples_per_iteration") if isinstance(data, dict) else None
        keys = data.get("configurations") if isinstance(data, dict) else None
        if (
            not isinstance(samples, dict)
            or not samples
            or not all(isinstance(n, int) and not isinstance(n, bool) for n in samples.values())
            or not isinstance(keys, list)
            or not all(
                isinstance(k, list) and len(k) == 4 and all(isinstance(v, str) for v in k)
                for k in keys
            )
        ):
            raise ConfigError("its `resolved` is not what a run writes: damaged?")
        return cls(dict(samples), tuple((m, s, c, r) for m, s, c, r in keys))


@dataclasses.dataclass(frozen=True, slots=True)
class Coverage:
    """How many of the configurations a run lists runs.csv holds, and those it lacks."""

    done: int
    listed: int
    missing: tuple[ConfigurationKey, ...] = ()

    @property
    def complete(self) -> bool:
        return self.done == self.listed

    def __str__(self) -> str:
        return f"{self.done} of {self.listed} configurations"


def coverage(resolved: ResolvedSpec, runs: Sequence[Mapping[str, Any]]) -> Coverage:
    """The configurations of `resolved` that `runs` (runs.csv's rows) holds, of all it lists."""
    done = {(str(r["model"]), str(r["system"]), str(r["scenario"]), str(r["repeat"])) for r in runs}
    missing = tuple(key for key in resolved.configurations if key not in done)
    listed = len(resolved.configurations)
    return Coverage(listed - len(missing), listed, missing)
