"""Any profile file, however wrong, gives either a result or one clear error line."""

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.cli import main

VALID = {"stages": 3, "microbatches": 6, "t_f": 10, "t_b": [1, 2, 3], "t_w": 5}
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 40)
    | st.floats(allow_nan=True)
    | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=4),
    max_leaves=6,
)


@given(
    st.dictionaries(
        st.sampled_from([*VALID, "delay_ms", "mem_limit", "num_delegates", "bogus"]),
        json_values,
        max_size=4,
    ),
    st.sampled_from(["schedule", "simulate"]),
)
def test_bad_profiles_never_raise_a_traceback(changes: dict, command: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "profile.json"
        path.write_text(json.dumps({**VALID, **changes}))
        try:
            main([command, "--profile", str(path), "--policy", "zb-h1", "--format", "json"])
        except SystemExit as exit_:
            assert exit_.code == 1  # handled: the one-line error path
        # Any other exception escapes and fails the test.


def test_error_line_goes_to_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({**VALID, "t_w": [1]}))
    with pytest.raises(SystemExit) as exit_:
        main(["schedule", "--profile", str(path), "--policy", "1f1b"])
    assert exit_.value.code == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"error: profile {path}: t_w has 1 entries, expected one per stage (3)\n"
