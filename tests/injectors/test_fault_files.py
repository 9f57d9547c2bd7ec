import re

import pytest

from injectors.fault_files import load_faults, parse_faults, parse_trace, parse_yaml
from injectors.fault_model import Effect, Target, TargetKind
from pipeline.errors import ConfigError
from pipeline.topology import Link, Topology

# docs/paper.md, Fig. 21.
FIG21 = """15;2_3;0.03  85;2_3;0  120;0_1,5_6;0.04  190;0_1,5_6;0  230;6_7;0.02  300;6_7;0
340;2_3,3_4,6_7;0.05  410;2_3,3_4,6_7;0  450;5_6;0.06  520;5_6;0  560;1_2,6_7;0.06
630;1_2,6_7;0  670;0_1,4_5;0.02  740;0_1,4_5;0  780;0_1,1_2,2_3;0.04  850;0_1,1_2,2_3;0
890;4_5,5_6;0.05  960;4_5,5_6;0  1030;;inf"""


def test_the_papers_fig21_trace() -> None:
    model = parse_trace(FIG21)
    eight = Topology(8)
    assert len(model.events) == 19
    model.validate(eight, num_iterations=1200)
    assert model.pp_delays_ms(14, eight) == (0.0,) * 7
    assert model.pp_delays_ms(15, eight) == (0.0, 0.0, 30.0, 0.0, 0.0, 0.0, 0.0)
    assert model.pp_delays_ms(85, eight) == (0.0,) * 7
    assert model.pp_delays_ms(345, eight) == (0.0, 0.0, 50.0, 50.0, 0.0, 0.0, 50.0)
    assert not model.has_failure(1029, eight)
    assert model.has_failure(1030, eight)
    # The paper's NIC failure: rnic0 of the host of stage floor(S/2) = 4, replica 0.
    last = model.events[-1]
    assert last.effect == Effect(down=True) and last.target.units(eight) == (("nic", 4, "rnic0"),)


def test_yaml_form_means_the_same() -> None:
    yaml_text = """
- {start_iteration: 15, links: ["2-3"], delay_ms: 30}
- {start_iteration: 85, links: ["2-3"], delay_ms: 0}
- {start_iteration: 1030, links: [], delay_ms: inf}
"""
    from_yaml = parse_yaml(yaml_text)
    from_trace = parse_trace("15;2_3;0.03 85;2_3;0 1030;;inf")
    assert [(e.start_iteration, e.target, e.effect) for e in from_yaml.events] == [
        (e.start_iteration, e.target, e.effect) for e in from_trace.events
    ]


