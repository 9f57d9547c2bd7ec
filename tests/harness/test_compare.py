import csv
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.cli import main
from harness.compare import KEY, METRICS, compare_runs
from harness.experiment import run_experiment
from harness.results import RESULTS_SCHEMA_VERSION, run_dir_held
from harness.spec import ExperimentSpec, load_spec
from pipeline.host_costs import HostCosts
from pipeline.profile import Profile

BASELINE = Path(__file__).parents[2] / "benchmarks" / "reference" / "default_runs.csv"


def _compare(base: Path, new: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", "compare", str(base), str(new), *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _write(path: Path, rows: list[dict[str, str]]) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def _rows() -> list[dict[str, str]]:
    with BASELINE.open() as handle:
        return list(csv.DictReader(handle))


def test_unchanged_passes(tmp_path: Path) -> None:
    out = _compare(BASELINE, _write(tmp_path / "same.csv", _rows()))
    assert out.returncode == 0, out.stderr
    assert "no regression: 144 metrics within 0 %" in out.stdout


def test_a_ten_percent_worsening_fails_with_a_table(tmp_path: Path) -> None:
    rows = _rows()
    slow = next(r for r in rows if r["system"] == "adaptra" and r["scenario"] == "0-1@40ms")
    slow["median_iteration_ms"] = str(float(slow["median_iteration_ms"]) * 1.10)
    new = _write(tmp_path / "worse.csv", rows)
    out = _compare(BASELINE, new, "--tolerance", "5")
    assert out.returncode == 1
    worse = [line for line in out.stdout.splitlines() if line.endswith("WORSE")]
    assert len(worse) == 1 and "adaptra 0-1@40ms" in worse[0] and "+10.00%" in worse[0]
    assert "1 of 144 metrics got worse than their tolerance (5 %" in out.stderr
    assert _compare(BASELINE, new, "--tolerance", "15").returncode == 0


def test_a_better_metric_fails_both_ways_only(tmp_path: Path) -> None:
    """A deterministic run's gate (.ci/run) must see its numbers move either way: at 0 % a
    one-sided gate passed 1F1B and ZB twice as fast under a delay (their delay lost)."""
    rows = _rows()
    fast = next(r for r in rows if r["system"] == "1f1b" and r["scenario"] == "0-1@40ms")
    fast["median_iteration_ms"] = str(float(fast["median_iteration_ms"]) / 2)
    new = _write(tmp_path / "better.csv", rows)
    one_way = _compare(BASELINE, new)
    assert (one_way.returncode, one_way.stdout.splitlines()[-1]) == (
        0,  # (it said "within 0 %" right under the row flagged BETTER by 50 %)
        "no regression: none of 144 metrics worse than 0 % (1 better by more: flagged BETTER "
        "above)",
    )
    out = _compare(BASELINE, new, "--both-ways")
    assert out.returncode == 1
    flagged = [line for line in out.stdout.splitlines() if line.endswith(("WORSE", "BETTER"))]
    assert len(flagged) == 1 and "1f1b 0-1@40ms" in flagged[0]
    assert flagged[0].split()[-5:] == ["median_iteration_ms", "990", "495", "-50.00%", "BETTER"]
    assert out.stderr == (
        "error: 1 of 144 metrics got better than their tolerance, which --both-ways fails too "
        "(0 % unless given per metric; flagged BETTER above)\n"
    )
    assert _compare(BASELINE, new, "--both-ways", "--tolerance", "50").returncode == 0
    same = _compare(BASELINE, _write(tmp_path / "same.csv", _rows()), "--both-ways")
    assert (same.returncode, same.stdout.splitlines()[-1]) == (
        0,
        "no regression: 144 metrics within 0 % either way",
    )


_CI_RUN = Path(__file__).parents[2] / ".ci" / "run"
_CI_STUB = """#!/bin/sh
# `run` writes the rows the test gives as the gate run's; `compare` is the real one.
if [ "$1" = run ]; then mkdir -p "$3/gate" && exec cp "$GATE_ROWS" "$3/gate/runs.csv"; fi
exec "$GATE_PYTHON" -m harness "$@"
"""


def _ci_gate(folder: Path, rows: list[dict[str, str]]) -> subprocess.CompletedProcess[str]:
    """.ci/run's regression gate (its lines from `gate_dir=` to the emulated runtime's gate)
    in `folder` (new) as its repository, whose `adaptra-bench run` writes `rows`."""
    lines = _CI_RUN.read_text().splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith("gate_dir="))
    end = next(k for k, line in enumerate(lines) if "gate_emulated.py" in line)
    root = folder / "repo"
    (root / "benchmarks" / "reference").mkdir(parents=True)
    shutil.copy(BASELINE, root / "benchmarks" / "reference" / BASELINE.name)
    (root / ".venv" / "bin").mkdir(parents=True)
    stub = root / ".venv" / "bin" / "adaptra-bench"
    stub.write_text(_CI_STUB)
    stub.chmod(0o755)
    source = str(Path(__file__).parents[2])
    env = {
        **os.environ,
        "GATE_ROWS": str(_write(folder / "gate.csv", rows)),
        "GATE_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")])),
    }
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", "\n".join(lines[start:end])],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_ci_gate_shows_what_failed_it(tmp_path: Path) -> None:
    """.ci/run's gate prints its summary line where it passes, and where it fails the rows
    that failed it, which its error line points to: it printed the table's last row only
    (`| tail -1`), another configuration's unchanged moved_workers, under "1 of 144 metrics
    got worse than their tolerance (...; see the table above)"."""
    passed = _ci_gate(tmp_path / "passed", _rows())
    assert (passed.returncode, passed.stdout, passed.stderr) == (
        0,
        "no regression: 144 metrics within 0 % either way\n",
        "",
    )
    rows = _rows()
    slow = next(r for r in rows if r["system"] == "zb" and r["scenario"] == "0-1@10ms")
    slow["median_wall_ms"] = str(float(slow["median_wall_ms"]) + 1)
    failed = _ci_gate(tmp_path / "failed", rows)
    assert failed.returncode == 1
    lines = failed.stdout.splitlines()
    worse = [line for line in lines if line.endswith("WORSE")]
    assert len(worse) == 1 and "zb 0-1@10ms" in worse[0] and "median_wall_ms" in worse[0]
    assert lines[-1].startswith("error: 1 of 144 metrics got worse than their tolerance (0 %")


