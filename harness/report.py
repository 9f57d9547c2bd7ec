"""A run directory's figures and report.md, rebuilt from what it saved (`adaptra-bench report`):
its CSVs and its timelines (harness.saved). Nothing is planned or simulated again."""

from __future__ import annotations

import collections
import functools
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.names import markdown_cell
from harness.paper import PAPER, PAPER_PRESETS, PRESETS_DIR, PaperValue
from harness.plots import plot_iteration_time_vs_delay, plot_slowdown, plot_throughput_over_time
from harness.resolved import Coverage, ResolvedSpec, coverage
from harness.results import fault_free_wall_ms, read_iterations, read_spec_record
from harness.saved import TIMELINES_DIR, read_ring_spans, read_saved_timeline, timeline_name
from pipeline.cost_model import hardware_fields
from pipeline.errors import ConfigError
from pipeline.files import write_atomic
from pipeline.gantt import drawn_end_ms, plot_gantt

if TYPE_CHECKING:
    from harness.spec import ExperimentSpec  # a spec is read, never run: no runner here
    from pipeline.timeline import Timeline

__all__ = [
    "PaperComparison",
    "paper_comparison",
    "paper_experiment",
    "paper_table",
    "prediction_errors",
    "uncompared_slowdowns",
    "write_report",
]

_DELAY_PLOT = "iteration_time_vs_delay.png"
_PLOTS = (_DELAY_PLOT, "slowdown.png", "throughput_over_time.png")
"""the figures other than the Gantt charts a report may draw"""


def _incomplete(spec: ExperimentSpec, run_dir: Path, done: Coverage) -> list[str]:
    """The lines that say a run lacks configurations (interrupted, or still running), and
    how to finish it, with a blank one after; none if it has them all."""
    if done.complete:
        return []
    from harness.spec import resume_advice  # the spec module loads the engines

    unfinished = ", ".join(
        f"`{model} {system} {scenario}" + (f" #{repeat}`" if repeat != "0" else "`")
        for model, system, scenario, repeat in done.missing
    )
    return [
        f"**{done} (incomplete: resume with {resume_advice(spec, run_dir)} to finish).** "
        "The headline, the tables and the figures below cover these only.",
        "",
        f"Unfinished, not in runs.csv (nothing of them is drawn): {unfinished}.",
        "",
    ]


_SELECTION = frozenset({"systems", "link_sets", "delays_ms", "num_repeats"})
"""A spec's keys that pick which of its configurations run, not what one of them gives."""


def paper_experiment(spec: ExperimentSpec) -> tuple[str | None, str | None]:
    """The paper's experiment (harness.paper.PAPER) `spec` runs, if any, and otherwise a note
    where it is named as one: it runs it where it is that experiment's bundled preset
    (PAPER_PRESETS) but for the configurations it picks (fewer systems, link sets, delays,
    repeats, or some of its models: `_SELECTION`). Its name alone is not enough: a spec of
    another model or network named fig16 was compared with the paper's Fig. 16."""
    if spec.name not in PAPER_PRESETS:
        return None, None
    from harness.spec import load_spec, without_folders  # the spec module loads the engines

    file = PAPER_PRESETS[spec.name]
    preset = load_spec(PRESETS_DIR / file)
    ours, theirs = (
        without_folders({**s.to_dict(), "hardware": hardware_fields(s.hardware)})
        for s in (spec, preset)
    )  # a preset's hardware spelled out as a mapping is the preset's
    changed = sorted(
        key
        for key in ours.keys() | theirs.keys()
        if key not in _SELECTION | {"models"} and ours.get(key) != theirs.get(key)
    )
    picked = {  # a selection picks among the preset's: a value of its own is another run
        "models": (spec.models, preset.models),
        "systems": (spec.systems, preset.systems),
    }
    changed[:0] = [name for name, (mine, its) in picked.items() if any(v not in its for v in mine)]
    if not changed and not _scenarios(spec) <= _scenarios(preset):
        changed.append("scenarios")  # its links or delays, as they resolve per model
    if not changed:
        return spec.name, None
    return None, (
        f"Not compared with the paper: this spec is named {spec.name}, as the preset "
        f"`harness/presets/{file}` is, but differs from it in {', '.join(changed)}."
    )


def _scenarios(spec: ExperimentSpec) -> set[tuple[str, str]]:
    """Each model's scenarios as `spec` names them (`first` and `last` resolved), as the
    paper's values are keyed."""
    return {(target.label, s.name) for target in spec.targets() for s in spec.scenarios(target)}