def test_every_target_and_effect_of_the_yaml_contract(tmp_path) -> None:
    path = tmp_path / "faults.yaml"
    path.write_text(
        """
- start_iteration: 1
  at_ms: 5
  end_iteration: 4
  links: ["pp1:0-1", "dp0:0-1"]
  delay_ms: 20
  jitter_ms: 5
- {start_iteration: 2, hosts: [3, 1], bandwidth_gbps: 0.5}
- {start_iteration: 2, nic: "host2:rnic1", down: true}
- {start_iteration: 3, links: ["2-3"], stall_ms: 40}
- start_iteration: 3
  links: ["0-1"]
  distribution: {normal: {mean_ms: 10, std_ms: 2}, redraw_every_ms: [50, 100]}
"""
    )
    model = load_faults(path, seed=3)
    first, cap, nic, stall, normal = model.events
    assert (first.at_ms, first.end_iteration, first.effect) == (5.0, 4, Effect(20.0, 5.0))
    assert first.target.links == (Link.pp(0, 1), Link.dp(0, 0))
    assert cap.target == Target(TargetKind.HOSTS, hosts=(1, 3))
    assert cap.effect.bandwidth_gbps == 0.5
    assert str(nic.target) == "host2:rnic1" and nic.effect.down
    assert stall.effect.stall_ms == 40.0
    assert normal.effect.normal_ms == (10.0, 2.0)
    assert normal.effect.redraw_every_ms == (50.0, 100.0)
    assert model.seed == 3
    model.validate(Topology(4, 2), num_iterations=5)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("5;2_3;0.03 7;2_3", "fault row 2: '7;2_3' needs 3 fields"),
        ("5;2_4;0.03", "fault row 1: '2_4' is not a PP link"),
        ("x;2_3;0.03", "fault row 1: start iteration 'x' is not an integer"),
        ("5;2_3;-0.01", r"fault row 1: delay must be in 0..3600 s \(inf: down\), got '-0.01'"),
        ("5;2_3;100000", r"fault row 1: delay must be in 0..3600 s \(inf: down\), got '100000'"),
        ("5;2_3;slow", "fault row 1: delay 'slow' is not a number"),
        ("-1;2_3;0.01", "fault row 1: start iteration must be >= 0"),
        ("5;;0.03", r"fault row 1: a delay needs at least one link \(a row with none fails "),
        ("9;;0", "no row of this format ends a failure: a YAML row's end_iteration does"),
        # A huge number is no failure (only `inf` is): 1e306 s overflowed to inf in ms.
        ("0;0_1;1e306", r"fault row 1: delay must be in 0..3600 s \(inf: down\), got '1e306'"),
        ("0;0_1;Infinity", "fault row 1: delay 'Infinity' is not a number or inf"),
        ("0;0_1;nan", "fault row 1: delay 'nan' is not a number or inf"),
        ("\u0663;0_1;0.01", "fault row 1: start iteration '\u0663' is not an integer"),
        ("1_0;0_1;0.01", "fault row 1: start iteration '1_0' is not an integer"),
        ("3;\u0661_\u0662;0.01", "is not a PP link"),
        # its line too, past comments and blank lines; a space inside a row splits it
        ("# a\n\n# b\n1;0_1;0.01\n\n2;0_9;0.01", r"fault row 2: '0_9' .* \(line 6\)$"),
        ("3;0_1;0.01\n\n1;1_2;0.01", r"fault row 2 starts before row 1 .* \(lines 1 and 3\)$"),
        (
            "1;0_1, 1_2;0.02",
            r"fault row 1: '1;0_1,' needs 3 fields .* \(spaces separate rows: none inside one\)"
            r" \(line 1\)$",
        ),
    ],
)
def test_bad_trace_rows_are_named(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_trace(text)


def test_a_comment_runs_to_the_end_of_its_line() -> None:
    """A row with a trailing `# comment` was refused as a row a space split ("fault row 2:
    '#' needs 3 fields ... (spaces separate rows: none inside one)"): a `#` starts a comment
    after a row as on a line of its own."""
    commented = parse_trace("# link 0-1\n1;0_1;0.02  # 20 ms\n3;0_1;0 5;1_2;0.01#one\n  # end\n")
    plain = parse_trace("1;0_1;0.02\n3;0_1;0\n5;1_2;0.01")
    assert [(e.row, e.start_iteration, e.target, e.effect) for e in commented.events] == [
        (e.row, e.start_iteration, e.target, e.effect) for e in plain.events
    ]
    assert [e.line for e in commented.events] == [2, 3, 3]
    with pytest.raises(ConfigError) as split:  # a space inside a row is still one, named
        parse_trace("1;0_1, 1_2;0.02  # two links")
    assert str(split.value) == (
        "fault row 1: '1;0_1,' needs 3 fields 'start_iteration;links;delay_s' (spaces separate "
        "rows: none inside one) (line 1)"
    )


@pytest.mark.parametrize(
    ("char", "name"),
    [
        ("\f", "form feed"),
        ("\v", "vertical tab"),
        ("\u2028", "line separator"),
        ("\x85", "next line"),
    ],
)
def test_a_trace_counts_lines_by_newlines_and_refuses_other_line_breaks(
    char: str, name: str
) -> None:
    """str.splitlines broke a line at a form feed, U+2028 and the like: a row's error named a
    line below the one an editor shows ("line 3" for a row on line 2), and a comment ended
    there, its rest read as rows. Such a character is refused, naming its line."""
    with pytest.raises(ConfigError) as odd:
        parse_faults(f"1;0_1;0.01\n2;0_1;0 # ends{char}3;9_9;1\n", "t.txt")
    assert str(odd.value) == (
        f"fault timeline t.txt: line 2 holds a {name} (U+{ord(char):04X}), which breaks a line "
        "for some readers and not for others: end lines with a newline only"
    )


def test_a_trace_with_crlf_line_ends_reads_as_with_newlines() -> None:
    crlf = parse_trace("1;0_1;0.01\r\n\r\n2;0_1;0 # end\r\n")
    assert [(e.row, e.line, e.start_iteration) for e in crlf.events] == [(1, 1, 1), (2, 3, 2)]
    with pytest.raises(ConfigError) as bad:
        parse_trace("1;0_1;0.01\r\nx;0_1;0\r\n")
    assert str(bad.value) == "fault row 2: start iteration 'x' is not an integer (line 2)"


_LACKS = (
    "link 5-6 does not exist with 4 stages and 1 replica (PP links i-(i+1) < 4, DP ring links "
    "dp<stage>:a-(a+1) and dp<stage>:0-(D-1))"
)


@pytest.mark.parametrize(
    ("name", "text", "lines"),
    [
        ("slow.txt", "# a comment\n1;0_1;0.01\n\n2;5_6;0.01 9;0_1;0\n", (2, 4, 4)),
        (
            "slow.yaml",
            "# a comment\n- {start_iteration: 1, links: ['0-1'], delay_ms: 10}\n\n"
            "- start_iteration: 2\n  links: ['5-6']\n  delay_ms: 10\n"
            "- {start_iteration: 9, links: ['0-1'], delay_ms: 0}\n",
            (2, 4, 7),
        ),
    ],
)
def test_an_error_found_against_the_run_names_the_file_and_the_line(
    name: str, text: str, lines: tuple[int, ...]
) -> None:
    """A link the run lacks, or a start after its last iteration, named the row but not its
    line, as an error found reading the file does (a trace's), in both forms."""
    model = parse_faults(text, name)
    assert [(event.row, event.line) for event in model.events] == list(
        zip((1, 2, 3), lines, strict=True)
    )
    with pytest.raises(ConfigError) as lacks:
        model.validate(Topology(4), num_iterations=20)
    assert str(lacks.value) == f"fault timeline {name}: fault row 2: {_LACKS} (line {lines[1]})"
    with pytest.raises(ConfigError) as late:
        model.validate(Topology(8), num_iterations=5)
    assert str(late.value) == (
        f"fault timeline {name}: fault row 3: starts at iteration 9 but the run has 5 "
        f"iterations (0..4) (line {lines[2]})"
    )
    with pytest.raises(ConfigError) as one:
        model.validate(Topology(8), num_iterations=1)
    assert "but the run has 1 iteration (0..0)" in str(one.value)  # not "1 iterations"


def test_a_yaml_rows_error_names_its_line() -> None:
    """As a trace's does: the line its row starts on (YAML's own errors name theirs)."""
    first = "- {start_iteration: 1, links: ['0-1'], delay_ms: 10}\n\n"
    with pytest.raises(ConfigError) as refused:
        parse_faults(f"{first}- start_iteration: 2\n  links: '0-1'\n  delay_ms: 10\n", "f.yaml")
    assert str(refused.value) == (
        "fault timeline f.yaml: fault row 2: links must be a list like ['0-1'] (line 3)"
    )
    earlier = "- {start_iteration: 0, links: ['0-1'], delay_ms: 0}"
    with pytest.raises(ConfigError) as unordered:
        parse_faults(
            f"{first}- start_iteration: 2\n  links: ['0-1']\n  stall_ms: 5\n\n{earlier}", "f.yaml"
        )
    assert str(unordered.value) == (
        "fault timeline f.yaml: fault row 3 starts before row 2 (iteration 0 at 0 ms after "
        "iteration 2 at 0 ms): order rows by when they start (lines 3 and 7)"
    )


def test_targets_and_iterations_are_checked_against_the_run() -> None:
    model = parse_trace("5;2_3;0.03 50;6_7;0.02")
    with pytest.raises(ConfigError, match="fault row 2: link 6-7 does not exist with 4 stages"):
        model.validate(Topology(4), num_iterations=100)
    with pytest.raises(ConfigError, match="fault row 2: starts at iteration 50 but the run has 20"):
        model.validate(Topology(8), num_iterations=20)
    with pytest.raises(ConfigError, match="fault row 1: host pair 1-9 does not exist"):
        parse_yaml("- {start_iteration: 0, hosts: [1, 9], delay_ms: 1}").validate(Topology(4), 5)
    read = parse_faults("5;2_3;0.03 50;6_7;0.02", "slow.txt")  # its errors name the file
    with pytest.raises(ConfigError, match="^fault timeline slow.txt: fault row 2: link 6-7 "):
        read.validate(Topology(4), num_iterations=100)
    with pytest.raises(ConfigError, match="fault row 1: NIC host1:rnic7 does not exist"):
        parse_yaml("- {start_iteration: 0, nic: host1:rnic7, down: true}").validate(Topology(4), 5)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{a: 1}", "is a list"),
        ("- {start_iteration: 1, links: ['0-1'], delay_ms: 5, colour: red}", "unknown key"),
        ("- {start_iteration: 1, links: '0-1', delay_ms: 5}", "links must be a list"),
        ("- {start_iteration: 1, links: ['0_1'], delay_ms: 5}", "'0_1' is not a link"),
        ("- {start_iteration: 1, links: ['0-1']}", "give one effect"),
        ("- {start_iteration: 1, links: ['0-1'], hosts: [0, 1], delay_ms: 1}", "one target"),
        ("- {start_iteration: 1, links: ['0-1'], stall_ms: 5, jitter_ms: 1}", "jitter_ms goes"),
        # a stall of 0 is no effect, which ends every effect on its target (a cap, a NIC down)
        ("- {start_iteration: 1, links: ['0-1'], stall_ms: 0}", "stall_ms must be > 0"),
        ("- {start_iteration: 1, links: ['0-1'], bandwidth_gbps: 0}", "must be >= 0.001"),
        ("- {start_iteration: 1, links: ['0-1'], bandwidth_gbps: 1e-300}", "must be >= 0.001"),
        ("- {start_iteration: 1, links: ['0-1'], delay_ms: .inf, jitter_ms: 3}", "cannot go"),
        ("- {start_iteration: 3, end_iteration: 3, links: ['0-1'], delay_ms: 1}", "must come"),
        ("- {start_iteration: 1, hosts: [2, 2], delay_ms: 1}", "pair of two hosts"),
        ("- {start_iteration: 1, nic: rnic0, down: true}", "not like 'host1:rnic0'"),
        ("- {start_iteration: 1, links: ['0-1'], down: yes please}", "down takes true"),
        ("- {start_iteration: 1, links: ['0-1'], distribution: {normal: 3}}", "distribution is"),
        ("- [unclosed", "not valid YAML"),
        # a number too large for a float is no `inf` (down): refused as YAML is read
        ("- {start_iteration: 0, links: ['0-1'], delay_ms: 1e999}", "'1e999' is too large"),
        ("- {start_iteration: 0, links: ['0-1'], delay_ms: 1.0e+999}", "too large a number"),
        ("- {start_iteration: 0, links: ['0-1'], delay_ms: 1e308}", "must be in 0..3600000"),
        ("- {start_iteration: 0, links: ['0-1'], delay_ms: +Infinity}", "a number or inf, got '+"),
        ("- {start_iteration: 0, links: ['0-1'], delay_ms: 1_0}", "a number or inf, got '1_0'"),
        ("- {start_iteration: 0, links: ['0-1'], delay_ms: .nan}", "delay_ms nan is not a number"),
        ("- {start_iteration: 0, links: ['0-1'], delay_ms: 5, 3: 4}", "unknown key\\(s\\) 3;"),
        (
            "- {start_iteration: 0, links: ['0-1'], delay_ms: 5, delay_ms: 500}",
            "not valid YAML at line 1, column 53: key 'delay_ms' given twice",
        ),
        ("- {start_iteration: 0, nic: 'host1:rnic0\\n', down: true}", "not like 'host1:rnic0'"),
        ("- {start_iteration: 0, links: ['\u0661-\u0662'], delay_ms: 5}", "is not a link"),
    ],
)
def test_bad_yaml_is_named(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_yaml(text)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ("start_iteration: '1', links: ['0-1'], delay_ms: 5", "start iteration must be an integer"),
        ("start_iteration: 1, end_iteration: '4', links: ['0-1'], delay_ms: 5", "end iteration"),
        ("start_iteration: true, links: ['0-1'], delay_ms: 5", "must be an integer, got True"),
        ("start_iteration: 1, at_ms: '5', links: ['0-1'], delay_ms: 5", "at_ms must be a number"),
        ("start_iteration: 1, links: ['0-1'], delay_ms: '5'", "delay_ms must be a number or inf"),
        ("start_iteration: 1, links: ['0-1'], delay_ms: \"5\"", "got '5' (line 1)"),
        ("start_iteration: 1, links: ['0-1'], delay_ms: 5, jitter_ms: '1'", "jitter_ms must be"),
        ("start_iteration: 1, links: ['0-1'], bandwidth_gbps: '1'", "bandwidth_gbps must be"),
        ("start_iteration: 1, links: ['0-1'], stall_ms: '5'", "stall_ms must be a number"),
        ("start_iteration: 1, hosts: ['0', 1], stall_ms: 5", "host must be an integer, got '0'"),
        (
            "start_iteration: 1, links: ['0-1'], "
            "distribution: {normal: {mean_ms: '10', std_ms: 2}, redraw_every_ms: [50, 100]}",
            "mean_ms must be a number, got '10'",
        ),
        (
            "start_iteration: 1, links: ['0-1'], "
            "distribution: {normal: {mean_ms: 10, std_ms: 2}, redraw_every_ms: ['50', 100]}",
            "redraw_every_ms must be a number, got '50'",
        ),
    ],
)
def test_a_quoted_number_is_refused_as_the_specs_refuse_it(fields: str, message: str) -> None:
    """`delay_ms: "5"` was read as 5 where a spec or a profile refuses a string for a number
    (`delays_ms[0] must be a number, got '5'`): refused the same way, every number of a row."""
    with pytest.raises(ConfigError) as refused:
        parse_yaml(f"- {{{fields}}}")
    assert str(refused.value).startswith("fault row 1: ") and message in str(refused.value)


