"""The benchmarks that write files default to the repository's results/ (git-ignored), not
to a results/ under whatever folder they are run from."""

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.benchmarks.scripts import ROOT, load_script


@pytest.mark.parametrize(
    ("script", "default"),
    [
        ("bench_resilience", "results/resilience"),
        ("bench_scheduler_quality", "results/scheduler_quality.csv"),
    ],
)
def test_the_default_output_is_the_repository_s_git_ignored_results(
    script: str, default: str
) -> None:
    """Both were relative paths: run from /tmp they made /tmp/results."""
    out = load_script(script).DEFAULT_OUT
    assert out == ROOT / default
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing to ask .gitignore")
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", default], cwd=ROOT, check=False, timeout=30
    )
    assert ignored.returncode == 0


def test_resilience_run_elsewhere_writes_only_to_its_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench = load_script("bench_resilience")
    results = tmp_path / "repository" / "results" / "resilience"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr(bench, "DEFAULT_OUT", results)
    monkeypatch.setattr(
        bench,
        "_systems",
        lambda profile: dict.fromkeys(("1f1b", "zb", "adaptra-cpu", "adaptra"), 1.0),
    )
    drawn: list[Path] = []
    monkeypatch.setattr(bench, "plot_lines", lambda rows, path, **_: drawn.append(path))
    monkeypatch.setattr(sys, "argv", ["bench_resilience.py"])
    bench.main()
    assert list(elsewhere.iterdir()) == []
    assert (results / "resilience.csv").is_file()
    assert drawn and all(path.parent == results for path in drawn)


def test_scheduler_quality_run_elsewhere_writes_only_to_its_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench = load_script("bench_scheduler_quality")
    results = tmp_path / "repository" / "results"
    results.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr(bench, "DEFAULT_OUT", results / "scheduler_quality.csv")
    monkeypatch.setattr(bench, "profile_sets", lambda seeds: [("t", [("g", None)])])
    row: dict[str, Any] = {"group": "g", "ms": 1.0}
    monkeypatch.setattr(bench, "measure", lambda *args: row)
    monkeypatch.setattr(bench, "summarise", lambda rows, title: None)
    monkeypatch.setattr(sys, "argv", ["bench_scheduler_quality.py"])
    bench.main()
    assert list(elsewhere.iterdir()) == []
    assert (results / "scheduler_quality.csv").read_text() == "group,ms\ng,1.0\n"
