"""A configuration's rows of runs.csv and iterations.csv (harness.results' columns), from its
measured result: one place for what each column holds, whether the run ran here
(harness.experiment) or on a cluster (harness.collect)."""

from __future__ import annotations

import json
from typing import Any

from harness.loop import RunResult
from harness.policies import SYSTEMS, resolve_system
from harness.results import RESULTS_SCHEMA_VERSION
from harness.spec import Configuration, ExperimentSpec

__all__ = ["configuration_rows"]


def configuration_rows(
    run_id: str, spec: ExperimentSpec, config: Configuration, result: RunResult
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """runs.csv's row of `config` and its iterations.csv rows (one per measured iteration
    run; after a restart, the lost ones again)."""
    common = _shared_columns(run_id, spec, config, result)
    return _run_row(common, spec, config, result), _iteration_rows(common, result)


def _shared_columns(
    run_id: str, spec: ExperimentSpec, config: Configuration, result: RunResult
) -> dict[str, Any]:
    """The columns runs.csv and iterations.csv share (iterations.csv's own comm and policy
    are each iteration's)."""
    target, system, scenario, repeat = config
    profile = scenario.apply(target.profile)
    policy, _ = SYSTEMS[system] if scenario.faults else resolve_system(system, profile)
    return {
        "run_id": run_id,
        "backend": spec.backend,
        "model": target.label,
        "policy": policy,
        "comm": result.comms_run,
        "system": system,
        "controller": result.controller,
        "scenario": scenario.name,
        "repeat": repeat,
    }


def _run_row(
    common: dict[str, Any], spec: ExperimentSpec, config: Configuration, result: RunResult
) -> dict[str, Any]:
    target, _, scenario, _ = config
    return {
        **common,
        "links": scenario.link_names,
        "delay_ms": scenario.delay_ms,
        "seed": spec.seed,
        "iterations": len(result.iteration_times_ms) - result.lost_iterations,
        "mean_iteration_ms": result.mean_iteration_ms,
        "median_iteration_ms": result.median_iteration_ms,
        "median_wall_ms": result.median_wall_ms,
        # useful samples over the whole run's time: slow steps, lost steps and restarts count
        "throughput_samples_per_s": target.samples_per_iteration
        * 1000.0
        / (result.total_ms / spec.num_iterations),
        "bubble_ratio": sum(result.bubble_ratios) / len(result.bubble_ratios),
        "restarts": result.restarts,
        "lost_iterations": result.lost_iterations,
        "restart_wall_ms": result.restart_wall_ms,
        "restart_model_ms": result.restart_model_ms,
        "failovers": sum(result.num_failovers),
        "moved_workers": sum(result.num_moved_workers),
        "num_delegates": max((d.num_delegates for d in result.decisions), default=0),
        "params_sha256": result.params_sha256,
        "schema_version": RESULTS_SCHEMA_VERSION,
    }


def _iteration_rows(common: dict[str, Any], result: RunResult) -> list[dict[str, Any]]:
    """One row per measured iteration run (after a restart, the lost ones again)."""
    losses = result.losses or (None,) * len(result.iteration_times_ms)
    return [
        {
            **common,
            "policy": decision.policy or common["policy"],
            "comm": comm.value,
            "loss": "" if loss is None else loss,
            "iteration": index,
            "iteration_time_ms": time_ms,
            "step_time_ms": step_ms,
            "bubble_ratio": bubble,
            "detected_ms": json.dumps(decision.detected_ms, sort_keys=True),
            "link_comms": json.dumps(decision.comm, sort_keys=True),
            "microbatches": decision.microbatches,
            "num_delegates": decision.num_delegates,
            "failovers": num_failovers,
            "moved_workers": num_moved_workers,
        }
        for (
            index,
            time_ms,
            step_ms,
            bubble,
            comm,
            loss,
            decision,
            num_failovers,
            num_moved_workers,
        ) in zip(
            result.iterations,
            result.iteration_times_ms,
            result.step_times_ms,
            result.bubble_ratios,
            result.comms,
            losses,
            result.decisions,
            result.num_failovers,
            result.num_moved_workers,
            strict=True,
        )
    ]
