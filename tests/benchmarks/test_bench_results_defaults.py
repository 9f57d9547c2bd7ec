"""The benchmarks that write files default to the repository's results/ (git-ignored), not
to a results/ under whatever folder they are run from."""

import subprocess

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