def test_a_missing_configuration_is_a_regression_named_apart_from_the_metrics(
    tmp_path: Path,
) -> None:
    """Its metrics have nothing to be compared with: they are not rows of the table, nor
    counted as metrics got worse; the configuration is named as missing."""
    out = _compare(BASELINE, _write(tmp_path / "short.csv", _rows()[1:]), "--tolerance", "5")
    assert out.returncode == 1
    lines = out.stdout.splitlines()
    assert len([line for line in lines if line.startswith("fig4-uniform-10ms ")]) == 135  # 15 x 9
    assert "WORSE" not in out.stdout
    assert lines[-2:] == ["", "missing from NEW (a regression): fig4-uniform-10ms 1f1b fault-free"]
    assert (
        out.stderr == "error: regression: 1 configuration of BASE missing from NEW (listed above)\n"
    )


def test_missing_configurations_and_worse_metrics_are_counted_apart(tmp_path: Path) -> None:
    rows = _rows()
    rows[5]["median_wall_ms"] = str(float(rows[5]["median_wall_ms"]) * 2)
    out = _compare(BASELINE, _write(tmp_path / "short.csv", rows[2:]), "--tolerance", "5")
    assert out.returncode == 1
    assert out.stderr == (
        "error: 1 of 126 metrics got worse than their tolerance (5 % unless given per metric; "
        "see the table above); regression: 2 configurations of BASE missing from NEW (listed "
        "above)\n"
    )


def _garbage(tmp_path: Path, name: str) -> Path:
    """One unusable results file of each kind."""
    rows = _rows()
    path = tmp_path / f"{name}.csv"
    if name == "empty":
        path.write_text("")
    elif name == "header-only":
        path.write_text(",".join(rows[0]) + "\n")
    elif name == "binary":
        path.write_bytes(b"\xff\xfe\x00garbage\x00")
    elif name == "no-key-columns":
        _write(path, [{k: v for k, v in r.items() if k != "system"} for r in rows])
    elif name == "no-metrics":
        _write(path, [{k: v for k, v in r.items() if k not in METRICS} for r in rows])
    elif name in ("nan", "text", "inf", "negative"):
        rows[3]["median_iteration_ms"] = {"nan": "nan", "text": "fast", "inf": "inf"}.get(
            name, "-1"
        )
        _write(path, rows)
    elif name == "negative-throughput":  # it passed as a gain: -26.7 samples/s is "higher"
        rows[3]["throughput_samples_per_s"] = str(-float(rows[3]["throughput_samples_per_s"]))
        _write(path, rows)
    elif name == "duplicate":
        _write(path, [*rows, rows[0]])
    elif name == "old-schema":
        _write(path, [{**r, "schema_version": "1"} for r in rows])
    elif name == "schema-7":  # as version 7 wrote it: no moved_workers (8's), num_delegates (9's)
        later = {"moved_workers", "num_delegates"}
        old = [{k: v for k, v in r.items() if k not in later} for r in rows]
        _write(path, [{**r, "schema_version": "7"} for r in old])
    elif name == "profile-json":  # a profile given where a run directory belongs
        path.write_text('{"stages": 4, "microbatches": 12, "t_f": 10, "t_b": 10, "t_w": 10}\n')
    elif name == "no-runs-csv":
        path = tmp_path / "not-a-run"
        path.mkdir()
        (path / "runs.txt").write_text("")
    elif name == "cut-short":
        text = _write(path, rows).read_text()
        path.write_text(text[: text.rindex(",", 0, len(text) // 2)])  # mid-row, mid-file
    return path


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("empty", "holds no results"),
        ("header-only", "holds no results"),
        ("binary", "not a runs.csv|not a readable CSV"),
        ("no-key-columns", "it lacks system"),
        ("no-metrics", "it lacks every metric"),
        ("nan", "median_iteration_ms is 'nan', not a valid value \\(a finite number >= 0\\)"),
        ("negative", "median_iteration_ms is '-1', not a valid value \\(a finite number >= 0\\)"),
        ("negative-throughput", "line 5: throughput_samples_per_s is '-[0-9.]+', not a valid"),
        ("text", "median_iteration_ms is 'fast'"),
        ("inf", "median_iteration_ms is 'inf'"),
        ("duplicate", "repeats a configuration"),
        ("old-schema", "schema version 1"),
        (
            "schema-7",
            f"has results schema version 7; this version reads {RESULTS_SCHEMA_VERSION} only "
            "\\(run it again\\)",
        ),
        ("cut-short", "has fewer fields than columns: damaged or cut short"),
        ("profile-json", "profile-json.csv is not a runs.csv \\(nor a run directory\\): it lacks "),
        ("no-runs-csv", "not-a-run is not a run directory: it has no runs.csv"),
    ],
)
@pytest.mark.parametrize("side", ["base", "new"])
def test_unusable_results_on_either_side_exit_2_with_one_line(
    tmp_path: Path, name: str, message: str, side: str
) -> None:
    bad = _garbage(tmp_path, name)
    base, new = (bad, BASELINE) if side == "base" else (BASELINE, bad)
    out = _compare(base, new)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert re.search(message, out.stderr) and len(out.stderr.strip().splitlines()) == 1
    assert "Traceback" not in out.stderr and "no regression" not in out.stdout


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--tolerance", "nan"], "finite and >= 0 %, not nan"),
        (["--tolerance", "inf"], "finite and >= 0 %, not inf"),
        (["--tolerance", "-1"], "finite and >= 0 %"),
        (["--metric-tolerance", "median_wall_ms=nan"], "median_wall_ms must be finite"),
        (["--metric-tolerance", "speed=5"], "no metric speed"),
    ],
)
def test_bad_tolerances_exit_2(extra: list[str], message: str) -> None:
    out = _compare(BASELINE, BASELINE, *extra)
    assert out.returncode == 2 and message in out.stderr, out.stderr


