import math

import pytest

from injectors.fault_timeline import parse_trace, parse_yaml
from pipeline.errors import ConfigError

# PAPER.md section 6, Fig. 21.
FIG21 = """15;2_3;0.03  85;2_3;0  120;0_1,5_6;0.04  190;0_1,5_6;0  230;6_7;0.02  300;6_7;0
340;2_3,3_4,6_7;0.05  410;2_3,3_4,6_7;0  450;5_6;0.06  520;5_6;0  560;1_2,6_7;0.06
630;1_2,6_7;0  670;0_1,4_5;0.02  740;0_1,4_5;0  780;0_1,1_2,2_3;0.04  850;0_1,1_2,2_3;0
890;4_5,5_6;0.05  960;4_5,5_6;0  1030;;inf"""


def test_the_papers_fig21_trace() -> None:
    timeline = parse_trace(FIG21)
    assert len(timeline.events) == 19
    timeline.validate(num_stages=8, num_iterations=1200)
    assert timeline.pp_delays_ms(14, 8) == (0.0,) * 7
    assert timeline.pp_delays_ms(15, 8) == (0.0, 0.0, 30.0, 0.0, 0.0, 0.0, 0.0)
    assert timeline.pp_delays_ms(85, 8) == (0.0,) * 7
    assert timeline.pp_delays_ms(345, 8) == (0.0, 0.0, 50.0, 50.0, 0.0, 0.0, 50.0)
    assert not timeline.has_failure(1029)
    assert timeline.has_failure(1030)
    assert timeline.events[-1].links == () and timeline.events[-1].delay_ms == math.inf


def test_yaml_form_means_the_same() -> None:
    yaml_text = """
- {start_iteration: 15, links: ["2-3"], delay_ms: 30}
- {start_iteration: 85, links: ["2-3"], delay_ms: 0}
- {start_iteration: 1030, links: [], delay_ms: inf}
"""
    from_yaml = parse_yaml(yaml_text)
    from_trace = parse_trace("15;2_3;0.03 85;2_3;0 1030;;inf")
    assert from_yaml == from_trace


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("5;2_3;0.03 7;2_3", "fault row 2: '7;2_3' needs 3 fields"),
        ("5;2_4;0.03", "fault row 1: '2_4' is not a PP link"),
        ("x;2_3;0.03", "fault row 1: start iteration 'x' is not an integer"),
        ("5;2_3;-0.01", "fault row 1: delay must be >= 0"),
        ("5;2_3;slow", "fault row 1: delay 'slow' is not a number"),
        ("-1;2_3;0.01", "fault row 1: start iteration must be >= 0"),
        ("5;;0.03", "fault row 1: a delay needs at least one link"),
    ],
)
def test_bad_trace_rows_are_named(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_trace(text)


def test_links_and_iterations_are_checked_against_the_run() -> None:
    timeline = parse_trace("5;2_3;0.03 50;6_7;0.02")
    with pytest.raises(ConfigError, match="fault row 2: link 6-7 does not exist with 4 stages"):
        timeline.validate(num_stages=4, num_iterations=100)
    with pytest.raises(ConfigError, match="fault row 2: starts at iteration 50 but the run has 20"):
        timeline.validate(num_stages=8, num_iterations=20)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{a: 1}", "is a list"),
        ("- {start_iteration: 1, links: ['0-1'], delay_ms: 5, colour: red}", "fault row 1"),
        ("- {start_iteration: 1, links: '0-1', delay_ms: 5}", "links must be a list"),
        ("- {start_iteration: 1, links: ['0_1'], delay_ms: 5}", "'0_1' is not a PP link"),
        ("- [unclosed", "not valid YAML"),
    ],
)
def test_bad_yaml_is_named(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_yaml(text)
