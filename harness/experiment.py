"""Experiments: a spec of policies x comm modes x delay scenarios, run into a results dir.

`default_experiment()` is what `adaptra-bench run` does with no arguments.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.plots import plot_iteration_time_vs_delay
from harness.policies import SYSTEMS, plan, resolve_system
from harness.results import (
    ITERATIONS_COLUMNS,
    RESULTS_SCHEMA_VERSION,
    RUNS_COLUMNS,
    git_revision,
    read_csv_rows,
    write_atomic,
    write_csv_atomic,
    write_json_atomic,
)
from harness.runner import BACKENDS, run_configuration
from pipeline.errors import ConfigError
from pipeline.gantt import plot_gantt
from pipeline.profile import Profile, link_name
from pipeline.schedule import Schedule
from pipeline.simulator import CommMode

__all__ = [
    "ExperimentSpec",
    "default_experiment",
    "load_spec",
    "run_experiment",
    "write_report",
]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ExperimentSpec:
    """Every combination of system and delay is one configuration, run `num_repeats` times."""

    name: str
    model: str
    """Name of the profile (the model it describes), as written in the results."""
    profile: Profile
    systems: tuple[str, ...]
    """DESIGN.md's systems (harness.policies.SYSTEMS), e.g. 1f1b, zb, adaptra-cpu, adaptra."""
    links: tuple[int, ...] = (0,)
    """PP links that receive the injected delay (by index: 0 is link 0-1)."""
    delays_ms: tuple[float, ...] = (0.0,)
    num_iterations: int = 5
    num_warmup_iterations: int = 1
    num_repeats: int = 1
    seed: int = 0
    backend: str = "sim"

    def __post_init__(self) -> None:
        unknown = [s for s in self.systems if s not in SYSTEMS]
        if not self.systems or unknown:
            raise ConfigError(
                f"unknown system {unknown[0] if unknown else '(none)'}; valid: {', '.join(SYSTEMS)}"
            )
        if self.backend not in BACKENDS:
            raise ConfigError(f"unknown backend {self.backend!r}; valid: {', '.join(BACKENDS)}")
        num_links = self.profile.num_stages - 1
        for link_idx in self.links:
            if not 0 <= link_idx < num_links:
                raise ConfigError(
                    f"link {link_idx} is out of range: {self.profile.num_stages} stages have "
                    f"links 0..{num_links - 1}"
                )
        for delay in self.delays_ms:
            if not delay >= 0:
                raise ConfigError(f"delays must be >= 0 ms, got {delay}")
        if self.num_iterations < 1 or self.num_repeats < 1 or self.num_warmup_iterations < 0:
            raise ConfigError("iterations and repeats must be >= 1, warm-up iterations >= 0")

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["profile"] = self.profile.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Any) -> ExperimentSpec:
        """The `to_dict` form, which is also the YAML spec file's: links by index or "i-j"."""
        if not isinstance(data, dict):
            raise ConfigError("an experiment spec is a mapping of its fields")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise ConfigError(
                f"unknown spec key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(fields))}"
            )
        missing = [k for k in ("name", "model", "profile", "systems") if k not in data]
        if missing:
            raise ConfigError(f"the spec is missing {', '.join(missing)}")
        values = dict(data)
        values["profile"] = Profile.from_dict(data["profile"])
        for key in ("systems", "delays_ms"):
            if key in values:
                values[key] = tuple(values[key] if isinstance(values[key], list) else [values[key]])
        if "links" in values:
            values["links"] = tuple(_link_index(link) for link in values["links"])
        return cls(**values)


def _link_index(link: Any) -> int:
    if isinstance(link, int) and not isinstance(link, bool):
        return link
    text = str(link)
    first, _, second = text.partition("-")
    if not (first.isdigit() and second.isdigit() and int(second) == int(first) + 1):
        raise ConfigError(f"link {text!r} is not a PP link like '0-1'")
    return int(first)


def load_spec(path: Path) -> ExperimentSpec:
    """An experiment spec from a YAML (or JSON) file; every error names the file."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except OSError as err:
        raise ConfigError(f"cannot read spec {path}: {err.strerror}") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"spec {path} is not valid YAML: {err}") from err
    try:
        return ExperimentSpec.from_dict(data)
    except (ConfigError, TypeError) as err:
        raise ConfigError(f"spec {path}: {err}") from err


def default_experiment() -> ExperimentSpec:
    """1F1B, ZB, Adaptra-CPU and Adaptra on the paper's Fig. 4 pipeline, a slow first link."""
    return ExperimentSpec(
        name="default",
        model="fig4-uniform-10ms",
        profile=Profile.uniform(4, 12, t_f_ms=10, t_b_ms=10, t_w_ms=10),
        systems=("1f1b", "zb", "adaptra-cpu", "adaptra"),
        links=(0,),
        delays_ms=(0.0, 10.0, 20.0, 40.0),
    )


def _delayed(spec: ExperimentSpec, delay_ms: float) -> Profile:
    return spec.profile.with_delays(
        [delay_ms if i in spec.links else 0.0 for i in range(spec.profile.num_stages - 1)]
    )


def _scenario(links: tuple[int, ...], delay_ms: float) -> tuple[str, str]:
    names = ",".join(link_name(i) for i in links)
    return (f"{names}@{delay_ms:g}ms" if delay_ms else "fault-free"), names