PaperComparison = list[tuple[Mapping[str, Any], PaperValue, float]]
"""(row, the paper's value, ours in the same unit) per configuration (`paper_comparison`)."""


def paper_comparison(experiment: str, runs: Sequence[Mapping[str, Any]]) -> PaperComparison:
    """(row, the paper's value, ours in the same unit) for every configuration the paper
    reports: ours the median over its repeats (the row its first repeat's). A slowdown
    whose fault-free run is not in `runs` is left out (`uncompared_slowdowns`)."""
    reference = PAPER.get(experiment, {})
    base = fault_free_wall_ms(runs)
    repeats: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for row in runs:
        repeats.setdefault((row["model"], row["system"], row["scenario"]), []).append(row)
    out = []
    for key, rows in repeats.items():
        paper = reference.get(key)
        if paper is None:
            continue
        if paper.kind == "seconds":
            values = [float(r["median_wall_ms"]) / 1000.0 for r in rows]
        elif paper.kind == "slowdown":
            if key[:2] not in base:
                continue
            values = [float(r["median_wall_ms"]) / base[key[:2]] for r in rows]
        else:
            values = [float(r["throughput_samples_per_s"]) for r in rows]
        out.append((rows[0], paper, statistics.median(values)))
    return out


def uncompared_slowdowns(experiment: str, runs: Sequence[Mapping[str, Any]]) -> str | None:
    """A line naming the configurations whose paper value is a slowdown but whose fault-free
    run `runs` lacks (a subset of the preset without delay 0), or None."""
    reference, base = PAPER.get(experiment, {}), fault_free_wall_ms(runs)
    missing = sorted(
        {
            f"{r['model']} {r['system']} {r['scenario']}"
            for r in runs
            if (paper := reference.get((r["model"], r["system"], r["scenario"])))
            and paper.kind == "slowdown"
            and (r["model"], r["system"]) not in base
        }
    )
    if not missing:
        return None
    return (
        f"Not compared with the paper: {', '.join(missing)}: the paper's values there are "
        "slowdowns against the fault-free run, which this run did not make (add delay 0)."
    )