def test_a_malformed_metric_tolerance_is_a_usage_error() -> None:
    out = _compare(BASELINE, BASELINE, "--metric-tolerance", "median_wall_ms")
    assert out.returncode == 2 and "is not METRIC=PERCENT" in out.stderr


def test_a_metric_tolerance_given_twice_is_a_usage_error() -> None:
    """The last of two --metric-tolerance for one metric held: `median_wall_ms=1` then `=2`
    passed a 1.5 % worsening, the other order failed it."""
    twice = ["--metric-tolerance", "median_wall_ms=1", "--metric-tolerance", "median_wall_ms=2"]
    out = _compare(BASELINE, BASELINE, *twice)
    assert out.returncode == 2, out.stderr
    assert "median_wall_ms is given more than once" in out.stderr


def test_a_configuration_only_in_the_new_results_fails_unless_allowed(tmp_path: Path) -> None:
    rows = _rows()
    extra = {**rows[0], "scenario": "0-1@80ms"}
    new = _write(tmp_path / "more.csv", [*rows, extra])
    out = _compare(BASELINE, new)
    assert out.returncode == 1
    only_new = [line for line in out.stdout.splitlines() if "0-1@80ms" in line]
    assert only_new == ["only in NEW, not compared: fig4-uniform-10ms 1f1b 0-1@80ms"]
    assert out.stderr == (
        "error: 1 configuration only in NEW, not compared (listed above; --allow-new lets "
        "them pass)\n"
    )
    allowed = _compare(BASELINE, new, "--allow-new")
    assert allowed.returncode == 0
    assert allowed.stdout.splitlines()[-2:] == [
        "only in NEW, not compared (allowed by --allow-new): fig4-uniform-10ms 1f1b 0-1@80ms",
        "no regression: 144 metrics within 0 %; 1 configuration only in NEW, not compared "
        "(--allow-new)",
    ]


def test_allowed_new_configurations_do_not_pass_a_worse_metric(tmp_path: Path) -> None:
    rows = _rows()
    rows[3]["bubble_ratio"] = str(float(rows[3]["bubble_ratio"]) + 0.5)
    new = _write(tmp_path / "more.csv", [*rows, {**rows[0], "scenario": "0-1@80ms"}])
    out = _compare(BASELINE, new, "--allow-new")
    assert out.returncode == 1
    assert out.stderr.startswith("error: 1 of 144 metrics got worse than their tolerance (0 %")


def test_a_comparison_names_the_configurations_on_one_side_only() -> None:
    rows = [{k: r[k] for k in (*KEY, *METRICS)} for r in _rows()]
    result = compare_runs(rows[:3], [rows[1], rows[2], rows[3]], 0.0)
    assert [(c.configuration, c.metric) for c in result.changes] == [
        (f"fig4-uniform-10ms 1f1b {scenario}", metric)
        for scenario in ("0-1@10ms", "0-1@20ms")
        for metric in METRICS
    ]
    assert result.missing == ["fig4-uniform-10ms 1f1b fault-free"]
    assert result.added == ["fig4-uniform-10ms 1f1b 0-1@40ms"]
    assert result.worse == [] and result.failed


