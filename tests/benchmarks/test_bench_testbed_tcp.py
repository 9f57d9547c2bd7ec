"""Its --iterations leave the onset scenario an iteration with an estimate of its delay."""

import sys

import pytest

from tests.benchmarks.scripts import load_script

bench = load_script("bench_testbed_tcp")


def test_too_few_iterations_are_refused_before_any_testbed_is_built(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--iterations 2 ran the machine-defaults steady row, then the onset scenario (its fault
    from measured iteration 2) found no slow iteration: StatisticsError, no median for empty
    data."""
    built: list[object] = []
    monkeypatch.setattr(bench, "estimates", lambda *args: built.append(args) or [30.0])
    for iterations in ("3", "2", "0"):
        monkeypatch.setattr(sys, "argv", ["bench_testbed_tcp.py", "--iterations", iterations])
        with pytest.raises(SystemExit) as exit_:
            bench.main()
        assert exit_.value.code == 2
        assert capsys.readouterr().err.endswith(
            "error: --iterations must be at least 4: the onset scenario's fault starts at "
            f"measured iteration 2 and is estimated from the next, got {iterations}\n"
        )
    assert built == []
    monkeypatch.setattr(sys, "argv", ["bench_testbed_tcp.py", "--iterations", "4"])
    bench.main()  # the least it takes
    assert len(built) == 12 and {args[2] for args in built} == {4}