def test_inf_is_a_failure_quoted_or_not_and_a_trace_reads_its_text() -> None:
    """YAML reads `inf` as a string (its float is `.inf`): every form of it still is down."""
    for delay in ("inf", "'inf'", "INF", ".inf"):
        (event,) = parse_yaml(f"- {{start_iteration: 1, links: ['0-1'], delay_ms: {delay}}}").events
        assert event.effect == Effect(down=True)
    (event,) = parse_trace("010;0_1;0.005").events
    assert (event.start_iteration, event.effect.delay_ms) == (10, 5.0)


def test_the_suffix_says_the_form_in_any_case_and_any_other_is_refused(tmp_path) -> None:
    """.yaml/.yml are YAML rows and .txt the paper's trace (.YML was read as a trace)."""
    rows = "- {start_iteration: 2, links: ['0-1'], delay_ms: 30}\n"
    for name, text in (("a.YML", rows), ("b.Yaml", rows), ("c.TXT", "2;0_1;0.03")):
        (tmp_path / name).write_text(text)
        (event,) = load_faults(tmp_path / name).events
        assert (event.start_iteration, event.target.links, event.effect.delay_ms) == (
            2, (Link.parse("0-1"),), pytest.approx(30.0),
        )  # fmt: skip
    for name, what in (("p.json", "suffix '.json'"), ("trace", "no suffix")):
        (tmp_path / name).write_text("2;0_1;0.03")
        with pytest.raises(ConfigError) as refused:
            load_faults(tmp_path / name)
        assert str(refused.value) == (
            f"fault timeline {tmp_path / name} has {what}: give the paper's trace as .txt or YAML "
            "rows as .yaml or .yml"
        )