def test_each_metric_has_its_direction_and_may_have_its_own_tolerance(tmp_path: Path) -> None:
    """Throughput up and time down are improvements; a 10 % slower wall time passes only
    with its own 15 % tolerance, and the other metrics keep the global 0 %."""
    rows = _rows()
    row = rows[5]
    row["throughput_samples_per_s"] = str(float(row["throughput_samples_per_s"]) * 1.5)
    row["median_iteration_ms"] = str(float(row["median_iteration_ms"]) * 0.5)
    assert _compare(BASELINE, _write(tmp_path / "better.csv", rows)).returncode == 0
    row["median_wall_ms"] = str(float(row["median_wall_ms"]) * 1.10)
    slower = _write(tmp_path / "slower.csv", rows)
    assert _compare(BASELINE, slower).returncode == 1
    allowed = _compare(BASELINE, slower, "--metric-tolerance", "median_wall_ms=15")
    assert allowed.returncode == 0
    assert allowed.stdout.splitlines()[-1] == (
        "no regression: none of 144 metrics worse than 0 % (median_wall_ms 15 %) (2 better by "
        "more: flagged BETTER above)"
    )
    row["throughput_samples_per_s"] = str(float(row["throughput_samples_per_s"]) * 0.5)
    worse = _write(tmp_path / "worse.csv", rows)
    assert _compare(BASELINE, worse, "--metric-tolerance", "median_wall_ms=15").returncode == 1


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("comm", "delegated"),
        ("policy", "zb"),
        ("controller", "oracle"),
        ("links", "1-2"),
        ("delay_ms", "20.0"),
        ("seed", "7"),
        ("iterations", "1"),
    ],
)
def test_a_configuration_run_another_way_fails_with_equal_metrics(
    tmp_path: Path, column: str, value: str
) -> None:
    """Its metrics measured something else: the gate names the column and fails (exit 1),
    whatever the tolerance."""
    rows = _rows()
    fault_free = next(r for r in rows if r["system"] == "1f1b" and r["scenario"] == "fault-free")
    old = fault_free[column]
    assert old != value
    fault_free[column] = value
    out = _compare(BASELINE, _write(tmp_path / "other.csv", rows), "--tolerance", "100")
    assert out.returncode == 1
    assert out.stdout.splitlines()[-1] == (
        f"run another way in NEW: fig4-uniform-10ms 1f1b fault-free: {column} {old!r} -> {value!r}"
    )
    assert "1 configuration run another way in NEW" in out.stderr


def test_the_comm_adaptras_detector_chose_is_an_outcome_not_another_way(tmp_path: Path) -> None:
    """The detector delegates where it measures a slow link: a noisy run that delegated
    where the base did not was "run another way" at any tolerance. Its comm is shown and its
    metrics gate it; a fixed plan's comm stays how it was run."""
    rows = _rows()
    adaptra = next(r for r in rows if r["controller"] == "detector" and r["comm"] == "direct")
    adaptra["comm"] = "direct+delegated"
    out = _compare(BASELINE, _write(tmp_path / "delegated.csv", rows), "--tolerance", "0")
    assert out.returncode == 0, (out.stdout, out.stderr)
    name = f"{adaptra['model']} adaptra {adaptra['scenario']}"
    assert out.stdout.splitlines()[-2:] == [
        "ran over another comm, as its controller chose (an outcome, not a failure): "
        f"{name}: 'direct' -> 'direct+delegated'",
        "no regression: 144 metrics within 0 %",
    ]
    fixed = next(r for r in rows if r["controller"] == "delegation")
    fixed["comm"] = "direct"
    out = _compare(BASELINE, _write(tmp_path / "fixed.csv", rows), "--tolerance", "100")
    assert out.returncode == 1
    assert f"adaptra-cpu {fixed['scenario']}: comm 'delegated' -> 'direct'" in out.stdout


@pytest.mark.parametrize("column", ["bubble_ratio", "median_iteration_ms", "iterations", "comm"])
@pytest.mark.parametrize("side", ["base", "new"])
def test_a_runs_csv_without_a_metric_or_identity_column_is_unusable(
    tmp_path: Path, column: str, side: str
) -> None:
    """Every runs.csv of this schema version has each of them: a baseline with one left out
    (renamed, dropped by an edit) passed the gate with that column not compared, 16 of 144
    metrics fewer, whatever NEW held there."""
    rows = _rows()
    for row in rows:  # NEW worse (or run another way) in the column
        row[column] = str(float(row[column]) * 2 + 1) if column != "comm" else "delegated"
    worse = _write(tmp_path / "worse.csv", rows)
    lacking = _write(
        tmp_path / "lacking.csv", [{k: v for k, v in r.items() if k != column} for r in _rows()]
    )
    base, new = (lacking, worse) if side == "base" else (BASELINE, lacking)
    out = _compare(base, new)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stderr == (
        f"error: {lacking} is not a runs.csv (nor a run directory): it lacks {column}\n"
    )


def test_a_configuration_on_another_backend_is_run_another_way(tmp_path: Path) -> None:
    """The backend is in a configuration's key but not its name: a configuration run on
    another backend was listed both as missing from NEW and as only in NEW, under one name
    (a user review)."""
    rows = _rows()
    fault_free = next(r for r in rows if r["system"] == "1f1b" and r["scenario"] == "fault-free")
    fault_free["backend"] = "emulated"
    out = _compare(BASELINE, _write(tmp_path / "other.csv", rows), "--tolerance", "100")
    assert out.returncode == 1
    assert out.stdout.splitlines()[-1] == (
        "run another way in NEW: fig4-uniform-10ms 1f1b fault-free: backend 'sim' -> 'emulated'"
    )
    assert out.stderr.strip() == (
        "error: 1 configuration run another way in NEW (backend, policy, comm, controller, "
        "links, delay, fault timeline, seed, iterations, what ran it or its spec's other "
        "inputs; listed above): not the same measurement"
    )
    # On two other backends in NEW: paired with the first by name, whatever the hash seed
    # (the pairing followed a set's order); the other is only in NEW.
    rows.append({**fault_free, "backend": "megatron"})
    out = _compare(BASELINE, _write(tmp_path / "two.csv", rows), "--tolerance", "100")
    assert "fault-free: backend 'sim' -> 'emulated'" in out.stdout
    assert "only in NEW, not compared: megatron fig4-uniform-10ms 1f1b fault-free" in out.stdout


