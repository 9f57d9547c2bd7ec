import csv
import subprocess
import sys
from pathlib import Path

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
    assert "no regression: 80 metrics within 0 %" in out.stdout


def test_a_ten_percent_worsening_fails_with_a_table(tmp_path: Path) -> None:
    rows = _rows()
    slow = next(r for r in rows if r["system"] == "adaptra" and r["scenario"] == "0-1@40ms")
    slow["median_iteration_ms"] = str(float(slow["median_iteration_ms"]) * 1.10)
    new = _write(tmp_path / "worse.csv", rows)
    out = _compare(BASELINE, new, "--tolerance", "5")
    assert out.returncode == 1
    worse = [line for line in out.stdout.splitlines() if line.endswith("WORSE")]
    assert len(worse) == 1 and "adaptra 0-1@40ms" in worse[0] and "+10.00%" in worse[0]
    assert "1 of 80 metrics got worse than 5 %" in out.stderr
    assert _compare(BASELINE, new, "--tolerance", "15").returncode == 0


def test_a_missing_configuration_fails(tmp_path: Path) -> None:
    out = _compare(BASELINE, _write(tmp_path / "short.csv", _rows()[1:]))
    assert out.returncode == 1
    assert "missing" in out.stdout