def _gantt_charts(
    spec: ExperimentSpec,
    resolved: ResolvedSpec,
    run_dir: Path,
    runs: Sequence[Mapping[str, Any]],
    iterations: Sequence[Mapping[str, Any]],
    left_out: frozenset[tuple[str, ...]] = frozenset(),
) -> tuple[list[tuple[str, str, Callable[[], None]]], list[str]]:
    """One Gantt chart per system, drawn from its saved timeline (harness.saved): the first
    model under its worst static scenario (the highest delay; of those, the one whose
    slowest system's median step was the longest), its last measured iteration, or under a fault
    timeline the iteration its first event starts in (its run after a checkpoint restart, if
    it ran again: then the title says so). The charts share one time axis, each iteration's
    from its start, so a longer iteration draws longer. Only configurations in `runs` are
    drawn. Returns the figures (caption, file name and what draws it: everything is read
    before anything is drawn) and, per system, where its chart came from (or why there is
    none)."""
    model = resolved.first_model
    rows = [r for r in runs if r["model"] == model and str(r["repeat"]) == "0"]
    if not rows:
        return [], []
    slowest_ms: dict[str, float] = {}
    for r in rows:
        slowest_ms[r["scenario"]] = max(
            slowest_ms.get(r["scenario"], 0.0), float(r["median_wall_ms"] or 0.0)
        )
    worst = max(
        rows,
        key=lambda r: (not _traced(r), float(r["delay_ms"] or 0.0), slowest_ms[r["scenario"]]),
    )
    scenario = str(worst["scenario"])
    finished = {r["system"] for r in rows if r["scenario"] == scenario}
    sources = []
    try:
        faults = spec.fault_timeline()
    except ConfigError as err:  # saved by a version that read what this one refuses
        faults = None
        sources.append(
            "- the fault timeline saved in spec.json does not read with this version (each "
            f"chart of its first saved iteration): {err}"
        )
    first_fault = min((e.start_iteration for e in faults.events), default=0) if faults else 0
    comms = {
        (r["system"], str(r["iteration"])): r["comm"]
        for r in iterations
        if r["model"] == model and r["scenario"] == scenario and str(r["repeat"]) == "0"
    }
    charts: list[tuple[str, int, bool, Timeline]] = []
    for system in spec.systems:
        key = (model, system, scenario, "0")
        saved = read_saved_timeline(run_dir, key) if system in finished else None
        where = f"{TIMELINES_DIR}/{timeline_name(key)}"
        if saved is None:
            if key in left_out:  # a cluster job's step without results (harness.collect)
                why = "its cluster job's step has no results (it failed, or did not run)"
            elif key not in resolved.configurations:  # a cluster job's launch skipped it
                why = "not run (the launch skipped it: its run.sbatch says why)"
            elif system not in finished:
                why = "unfinished (not in runs.csv)"
            else:
                why = (
                    f"the run directory has no saved timeline `{where}` (a run of an older "
                    "version, or one that did not finish)"
                )
            sources.append(f"- {system}: no chart, {why}")
            continue
        drawn = sorted(r.iteration for r in saved.timeline.iterations)
        iteration = drawn[-1]
        if _traced(worst):  # the first one with a fault in force, the first event's start
            faulted = [k for k in drawn if k >= first_fault]  # numbered as measured
            iteration = faulted[0] if faulted else drawn[0]
        rerun = iteration in saved.rerun_iterations
        charts.append((system, iteration, rerun, saved.timeline.one_iteration(iteration)))
        sources.append(
            f"- {system}: `{where}`, iteration {iteration}, recorded by the {spec.backend} backend"
            + (
                "; its run after a checkpoint restart (the run before it, which failed or was "
                "lost, is not saved)"
                if rerun
                else ""
            )
        )
    rings = read_ring_spans(run_dir, {(model, c[0], scenario, "0"): c[1] for c in charts})
    of = {system: rings[model, system, scenario, "0"] for system, *_ in charts}
    end_ms = max(
        (drawn_end_ms(timeline, of[system]) for system, *_, timeline in charts), default=1.0
    )
    figures: list[tuple[str, str, Callable[[], None]]] = []
    for system, iteration, rerun, timeline in charts:
        comm = comms.get((system, str(iteration)), "")
        name = f"gantt_{system}.png"
        again = ", run again after a restart" if rerun else ""
        draw = functools.partial(
            plot_gantt,
            timeline,
            run_dir / name,
            title=f"{model}: {system} ({comm}), {scenario}, iteration {iteration}{again}, "
            f"{spec.backend}",
            end_ms=end_ms,
            rings=of[system],
        )
        figures.append((f"Gantt chart, {system}", name, draw))
    return figures, sources


def _remove_stale_charts(run_dir: Path, drawn: set[str]) -> None:
    """A figure of an earlier report (a gantt_*.png or one of the named plots) that this one
    does not draw goes: the report it sits beside would not say what it shows."""
    named = [run_dir / name for name in _PLOTS]
    for stale in [*run_dir.glob("gantt_*.png"), *named]:
        if stale.name not in drawn and (stale.is_file() or stale.is_symlink()):
            stale.unlink(missing_ok=True)


def _key(row: Mapping[str, Any]) -> tuple[str, str, str, str]:
    return (str(row["model"]), str(row["system"]), str(row["scenario"]), str(row["repeat"]))


def _traced(row: Mapping[str, Any]) -> bool:
    return _is_trace(str(row["scenario"]))


def _is_trace(scenario: str) -> bool:
    """Whether a scenario is a fault timeline's (`Scenario.name`)."""
    return scenario.startswith("trace:")