def test_more_restarts_or_lost_iterations_are_worse(tmp_path: Path) -> None:
    rows = _rows()
    rows[3]["restarts"], rows[3]["lost_iterations"] = "1", "4"
    out = _compare(BASELINE, _write(tmp_path / "restarted.csv", rows), "--tolerance", "50")
    assert out.returncode == 1
    worse = [line.split()[-5] for line in out.stdout.splitlines() if line.endswith("WORSE")]
    assert worse == ["restarts", "lost_iterations"]
    assert _compare(_write(tmp_path / "base.csv", rows), BASELINE).returncode == 0  # fewer


def test_markdown_is_a_table_for_a_job_summary(tmp_path: Path) -> None:
    out = _compare(BASELINE, BASELINE, "--format", "markdown")
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    assert lines[0] == "| configuration | metric | base | new | change | |"
    assert lines[1] == "|---|---|---|---|---|---|"
    assert len([line for line in lines if line.startswith("| ")]) == 145  # header + 144 metrics
    assert lines[-1] == "no regression: 144 metrics within 0 %"


def _one(metric: str, value: float) -> dict[str, Any]:
    row = {k: v for k, v in _rows()[0].items() if k in KEY}
    return {**row, metric: str(value)}


@pytest.mark.parametrize(
    ("metric", "base", "new", "tolerance_pct", "worse"),
    [
        ("median_wall_ms", 104.0, 109.2, 5.0, False),  # +5.000000000000002 % in floats
        ("median_wall_ms", 0.3, 0.315, 5.0, False),  # +5.000000000000004 %
        ("median_wall_ms", 7.0, 7.7, 10.0, False),
        ("median_wall_ms", 104.0, 109.2001, 5.0, True),
        ("median_wall_ms", 104.0, 104.0, 0.0, False),
        ("median_wall_ms", 104.0, 104.00000001, 0.0, True),  # 0 % is exact: no slack
        ("throughput_samples_per_s", 0.7, 0.693, 1.0, False),  # -1.0000000000000009 %
        ("throughput_samples_per_s", 0.7, 0.6929, 1.0, True),
    ],
)
def test_a_change_of_exactly_the_tolerance_is_within_it(
    metric: str, base: float, new: float, tolerance_pct: float, worse: bool
) -> None:
    (change,) = [
        c
        for c in compare_runs([_one(metric, base)], [_one(metric, new)], tolerance_pct).changes
        if c.metric == metric
    ]
    assert change.worse is worse


def test_the_same_number_written_two_ways_is_the_same_run(tmp_path: Path) -> None:
    """A delay of 10 and of 10.0 (an older YAML spec's runs.csv) is one measurement."""
    rows = _rows()
    for row in rows:
        row["delay_ms"] = f"{float(row['delay_ms']):g}"
    assert any(row["delay_ms"] == "10" for row in rows)
    assert _compare(BASELINE, _write(tmp_path / "ints.csv", rows)).returncode == 0


def test_a_worse_metric_prints_the_digits_that_tell_it_apart(tmp_path: Path) -> None:
    """450 -> 450.0001 ms is worse at 0 %: it printed as 450, 450 and +0.00 %, flagged."""
    rows = _rows()
    assert float(rows[0]["median_wall_ms"]) == 450.0
    rows[0]["median_wall_ms"] = "450.0001"
    out = _compare(BASELINE, _write(tmp_path / "tiny.csv", rows))
    assert out.returncode == 1
    (worse,) = [line for line in out.stdout.splitlines() if line.endswith("WORSE")]
    assert worse.split()[-5:] == ["median_wall_ms", "450", "450.0001", "+2.2e-05%", "WORSE"]
    markdown = _compare(BASELINE, tmp_path / "tiny.csv", "--format", "markdown").stdout
    assert "| median_wall_ms | 450 | 450.0001 | +2.2e-05% | WORSE |" in markdown
    # equal numbers keep 4 digits; a change of 0.005 % or more keeps 2 decimals
    assert "| mean_iteration_ms | 450 | 450 | +0.00% |  |" in markdown


def test_a_configuration_with_a_pipe_stays_in_its_markdown_cell(tmp_path: Path) -> None:
    """A model "a|b" ended the configuration's cell: its rows' WORSE flags sat under no
    header in a CI job summary."""
    rows = [{**r, "model": "a|b"} for r in _rows()]
    out = _compare(
        _write(tmp_path / "pipe.csv", rows), tmp_path / "pipe.csv", "--format", "markdown"
    )
    assert out.returncode == 0, out.stderr
    assert "| a\\|b 1f1b fault-free | median_wall_ms | 450 | 450 | +0.00% |  |" in out.stdout


