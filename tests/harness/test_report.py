"""report.md says what a reader needs first: the headline, how each system ran, what the
columns mean, and which seed and revision made it."""

from pathlib import Path

from harness.experiment import run_experiment
from harness.spec import default_experiment


def test_the_default_experiment_s_report_leads_with_its_headline(tmp_path: Path) -> None:
    run_dir = run_experiment(default_experiment(), tmp_path / "r")
    report = (run_dir / "report.md").read_text()
    assert "seed 0; git revision `" in report
    assert "fig4-uniform-10ms zb 2.69x (0-1@40ms)" in report  # 1050 / 390 ms
    assert "fig4-uniform-10ms 0-1@40ms 2.30x over 1f1b" in report  # 990 / 430 ms
    assert "| fig4-uniform-10ms | adaptra | delegated | oracle | 0-1@40ms | 430.0 |" in report
    assert "| fig4-uniform-10ms | 1f1b | direct | fixed | fault-free | 450.0 |" in report
    assert "Bubble ratio: 1 - (time the stages spent in ops)" in report