def _headline(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each system's worst slowdown against its fault-free step, and Adaptra's speed-up over
    the best other system in each faulted scenario: by the median step under a static delay,
    by samples/s over a fault timeline (its slow iterations and restarts count there, not in
    a median step); lines with a blank one after, none if there is nothing to compare."""
    lines = []
    baseline = fault_free_wall_ms(runs)
    repeats: dict[tuple[str, str], dict[str, list[float]]] = {}  # by (model, scenario)
    rate_repeats: dict[tuple[str, str], dict[str, list[float]]] = {}
    restart_repeats: dict[tuple[str, str, str], list[tuple[float, float, float, float]]] = {}
    for r in runs:
        if r["scenario"] != "fault-free":
            case = repeats.setdefault((r["model"], r["scenario"]), {})
            case.setdefault(r["system"], []).append(float(r["median_wall_ms"]))
            rates = rate_repeats.setdefault((r["model"], r["scenario"]), {})
            rates.setdefault(r["system"], []).append(float(r["throughput_samples_per_s"]))
            restart_repeats.setdefault((r["model"], r["scenario"], r["system"]), []).append(
                (
                    float(r["throughput_samples_per_s"]),
                    float(r.get("restarts") or 0),
                    float(r.get("lost_iterations") or 0),
                    float(r.get("restart_model_ms") or 0),
                )
            )
    by_case = {  # each system's median step over its repeats
        case: {system: statistics.median(ms) for system, ms in systems.items()}
        for case, systems in repeats.items()
    }
    throughputs = {  # and its median samples/s
        case: {system: statistics.median(x) for system, x in systems.items()}
        for case, systems in rate_repeats.items()
    }
    worst: dict[tuple[str, str], tuple[float, str]] = {}
    for (model, scenario), steps in by_case.items():
        for system, step_ms in steps.items():
            base = baseline.get((model, system))
            if base and step_ms / base > worst.get((model, system), (0.0, ""))[0]:
                worst[model, system] = (step_ms / base, scenario)
    if worst:
        lines.append(
            "Worst slowdown against the same system's fault-free step: "
            + "; ".join(f"{m} {s} {x:.2f}x ({c})" for (m, s), (x, c) in worst.items())
            + "."
        )
    speedups = []
    for (model, scenario), steps in by_case.items():
        if _is_trace(scenario):  # its slow iterations and restarts: by throughput
            per_sample = {s: 1.0 / x for s, x in throughputs[model, scenario].items() if x}
            others = {s: t for s, t in per_sample.items() if not s.startswith("adaptra")}
            ours = per_sample.get("adaptra")
        else:
            others = {s: ms for s, ms in steps.items() if not s.startswith("adaptra")}
            ours = steps.get("adaptra")
        if ours and others:
            best = min(others, key=others.__getitem__)
            measure = ""
            if _is_trace(scenario):
                measure = " (samples/s over the timeline"
                # the median repeat's by samples/s (the slower of the middle two of an even
                # number: a count of its own, not a median of counts); its cost may be most of it
                restarted = sorted(restart_repeats[model, scenario, best], key=lambda x: x[0])
                _, count, lost, cost_ms = restarted[(len(restarted) - 1) // 2]
                if count:
                    measure += (
                        f"; {best} restarted {count:g} time{'s' * (count != 1)}, ran {lost:g} "
                        f"lost iteration{'s' * (lost != 1)} again and lost "
                        f"{_seconds_text(cost_ms / 1000.0)} s more: restart_model_ms"
                    )
                measure += ")"
            speedups.append(f"{model} {scenario} {others[best] / ours:.2f}x over {best}{measure}")
    if speedups:
        lines.append("Adaptra's speed-up over the best baseline: " + "; ".join(speedups) + ".")
    return [*lines, ""] if lines else []


def _seconds_text(seconds: float) -> str:
    """3 significant digits, whole seconds at least, never an exponent's form: 0.0108, 12.3,
    600, 1,200 (two of sim's 10-min restarts read "1.2e+03")."""
    return f"{round(seconds):,}" if seconds >= 100 else f"{seconds:.3g}"


def _rate_text(samples_per_s: float) -> str:
    """Two decimals (26.67), or under 1 sample/s three significant digits: a run whose
    restarts cost most of its time (sim's 10-min timeout) read 0.00, its own and every other
    restarting system's alike."""
    return (
        f"{samples_per_s:.2f}"
        if samples_per_s >= 1 or not samples_per_s
        else f"{samples_per_s:.3g}"
    )


def prediction_errors(compared: PaperComparison) -> list[float]:
    """The relative errors of the predictions among `compared` (a value the cost model is
    fitted on is none)."""
    return [abs(ours - p.value) / p.value for _, p, ours in compared if not p.fitted]


def paper_table(compared: PaperComparison) -> list[str]:
    """`compared` as a Markdown table (header first), each fit target marked (fitted)."""
    return [
        "| model | system | scenario | unit | paper | ours | error |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {r['model']} | {r['system']} | {r['scenario']} | {p.kind} | {p.value:.2f} | "
            f"{ours:.2f} | {100 * (ours - p.value) / p.value:+.1f} %"
            + (" (fitted)" if p.fitted else "")
            + " |"
            for r, p, ours in compared
        ),
    ]


def _error_summary(compared: PaperComparison) -> str:
    """The median and largest relative error of the predictions (a value the cost model is
    fitted on is none: counted apart)."""
    errors = prediction_errors(compared)
    num_fitted = len(compared) - len(errors)
    fitted = (
        f" {num_fitted} value{'s' * (num_fitted != 1)} the cost model is fitted on, marked "
        "(fitted), not counted."
        if num_fitted
        else ""
    )
    if not errors:
        return fitted.strip()
    return (
        f"Median relative error {100 * statistics.median(errors):.1f} % over {len(errors)} "
        f"predicted value{'s' * (len(errors) != 1)} (max {100 * max(errors):.1f} %).{fitted}"
    )


def _warned(warnings: Sequence[str]) -> list[str]:
    """The warnings the run gave before it started (spec.json's), under the headline they
    may qualify (a speed-up of 1.00x where a detector could see nothing); none if none."""
    if not warnings:
        return []
    return ["The run warned:", "", *(f"- {w}" for w in warnings), ""]


def _throughput_caption(runs: Sequence[Mapping[str, Any]]) -> str:
    """The fault timeline's plot draws iterations only: a checkpoint restart (its time is no
    iteration's) is named under it, with the table's samples/s that count it."""
    restarts = [
        f"{r['model']} {r['system']}: {_actions({'restarts': r['restarts']})}"
        + (f" (repeat {r['repeat']})" if str(r["repeat"]) != "0" else "")
        for r in runs
        if _traced(r) and float(r["restarts"] or 0) > 0
    ]
    caption = "throughput over the fault timeline"
    if restarts:
        caption += (
            "; checkpoint restarts, not drawn (their time is in the table's samples/s): "
            + ", ".join(restarts)
        )
    return caption


def _actions(row: Mapping[str, Any], num_rebalanced: int = 0) -> str:
    """What a configuration's run did about its faults (runs.csv's counts, and the
    iterations it ran on a rebalanced split of the global batch, iterations.csv's): "1
    restart, 8 failovers, 2 workers moved, 7 iterations rebalanced", or "none"."""
    counts = (
        (int(float(row.get("restarts") or 0)), "restart", ""),
        (int(float(row.get("failovers") or 0)), "failover", ""),
        (int(float(row.get("moved_workers") or 0)), "worker", " moved"),
        (num_rebalanced, "iteration", " rebalanced"),
    )
    said = [f"{n} {what}{'s' * (n != 1)}{done}" for n, what, done in counts if n]
    return ", ".join(said) or "none"


def _calibration_note(spec: ExperimentSpec) -> str:
    """What a calibrated run's simulator ran with (a report's numbers under a host's costs
    read like the cost-free model's otherwise); empty without a calibration."""
    costs = spec.calibration_costs
    if costs is None:
        return ""
    given = {key: costs.get(key) for key in ("host", "measured_at", "num_stages", "op_ms")}
    parts = [
        f"host `{given['host']}`" if given["host"] else "",
        f"measured {given['measured_at']}" if given["measured_at"] else "",
        f"{given['num_stages']} stages" if given["num_stages"] else "",
        f"{given['op_ms']:g} ms ops" if given["op_ms"] else "",
    ]
    said = ", ".join(part for part in parts if part)
    return " The simulator ran with a host's measured costs (`calibrate`" + (
        f": {said})." if said else ")."
    )


def _collected_note(recorded: dict[str, Any]) -> list[str]:
    """Where spec.json says the runs ran elsewhere (harness.collect), what ran and where from."""
    ran_by, source = recorded.get("ran_by"), recorded.get("collected_from")
    if not isinstance(ran_by, str):
        return []
    return [
        "",
        f"Ran by {ran_by}, collected from `{source}`: each configuration's first plan, fixed "
        "(no fault timeline, no re-planning, no delegates on that path).",
    ]


def write_report(spec: ExperimentSpec, run_dir: Path, runs: list[dict[str, Any]]) -> Coverage:
    """report.md and its figures from `runs` (runs.csv's rows) and the files beside it, what
    spec.json says its spec resolved to; returns how many of its configurations they cover.
    What other files hold of a configuration `runs` lacks (an interrupted run's) is not
    drawn."""
    from harness.spec import resolved_from_record  # the spec module loads the engines

    recorded = read_spec_record(run_dir)
    resolved = resolved_from_record(recorded, run_dir / "spec.json")
    done = coverage(resolved, runs)
    # Everything read (and so checked) before anything is drawn: a refused report leaves
    # the figures of the last one, beside its report.md.
    finished = {_key(r) for r in runs}
    iterations = [r for r in read_iterations(run_dir, runs) if _key(r) in finished]
    rebalanced = collections.Counter(  # an iteration run again after a restart counts once
        key for key, _ in {(_key(r), r["iteration"]) for r in iterations if r.get("microbatches")}
    )
    left_out = frozenset(tuple(key) for key in recorded.get("left_out", []))
    gantt, sources = _gantt_charts(spec, resolved, run_dir, runs, iterations, left_out)
    figures: list[tuple[str, str]] = []
    not_drawn: list[str] = []
    static = [r for r in runs if not _traced(r)]
    if static:
        if plot_iteration_time_vs_delay(static, run_dir / _DELAY_PLOT):
            figures.append(("time per step vs delay", _DELAY_PLOT))
        else:
            delays = sorted({float(r["delay_ms"]) for r in static})
            not_drawn.append(
                "No plot of time per step vs delay: it needs two delays, and every "
                f"configuration without a fault timeline ran at {delays[0]:g} ms."
            )
        if plot_slowdown(static, run_dir / "slowdown.png"):
            figures.append(("slowdown against each system's fault-free step", "slowdown.png"))
    traced = [r for r in iterations if _traced(r)]
    if traced:
        samples = resolved.samples_per_iteration
        plot_throughput_over_time(traced, samples, run_dir / "throughput_over_time.png")
        figures.append((_throughput_caption(runs), "throughput_over_time.png"))
    for caption, name, draw in gantt:
        draw()
        figures.append((caption, name))
    _remove_stale_charts(run_dir, {name for _, name in figures})
    resumed = ", ".join(f"`{r}`" for r in recorded["resumed_git_revisions"])
    lines = [
        f"# {spec.name}",
        "",
        *_incomplete(spec, run_dir, done),
        f"Backend `{spec.backend}`, {spec.num_iterations} measured iterations per configuration "
        f"after {spec.num_warmup_iterations} warm-up; seed {spec.seed}; git revision "
        f"`{recorded.get('git_revision', 'unknown')}`"
        + (f" (resumed at {resumed})" if resumed else "")
        + "."
        + _calibration_note(spec),
        *_collected_note(recorded),
        "",
        *_headline(runs),
        *_warned(recorded["warnings"]),
    ]
    repeated = spec.num_repeats > 1  # a row per repeat, told apart by their number
    columns = ["model", "system", "comm", "controller", "scenario", *(["repeat"] * repeated)]
    lines += [
        "| "
        + " | ".join(columns)
        + " | median step (ms) | median iteration (ms) | samples/s | bubble ratio | actions |",
        "|---" * (len(columns) + 5) + "|",
    ]
    lines += [
        "| "
        + " | ".join(markdown_cell(r[c]) for c in columns)
        + f" | {float(r['median_wall_ms']):.1f} | {float(r['median_iteration_ms']):.1f} | "
        f"{_rate_text(float(r['throughput_samples_per_s']))} | {float(r['bubble_ratio']):.3f} | "
        f"{_actions(r, rebalanced[_key(r)])} |"
        for r in runs
    ]
    lines += [
        "",
        "A step is the pipeline iteration plus the DP all-reduce and the optimizer; the "
        "iteration is the pipeline alone (its start to its last op's end); their medians are "
        "over every one run, one lost to a restart as often as it ran. samples/s: the "
        "measured iterations' samples (each once) over the time of every step run, lost ones "
        "run again after a restart included, plus the modelled restart cost. Bubble ratio: "
        "1 - (time the stages spent in ops) / (stages x iteration time), replica 0's, the "
        "mean over the measured iterations. Actions: the checkpoint restarts, the delegates' "
        "moves to another NIC (failovers), the workers rank swaps moved and the iterations "
        "run on a rebalanced split of the global batch over the DP replicas, over the "
        "configuration's iterations.",
    ]
    experiment, not_compared = paper_experiment(spec)
    compared = [] if experiment is None else paper_comparison(experiment, runs)
    if experiment is not None:
        not_compared = uncompared_slowdowns(experiment, runs)
    if not_compared is not None:
        lines += ["", not_compared]
    if compared:
        lines += ["", "## Against the paper", "", _error_summary(compared), ""]
        lines += paper_table(compared)
    if sources:
        lines += ["", "## Gantt charts", "", "Drawn from the timelines the run saved:", ""]
        lines += sources
    lines.append("")
    lines += [f"{note}\n" for note in not_drawn]
    # Each caption under its figure too: a Markdown viewer shows no alt text.
    lines += [f"![{caption}]({name})\n\n*{caption}*\n" for caption, name in figures]
    write_atomic(run_dir / "report.md", "\n".join(lines))
    return done