def test_a_change_just_past_the_tolerance_prints_past_it(tmp_path: Path) -> None:
    """+5.004 % at --tolerance 5 printed as "+5.00%  WORSE", where a change of exactly 5 %
    passes: flagged, it keeps the decimals that put it past the tolerance."""
    rows = _rows()
    rows[0]["median_wall_ms"] = repr(450.0 * 1.05004)
    out = _compare(BASELINE, _write(tmp_path / "past.csv", rows), "--tolerance", "5")
    assert out.returncode == 1
    (worse,) = [line for line in out.stdout.splitlines() if line.endswith("WORSE")]
    assert worse.split()[-3:] == ["472.5", "+5.004%", "WORSE"]
    rows[0]["median_wall_ms"] = repr(450.0 * 1.04996)  # not flagged: 2 decimals
    out = _compare(BASELINE, _write(tmp_path / "within.csv", rows), "--tolerance", "5")
    assert out.returncode == 0 and "472.5    +5.00%\n" in out.stdout


def test_a_metric_of_0_that_moves_by_a_rounding_has_not_changed() -> None:
    """A bubble ratio of 0 (a 1-stage pipeline) that came out 2.2e-16 failed as "+inf%" at
    any tolerance; a count of 0 that becomes 1 still fails at any tolerance."""
    (noise,) = [
        c
        for c in compare_runs(
            [_one("bubble_ratio", 0.0)], [_one("bubble_ratio", 2.220446049250313e-16)], 50.0
        ).changes
        if c.metric == "bubble_ratio"
    ]
    assert (noise.change_pct, noise.worse) == (0.0, False)
    for base, new in ((2.220446049250313e-16, 4.440892098500626e-16), (2.2e-16, 0.0)):
        (both,) = [  # noise on both sides: was +100 % WORSE, or -100 % BETTER
            c
            for c in compare_runs(
                [_one("bubble_ratio", base)], [_one("bubble_ratio", new)], 0.0, both_ways=True
            ).changes
            if c.metric == "bubble_ratio"
        ]
        assert (both.change_pct, both.worse, both.better) == (0.0, False, False)
    (exact,) = [  # any other metric as written: 0 % passes only equal values
        c
        for c in compare_runs(
            [_one("median_wall_ms", 0.0)], [_one("median_wall_ms", 1e-13)], 0.0
        ).changes
        if c.metric == "median_wall_ms"
    ]
    assert exact.worse and exact.change_pct == math.inf
    (restart,) = [
        c
        for c in compare_runs([_one("restarts", 0)], [_one("restarts", 1)], 1000.0).changes
        if c.metric == "restarts"
    ]
    assert (restart.change_pct, restart.worse) == (math.inf, True)


def _small_run(
    out: Path,
    systems: tuple[str, ...] = ("1f1b",),
    faults: Path | None = None,
    calibration: Path | None = None,
    **fields: Any,
) -> Path:
    """A run directory in `out` of a small profile (2 stages, 2 iterations) under `systems`,
    the spec's other `fields` as given."""
    spec = ExperimentSpec(
        name="t",
        models=("m",),
        profile=fields.pop("profile", Profile.uniform(2, 4, 1, 1, 1)),
        systems=systems,
        num_iterations=2,
        faults=None if faults is None else str(faults),
        calibration=None if calibration is None else str(calibration),
        **fields,
    )
    return run_experiment(spec, out)


def test_an_unfinished_run_directory_cannot_be_compared(tmp_path: Path) -> None:
    """Its spec.json lists configurations its runs.csv lacks (an interrupted run): exit 2
    with how to finish it, on either side, not "configurations missing" (a regression)."""
    full = _small_run(tmp_path / "out" / "full", ("1f1b", "zb-h1"))
    cut = tmp_path / "out" / "cut"
    shutil.copytree(full, cut)
    runs = cut / "runs.csv"
    runs.write_text("".join(runs.read_text().splitlines(keepends=True)[:2]))  # header + 1
    for base, new in ((full, cut), (cut, full)):
        out = _compare(base, new)
        assert (out.returncode, out.stdout) == (2, "")
        assert out.stderr == (
            f"error: {cut} is an unfinished run (1 of 2 configurations): resume it with "
            f"`adaptra-bench run --spec SPEC --out {cut.parent} --run-id cut` (SPEC: the spec "
            "file it was started with) and compare it once finished\n"
        )
    assert _compare(full, cut / "runs.csv").returncode == 1  # a file alone: missing rows
    # Stopped before its first configuration ended: spec.json, no runs.csv ("not a run
    # directory: it has no runs.csv").
    unstarted = tmp_path / "out" / "unstarted"
    unstarted.mkdir()
    shutil.copy(cut / "spec.json", unstarted)
    out = _compare(full, unstarted)
    assert (out.returncode, out.stderr) == (
        2,
        f"error: {unstarted} is an unfinished run (0 of 2 configurations): resume it with "
        f"`adaptra-bench run --spec SPEC --out {cut.parent} --run-id unstarted` (SPEC: the "
        "spec file it was started with) and compare it once finished\n",
    )
    (unstarted / "spec.json").write_text("{}")  # damaged: no runs.csv to compare alone either
    out = _compare(full, unstarted)
    assert out.returncode == 2 and "given alone" not in out.stderr, out.stderr
    assert _compare(full, full).returncode == 0
    # A spec field of the wrong type named no file ("error: num_iterations must be ...").
    record = json.loads((cut / "spec.json").read_text())
    record["spec"]["num_iterations"] = "2"
    (cut / "spec.json").write_text(json.dumps(record))
    out = _compare(full, cut)
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == (
        f"error: {cut / 'spec.json'}: num_iterations must be an integer, got '2' (its "
        "runs.csv, given alone, is compared without this check)\n"
    )


