"""Output files: written whole or not at all, readable like any other output file."""

import math
import os
import stat
from pathlib import Path
from typing import BinaryIO

import matplotlib
import pytest

from pipeline.checks import MAX_WHOLE_DIGITS
from pipeline.errors import ConfigError
from pipeline.files import (
    MAX_DEPTH,
    MAX_INPUT_CHARACTERS,
    atomic_writer,
    leftover_temporaries,
    load_yaml,
    load_yaml_lines,
    read_json,
    read_text,
    save_figure,
    write_atomic,
)
from pipeline.profile import Profile

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def test_a_result_file_gets_the_mode_open_would_give_it(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "runs.csv", "a,b\n")
        (tmp_path / "plain.txt").write_text("x")
    finally:
        os.umask(old)
    mode = stat.S_IMODE((tmp_path / "runs.csv").stat().st_mode)
    assert mode == stat.S_IMODE((tmp_path / "plain.txt").stat().st_mode) == 0o644


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path: Path) -> None:
    path = tmp_path / "runs.csv"
    write_atomic(path, "old\n")
    with pytest.raises(RuntimeError), atomic_writer(path) as handle:
        handle.write("half")
        raise RuntimeError("midway")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["runs.csv"]


def test_the_writers_temporary_files_are_known_by_their_names(tmp_path: Path) -> None:
    """What a SIGKILL mid-write leaves (no handler removes it) is listed, named as the
    writer names it; other files, hidden or .tmp, are not."""
    for name in (".lock", "notes.tmp", ".runs.csv.tmp", ".runs.csv.abc.tmp", "x.abcdefgh.tmp"):
        (tmp_path / name).write_text("")
    (tmp_path / ".d.abcdefgh.tmp").mkdir()  # a folder, not a file
    old = ".iterations.csv.k3x_q0ab.tmp"
    (tmp_path / old).write_text("")
    writing = atomic_writer(tmp_path / "runs.csv")
    writing.__enter__()  # the writer's own temporary file, as a kill leaves it
    [made] = [p for p in tmp_path.iterdir() if p.name.startswith(".runs.csv.") and len(p.name) > 18]
    assert leftover_temporaries(tmp_path) == sorted([tmp_path / old, made])
    writing.__exit__(None, None, None)
    assert leftover_temporaries(tmp_path) == [tmp_path / old]
    assert leftover_temporaries(tmp_path / "absent") == []


def test_an_append_adds_to_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "runs.csv"
    write_atomic(path, "a,b\n1,2\n")
    with atomic_writer(path, append=True) as handle:
        handle.write("3,4\n")
    assert path.read_text() == "a,b\n1,2\n3,4\n"


def test_a_write_that_fails_before_its_handle_leaves_no_descriptor_open(tmp_path: Path) -> None:
    """The old file cannot be copied (it is a folder): the temporary file's descriptor is
    closed and the file removed, every time."""
    path = tmp_path / "runs.csv"
    path.mkdir()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        with pytest.raises(IsADirectoryError), atomic_writer(path, append=True):
            pass
    assert len(os.listdir("/proc/self/fd")) == before
    assert [p.name for p in tmp_path.iterdir()] == ["runs.csv"]


def test_a_figure_is_saved_in_the_format_its_name_says(tmp_path: Path) -> None:
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    save_figure(fig, tmp_path / "a.png", dpi=50)
    save_figure(fig, tmp_path / "a.svg", dpi=50)
    plt.close(fig)
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in (tmp_path / "a.svg").read_bytes()[:1000]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "a.svg"]


def test_a_figure_that_fails_to_save_leaves_the_old_file_and_no_temporary_one(
    tmp_path: Path,
) -> None:
    """As a signal in the middle of `savefig` would: the chart drawn before stays whole."""
    path = tmp_path / "gantt.png"
    path.write_bytes(b"old chart")

    class Broken:
        def savefig(self, out: BinaryIO, **options: object) -> None:
            assert options == {"format": "png", "dpi": 50}
            out.write(b"\x89PNG half")
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        save_figure(Broken(), path, dpi=50)
    assert path.read_bytes() == b"old chart"
    assert [p.name for p in tmp_path.iterdir()] == ["gantt.png"]


