"""The calibration file: a host's runtime costs, read strictly."""

import json
from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from pipeline.host_costs import FREE, HostCosts

COSTS = {
    "schema_version": 1,
    "send_fixed_ms": 0.2,
    "send_ms_per_mib": 0.4,
    "receive_lag_ms": 0.3,
    "receive_lag_ms_per_mib": 0.1,
    "op_overhead_ms": 0.05,
    "host": "h",
    "measured_at": "2026-12-01T00:00:00+00:00",
}


def test_round_trip_and_costs(tmp_path: Path) -> None:
    path = tmp_path / "host.json"
    path.write_text(json.dumps(COSTS))
    costs = HostCosts.from_file(path)
    assert costs.to_dict() == COSTS
    assert costs.send_ms(2 << 20) == pytest.approx(0.2 + 0.8)
    assert costs.receive_lag_for_ms(1 << 19) == pytest.approx(0.3 + 0.05)
    assert FREE.send_ms(1 << 30) == FREE.receive_lag_for_ms(1 << 30) == 0.0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"schema_version": 2}, "schema_version 2 is not supported"),
        ({"send_fixed_ms": -1}, "send_fixed_ms must be finite and >= 0"),
        ({"op_overhead_ms": float("nan")}, "op_overhead_ms must be finite"),
        ({"receive_lag_ms": "fast"}, "receive_lag_ms must be a number"),
        ({"receive_lag_ms": True}, "receive_lag_ms must be a number"),
        ({"colour": "red"}, r"unknown key\(s\) \['colour'\]"),
        ({"send_ms_per_mib": None}, "send_ms_per_mib must be a number"),
    ],
)
def test_bad_calibrations_are_refused(tmp_path: Path, change: dict, message: str) -> None:
    path = tmp_path / "host.json"
    path.write_text(json.dumps({**COSTS, **change}))
    with pytest.raises(ConfigError, match=message):
        HostCosts.from_file(path)


def test_a_missing_cost_or_file_is_named(tmp_path: Path) -> None:
    data = dict(COSTS)
    del data["receive_lag_ms"]
    (tmp_path / "host.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"missing \['receive_lag_ms'\]"):
        HostCosts.from_file(tmp_path / "host.json")
    with pytest.raises(ConfigError, match="cannot read calibration"):
        HostCosts.from_file(tmp_path / "absent.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ConfigError, match="is not valid JSON"):
        HostCosts.from_file(tmp_path / "bad.json")