def test_a_run_directory_a_run_still_writes_cannot_be_compared(tmp_path: Path) -> None:
    full = _small_run(tmp_path / "out" / "full", ("1f1b", "zb-h1"))
    with run_dir_held(full):
        out = _compare(full, full)  # which, as it stands, would pass
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == (
        f"error: {full} is still being written by a run (pid {os.getpid()}): compare it once "
        "that run has ended\n"
    )
    assert _compare(full, full).returncode == 0  # once it has ended


def test_a_configuration_under_other_host_costs_fails(tmp_path: Path) -> None:
    """A run calibrated on one host's costs and one on another's (or none) measured other
    things under the same names: passed as one measurement (exit 0 at 100 %). Run
    directories' spec.json say which costs; a runs.csv alone does not."""
    costs = {"none": None, "slow": HostCosts(op_overhead_ms=0.5), "fast": HostCosts()}
    runs = {}
    for side, host in costs.items():
        calibration = None
        if host is not None:
            calibration = tmp_path / f"{side}.json"
            calibration.write_text(json.dumps(host.to_dict()))
        runs[side] = _small_run(tmp_path / "out" / side, calibration=calibration)
    digest = {
        side: hashlib.sha256(json.dumps(host.to_dict(), sort_keys=True).encode()).hexdigest()[:12]
        for side, host in costs.items()
        if host is not None
    }
    out = _compare(runs["none"], runs["slow"], "--tolerance", "100")
    assert out.returncode == 1
    assert out.stdout.splitlines()[-1] == (
        "run another way in NEW: m 1f1b fault-free: calibration sha256 'none' -> "
        f"{digest['slow']!r}"
    )
    assert _compare(runs["slow"], runs["fast"], "--tolerance", "100").returncode == 1
    assert _compare(runs["slow"], runs["slow"]).returncode == 0
    alone = _compare(runs["none"] / "runs.csv", runs["slow"], "--tolerance", "100")
    assert alone.returncode == 0


def test_a_configuration_under_another_fault_timeline_fails(tmp_path: Path) -> None:
    """A timeline's scenario is named after its file's stem ("trace:trace") and its runs.csv
    identity cells (no links, delay 0) are any timeline's: the same file name holding another
    delay passed as the same measurement (exit 0). Run directories' spec.json say what it held;
    a runs.csv alone does not."""
    texts = {
        "base": '- {start_iteration: 1, links: ["0-1"], delay_ms: 20}\n',
        "new": '- {start_iteration: 1, links: ["0-1"], delay_ms: 10}\n',
    }
    runs = {}
    for side, text in texts.items():
        faults = tmp_path / side / "trace.yaml"
        faults.parent.mkdir()
        faults.write_text(text)
        runs[side] = _small_run(tmp_path / "out" / side, faults=faults)
    out = _compare(runs["base"], runs["new"], "--tolerance", "100")
    assert out.returncode == 1
    assert re.fullmatch(
        r"run another way in NEW: m 1f1b trace:trace: faults_text sha256 '([0-9a-f]{12})' -> "
        r"'(?!\1)[0-9a-f]{12}'",
        out.stdout.splitlines()[-1],
    )
    assert "1 configuration run another way in NEW" in out.stderr
    same = tmp_path / "out" / "same"
    shutil.copytree(runs["base"], same)  # the same text: the same measurement
    assert _compare(runs["base"], same).returncode == 0
    commented = tmp_path / "commented"  # the same events: a comment and a blank line more
    commented.mkdir()
    (commented / "trace.yaml").write_text(f"# the base's delay\n\n{texts['base']}")
    assert (
        _compare(
            runs["base"], _small_run(tmp_path / "out" / "c", faults=commented / "trace.yaml")
        ).returncode
        == 0
    )
    alone = _compare(runs["base"] / "runs.csv", runs["new"], "--tolerance", "100")
    assert (alone.returncode, alone.stdout.splitlines()[-1]) == (
        0,
        "no regression: 9 metrics within 100 %",
    )