def test_a_json_key_given_twice_is_refused_naming_it(tmp_path: Path) -> None:
    """A profile with "stages": 4 and then "stages": 5 ran 5 stages (json keeps the last),
    while specs and fault timelines (YAML) refuse a repeated key; at any depth now."""
    path = tmp_path / "p.json"
    path.write_text(
        '{"stages": 4, "microbatches": 12, "t_f": 10, "t_b": 10, "t_w": 10, "stages": 5}'
    )
    with pytest.raises(ConfigError) as refused:
        Profile.from_file(path)
    assert str(refused.value) == f"profile {path}: key 'stages' given twice in one object"
    path.write_text('{"a": [{"b": 1, "b": 1}], "c": {"b": 2}}')
    with pytest.raises(ConfigError, match="key 'b' given twice in one object"):
        read_json(path, "file")
    path.write_text('{"a": [{"b": 1}], "c": {"b": 2}}')  # the same key in two objects
    assert read_json(path, "file") == {"a": [{"b": 1}], "c": {"b": 2}}


def test_yaml_numbers_are_decimal_and_other_forms_strings() -> None:
    """YAML 1.1 read an unquoted 010 as octal 8, 0x10 as 16, 1:30 as 90 (base 60) and 1_000
    as 1000: a fault row's `start_iteration: 010` ran from iteration 8, `hosts: [01, 010]`
    were hosts 1-8. Only decimal forms are numbers now; the rest stay as written. A spec's
    `num_iterations: 010` and `delays_ms: [1e3]` were strings, refused, where a fault
    timeline's reader took them as numbers (and JSON 1e3): decimal numbers everywhere."""
    text = "[1.5, .5, 1.0e+3, -3, +4, 0, 3., .inf, 010, 0x10, 0o7, 1_000, '1:30', 1:30, 1e3]"
    assert load_yaml(text, "x") == [
        1.5, 0.5, 1000.0, -3, 4, 0, 3.0, math.inf, 10, "0x10", "0o7", "1_000", "1:30",
        "1:30", 1000.0,
    ]  # fmt: skip
    assert load_yaml("[-007, 1E-2, 2e+1, .5e1, e3, 1e, 1.e, 08.50]", "x") == [
        -7, 0.01, 20.0, 5.0, "e3", "1e", "1.e", 8.5,
    ]  # fmt: skip
    with pytest.raises(ConfigError, match="'0x10' is not a decimal whole number"):
        load_yaml("!!int 0x10", "x")


def test_a_yaml_lists_items_come_with_the_lines_they_start_on() -> None:
    """For a later error about an item to name its line (a fault row's, found against a run)."""
    text = "# rows\n- {a: 1}\n\n- a: 2\n  b: 3\n-   [4]\n"
    assert load_yaml_lines(text, "x") == ([{"a": 1}, {"a": 2, "b": 3}, [4]], (2, 4, 6))
    assert load_yaml_lines("[{a: 1},\n {a: 2}]", "x") == ([{"a": 1}, {"a": 2}], (1, 2))
    # a dash alone on its line: the item is named by it, not its first key's line below
    alone = "- a: 1\n-\n  a: 2\n-\n\n  [3]\n"
    assert load_yaml_lines(alone, "x") == ([{"a": 1}, {"a": 2}, [3]], (1, 2, 4))
    assert load_yaml_lines("{a: [1, 2]}", "x") == ({"a": [1, 2]}, ())  # not a list: no lines
    assert load_yaml_lines("", "x") == (None, ())
    with pytest.raises(ConfigError, match="^x is not valid YAML at line 2, column 2: "):
        load_yaml_lines("- [1\n-", "x")


def test_yaml_lines_count_newlines_only() -> None:
    """YAML breaks lines at U+0085, U+2028 and U+2029 too, and PyYAML's marks count them:
    an item on an editor's line 3 was named line 4, an error's line so too; a character
    YAML refuses (a form feed) was "is not valid YAML: ReaderError", with no place at all."""
    text = "- {a: 1}  # one\u2028# two\n\n- {a: 2}\n- [3\n"
    with pytest.raises(ConfigError) as broken:
        load_yaml_lines(text, "x")
    assert str(broken.value).startswith("x is not valid YAML at line 5, column 1: ")
    assert load_yaml_lines(text[:-5], "x") == ([{"a": 1}, {"a": 2}], (1, 3))
    with pytest.raises(ConfigError) as feed:
        load_yaml_lines("- {a: 1}\n- {a: 2}\f\n", "x")
    assert str(feed.value) == (
        "x is not valid YAML at line 2, column 9: special characters are not allowed: U+000C"
    )