def test_a_leading_zero_is_decimal_and_base_60_is_refused() -> None:
    """YAML 1.1's forms: `start_iteration: 010` ran from iteration 8 (octal), `hosts: [01,
    010]` were hosts 1-8, `at_ms: 12:30` was 750 ms (base 60)."""
    event = parse_yaml("- {start_iteration: 010, hosts: [01, 010], delay_ms: 10}").events[0]
    assert (event.start_iteration, str(event.target)) == (10, "hosts 1-10")
    with pytest.raises(ConfigError, match="at_ms must be a number, got '12:30'"):
        parse_yaml("- {start_iteration: 1, at_ms: 12:30, links: ['0-1'], delay_ms: 10}")


def test_a_number_of_thousands_of_digits_is_refused_naming_its_row() -> None:
    """A trace's start iteration, a link or a NIC's host of 5,000 digits was an internal
    error (ValueError: past Python's limit on reading a whole number)."""
    many = "1" * 5000
    for text, said in (
        (f"{many};0_1;0.01", "fault row 1: start iteration 11111111111111111111..."),
        (f"0;0_{many};0.01", "fault row 1: '0_1111111"),
    ):
        with pytest.raises(ConfigError, match=re.escape(said)):
            parse_trace(text)
    for row, said in (
        (f"links: ['0-{many}'], delay_ms: 5", "fault row 1: link '0-11111"),
        (f"nic: 'host{many}:rnic0', delay_ms: 5", "fault row 1: nic host 11111"),
    ):
        with pytest.raises(ConfigError, match=re.escape(said)):
            parse_yaml(f"- {{start_iteration: 0, {row}}}\n")