def test_a_saved_fault_timeline_this_version_refuses_cannot_be_matched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run saved by a version that read `delay_ms: "20"` as 20 (now refused) against a new
    run of the same timeline unquoted: compare said "run another way in NEW: ...
    faults_text sha256 'x' -> 'y'" (the old text's digest against the new events'), which
    it cannot know. It says, on one line naming the configuration, that the two cannot be
    matched, and why; still a failure (exit 1), a line of its own in the error."""
    faults = tmp_path / "trace.yaml"
    faults.write_text('- {start_iteration: 1, links: ["0-1"], delay_ms: 20}\n')
    base = _small_run(tmp_path / "out" / "base", faults=faults)
    new = _small_run(tmp_path / "out" / "new", faults=faults)
    record = json.loads((base / "spec.json").read_text())
    record["spec"]["faults_text"] = record["spec"]["faults_text"].replace("20", '"20"')
    (base / "spec.json").write_text(json.dumps(record))
    with pytest.raises(SystemExit) as failed:
        main(["compare", str(base), str(new), "--tolerance", "100"])
    out, err = capsys.readouterr()
    assert failed.value.code == 1
    assert out.splitlines()[-1] == (
        "cannot be matched: m 1f1b trace:trace: the fault timeline saved in spec.json does not "
        "read with this version, so whether both ran the same is unknown (BASE's: fault "
        f"timeline {record['spec']['faults']}: fault row 1: delay_ms must be a number or inf, "
        "got '20' (line 1))"
    )
    assert err == (
        "error: 1 configuration cannot be matched: a fault timeline saved by an older version "
        "does not read with this one (listed above)\n"
    )


def test_a_configuration_of_another_profile_or_recovery_fails(tmp_path: Path) -> None:
    """Runs of specs that differ in what runs.csv does not say (the profile's op times, a
    restart's cost) measured other things under the same names: 1F1B with its forward ops
    twice as long passed as no regression at 100 %, and, the other way, as a faster run.
    Run directories' spec.json say what each ran; the line names the input."""
    base = _small_run(tmp_path / "base")
    slow_forward = _small_run(tmp_path / "slow", profile=Profile.uniform(2, 4, 2, 1, 1))
    for new, old, changed in ((slow_forward, base, "'[1.0, 1.0]' -> '[2.0, 2.0]'"),
                              (base, slow_forward, "'[2.0, 2.0]' -> '[1.0, 1.0]'")):  # fmt: skip
        out = _compare(old, new, "--tolerance", "100")
        assert out.returncode == 1
        assert out.stdout.splitlines()[-1] == (
            f"run another way in NEW: m 1f1b fault-free: spec profile t_f {changed}"
        )
        assert "1 configuration run another way in NEW" in out.stderr
    restarting = _small_run(tmp_path / "restarting", restart_ms=5.0, checkpoint_every=3)
    out = _compare(base, restarting, "--tolerance", "100")
    assert out.returncode == 1
    assert out.stdout.splitlines()[-2:] == [
        "run another way in NEW: m 1f1b fault-free: spec checkpoint_every '500' -> '3'",
        "run another way in NEW: m 1f1b fault-free: spec restart_ms '0.0' -> '5.0'",
    ]
    again = _small_run(tmp_path / "again", profile=Profile.uniform(2, 4, 1.0, 1.0, 1.0))
    assert _compare(base, again).returncode == 0  # the same inputs
    alone = _compare(base / "runs.csv", slow_forward, "--tolerance", "100")
    assert alone.returncode == 0  # a runs.csv alone does not say


def test_a_setup_is_the_profile_as_it_resolves() -> None:
    """A preset's hardware spelled out as a mapping that changes nothing, or a model mapping
    that changes nothing, is the same setup; a field changed is another, named by what it
    changes in the profile run. The simulator takes no transport timeout nor injection."""

    def setup(model: Any = "gpt2-14b", **fields: Any) -> dict[str, Any]:
        spec = ExperimentSpec(name="h", models=(model,), systems=("1f1b",), **fields)
        return spec.setups()["gpt2-14b"]

    preset = setup()
    assert setup(hardware={"base": "h800-ib400"}) == preset
    assert setup({"base": "gpt2-14b", "name": "gpt2-14b", "num_microbatches": 24}) == preset
    assert setup(transport_timeout_s=30.0) == preset  # sim
    slower = setup(hardware={"base": "h800-ib400", "network_gbps": 200})
    assert {k: (preset[k], v) for k, v in slower.items() if preset[k] != v} == {
        "profile link_bandwidth_gbps": (400.0, 200.0),
        "profile dp_bandwidth_gbps": (preset["profile dp_bandwidth_gbps"], pytest.approx(159.2)),
    }
    profile = Profile.uniform(2, 4, 1, 1, 1)
    emulated = ExperimentSpec(
        name="e", models=("m",), profile=profile, systems=("1f1b",), backend="emulated",
        transport_timeout_s=30.0,
    ).setups()["m"]  # fmt: skip
    assert emulated["transport_timeout_s"] == 30.0 and emulated["injection"] == "hook"
    assert emulated["profile t_f"] == [1.0, 1.0]


def test_a_value_spelled_otherwise_is_the_same_value(tmp_path: Path) -> None:
    """A restart's cost of 5 and of 5.0 ms is one setup (compared as values, not text)."""
    spec = "name: t\nmodel: m\nprofile: {stages: 2, microbatches: 4, t_f: 1, t_b: 1, t_w: 1}\n"
    spec += "systems: [1f1b]\nnum_iterations: 2\nrestart_ms: "
    runs = {}
    for side, value in (("int", "5"), ("float", "5.0"), ("other", "6")):
        (tmp_path / f"{side}.yaml").write_text(spec + value + "\n")
        runs[side] = run_experiment(load_spec(tmp_path / f"{side}.yaml"), tmp_path / side)
    assert _compare(runs["int"], runs["float"]).returncode == 0
    other = _compare(runs["int"], runs["other"], "--tolerance", "100")
    assert (other.returncode, other.stdout.splitlines()[-1]) == (
        1,
        "run another way in NEW: m 1f1b fault-free: spec restart_ms '5' -> '6'",
    )


def test_a_damaged_spec_json_of_a_finished_run_cannot_be_compared(tmp_path: Path) -> None:
    """A field of its spec refused (num_repeats 0): exit 2 naming spec.json, not a pass with
    none of its setup checked."""
    run = _small_run(tmp_path / "out", restart_ms=5.0)
    record = json.loads((run / "spec.json").read_text())
    record["spec"]["num_repeats"] = 0
    (run / "spec.json").write_text(json.dumps(record))
    out = _compare(_small_run(tmp_path / "base"), run)
    assert out.returncode == 2
    assert out.stderr.startswith(f"error: {run / 'spec.json'}: num_repeats must be")