def test_deep_nesting_and_yaml_aliases_are_refused_as_input(tmp_path: Path) -> None:
    """A 2 KB file of nested brackets was an internal error (Python's recursion) in every
    reader, and a 329-byte spec of aliases of aliases expanded into a 254 MB error line.
    Nesting past MAX_DEPTH and any alias are refused, one line; MAX_DEPTH itself is read."""
    deep = "[" * 1000 + "]" * 1000
    at_limit = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    path = tmp_path / "p.json"
    for text, expected in ((deep, False), ("[" * 65 + "]" * 65, False), (at_limit, True)):
        path.write_text(text)
        if expected:
            assert read_json(path, "profile") is not None and load_yaml(text, "f") is not None
            continue
        with pytest.raises(ConfigError, match=f"nested more than {MAX_DEPTH} deep"):
            read_json(path, "profile")
        with pytest.raises(ConfigError, match=f"nested more than {MAX_DEPTH} deep"):
            load_yaml(text, "spec s.yaml")
    with pytest.raises(ConfigError) as refused:
        load_yaml("a: &x [1, 2]\nb: [*x, *x]\n", "spec s.yaml")
    assert str(refused.value) == (
        "spec s.yaml is not valid YAML at line 2, column 5: an alias (*x) is not read here: "
        "write the value out"
    )
    assert load_yaml("a: &x [1, 2]\n", "f") == {"a": [1, 2]}  # an anchor alone is harmless


def test_a_whole_number_too_large_for_a_float_is_refused_as_input(tmp_path: Path) -> None:
    """`"mem_limit": 1e400` written out (400 digits) passed the reader and overflowed the
    profile's check converting it to a float, an internal error (OverflowError), as in every
    check of a spec, calibration or cluster job; 5,000 digits were one in the reader itself
    (Python's limit on reading a whole number). A whole number of over MAX_WHOLE_DIGITS
    digits is refused where it is read, with the file (and in YAML its line)."""
    path = tmp_path / "p.json"
    big = "1" * 400
    path.write_text(
        f'{{"stages": 2, "microbatches": 4, "t_f": 1, "t_b": 1, "t_w": 1, "mem_limit": {big}}}'
    )
    with pytest.raises(ConfigError) as refused:
        Profile.from_file(path)
    assert str(refused.value) == (
        f"profile {path}: 11111111111111111111... (400 digits) is too large a number"
    )
    for digits in (MAX_WHOLE_DIGITS + 1, 5000):
        path.write_text(f"[-{'9' * digits}]")
        with pytest.raises(ConfigError, match=rf"\({digits} digits\) is too large a number"):
            read_json(path, "file")
        with pytest.raises(ConfigError) as in_yaml:
            load_yaml(f"a: 1\nb: [2, {'9' * digits}]\n", "spec s.yaml")
        assert str(in_yaml.value) == (
            f"spec s.yaml is not valid YAML at line 2, column 8: 99999999999999999999... "
            f"({digits} digits) is too large a number"
        )
    most = "9" * MAX_WHOLE_DIGITS
    path.write_text(f"[{most}, -{most}, 0, -0]")
    assert read_json(path, "file") == [int(most), -int(most), 0, 0]
    assert load_yaml(f"[{most}, +{most}, -{'0' * 400}7, 007]", "x") == [
        int(most), int(most), -7, 7,
    ]  # fmt: skip


def test_an_input_with_no_end_is_refused_past_the_longest_input(tmp_path: Path) -> None:
    """`run --spec /dev/zero` read until memory ran out; an input is read up to
    MAX_INPUT_CHARACTERS, one more is refused naming it."""
    with pytest.raises(ConfigError) as refused:
        read_text("/dev/zero", "spec")
    assert str(refused.value) == "spec /dev/zero is longer than 67,108,864 characters"
    path = tmp_path / "longest.yaml"
    path.write_text("#" * MAX_INPUT_CHARACTERS)
    assert len(read_text(path, "spec")) == MAX_INPUT_CHARACTERS
    path.write_text("a: 1\r\nb: 2\r")  # text as open reads it (newlines translated)
    assert read_text(path, "spec") == "a: 1\nb: 2\n"