@pytest.mark.parametrize("trace", [True, False])
def test_an_empty_timeline_s_error_fits_a_spec_as_well_as_run(trace: bool) -> None:
    """A spec's `faults:` naming an empty file was told 'a run without faults takes no
    --faults', an option the spec never gave: the error names both ways of giving one."""
    with pytest.raises(ConfigError) as refused:
        parse_trace("# nothing\n") if trace else parse_yaml("[]\n")
    assert str(refused.value) == (
        "the timeline has no rows (a run without faults names no timeline: no run --faults, "
        "no spec faults)"
    )


def test_a_row_that_names_a_link_twice_is_refused_as_a_spec_refuses_it() -> None:
    """As a spec's link set (`link_sets[0][1] ('0-1') repeats link 0-1`); it was taken, the
    link slowed once. Overlapping names of different links (every replica's and one
    replica's) stay allowed."""
    with pytest.raises(ConfigError, match=r"^fault row 1: '0-1' repeats link 0-1 \('0-1'\); "):
        parse_yaml('[{start_iteration: 1, links: ["0-1", "2-3", "0-1"], delay_ms: 5}]')
    with pytest.raises(ConfigError, match=r"^fault row 2: '2_3' repeats link 2-3 \('2_3'\); "):
        parse_trace("1;0_1;0.01\n3;2_3,2_3;0.02")
    model = parse_yaml('[{start_iteration: 1, links: ["0-1", "pp0:0-1"], delay_ms: 5}]')
    assert model.events[0].target.links == (Link.parse("0-1"), Link.parse("pp0:0-1"))