def new_run_id(name: str) -> str:
    return f"{name}-{dt.datetime.now(dt.UTC).strftime('%Y%m%d-%H%M%S')}"


def run_experiment(
    spec: ExperimentSpec,
    run_dir: Path,
    progress: Callable[[str], None] = logger.info,
) -> Path:
    """Run every configuration not already in `run_dir` (resume), writing files atomically."""
    run_id = run_dir.name
    spec_path = run_dir / "spec.json"
    spec_record = {
        "schema_version": RESULTS_SCHEMA_VERSION,
        "run_id": run_id,
        "git_revision": git_revision(),
        "spec": spec.to_dict(),
    }
    if spec_path.exists():
        previous = json.loads(spec_path.read_text()).get("spec")
        if previous != json.loads(json.dumps(spec_record["spec"])):
            raise ConfigError(f"{run_dir} holds a different experiment; pick a new run id")
    write_json_atomic(spec_path, spec_record)
    runs: list[dict[str, Any]] = read_csv_rows(run_dir / "runs.csv")
    done = {(r["system"], r["scenario"], r["repeat"]) for r in runs}
    # runs.csv is written after iterations.csv: rows of a configuration it lacks are stale.
    iterations: list[dict[str, Any]] = [
        r
        for r in read_csv_rows(run_dir / "iterations.csv")
        if (r["system"], r["scenario"], r["repeat"]) in done
    ]
    configs = [
        (system, delay, repeat)
        for system in spec.systems
        for delay in spec.delays_ms
        for repeat in range(spec.num_repeats)
    ]
    schedules: dict[tuple[str, float], Schedule] = {}
    for count, (system, delay, repeat) in enumerate(configs, start=1):
        scenario, links = _scenario(spec.links, delay)
        if (system, scenario, str(repeat)) in done:
            continue
        profile = _delayed(spec, delay)
        policy, comm = resolve_system(system, profile)
        if (policy, delay) not in schedules:  # planned per scenario (Adaptra adapts), once
            schedules[policy, delay] = plan(policy, profile).schedule
        result = run_configuration(
            schedules[policy, delay],
            profile,
            backend=spec.backend,
            comm=comm,
            num_iterations=spec.num_iterations,
            num_warmup_iterations=spec.num_warmup_iterations,
        )
        common = {
            "run_id": run_id,
            "backend": spec.backend,
            "model": spec.model,
            "policy": policy,
            "comm": comm,
            "system": system,
            "scenario": scenario,
            "repeat": repeat,
        }
        runs.append(
            {
                **common,
                "links": links,
                "delay_ms": delay,
                "seed": spec.seed,
                "iterations": len(result.iteration_times_ms),
                "mean_iteration_ms": result.mean_iteration_ms,
                "median_iteration_ms": result.median_iteration_ms,
                "throughput_samples_per_s": spec.profile.num_microbatches
                * 1000.0
                / result.median_iteration_ms,
                "bubble_ratio": sum(result.bubble_ratios) / len(result.bubble_ratios),
                "schema_version": RESULTS_SCHEMA_VERSION,
            }
        )
        for idx, (time_ms, step_ms, bubble) in enumerate(
            zip(result.iteration_times_ms, result.step_times_ms, result.bubble_ratios, strict=True)
        ):
            iterations.append(
                {
                    **common,
                    "iteration": idx,
                    "iteration_time_ms": time_ms,
                    "step_time_ms": step_ms,
                    "bubble_ratio": bubble,
                }
            )
        write_csv_atomic(run_dir / "iterations.csv", ITERATIONS_COLUMNS, iterations)
        write_csv_atomic(run_dir / "runs.csv", RUNS_COLUMNS, runs)
        progress(
            f"[{count}/{len(configs)}] {system} {scenario}: "
            f"{result.median_iteration_ms:.1f} ms median"
        )
    write_report(spec, run_dir, runs)
    return run_dir


def write_report(spec: ExperimentSpec, run_dir: Path, runs: list[dict[str, Any]]) -> None:
    plot_iteration_time_vs_delay(
        runs,
        run_dir / "iteration_time_vs_delay.png",
        title=f"{spec.model}: delay on link(s) {','.join(link_name(i) for i in spec.links)}",
    )
    worst = max(spec.delays_ms)
    profile = _delayed(spec, worst)
    for system in spec.systems:
        policy, comm = resolve_system(system, profile)
        run = run_configuration(
            plan(policy, profile).schedule,
            profile,
            backend="sim",
            comm=CommMode(comm),
            num_iterations=1,
            num_warmup_iterations=0,
        )
        plot_gantt(
            run.timeline,
            run_dir / f"gantt_{system}.png",
            title=f"{system} ({policy} over {comm}), {worst:g} ms on link(s) "
            f"{','.join(link_name(i) for i in spec.links)}",
        )
    lines = [
        f"# {spec.name}: {spec.model}",
        "",
        f"Backend `{spec.backend}`, {spec.num_iterations} measured iterations per configuration.",
        "",
        "| system | scenario | median iteration (ms) | bubble ratio |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {r['system']} | {r['scenario']} | {float(r['median_iteration_ms']):.1f} | "
        f"{float(r['bubble_ratio']):.3f} |"
        for r in runs
    ]
    lines += ["", "![iteration time vs delay](iteration_time_vs_delay.png)", ""]
    write_atomic(run_dir / "report.md", "\n".join(lines))
