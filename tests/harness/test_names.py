"""Run names are one folder inside --out, whose name has at most 255 bytes."""

from pathlib import Path

import pytest

from harness.experiment import new_run_dir
from harness.names import MAX_RUN_NAME_BYTES, check_run_name
from pipeline.errors import ConfigError


def test_the_longest_run_name_in_bytes_still_makes_its_run_directory(tmp_path: Path) -> None:
    """100 four-byte characters passed (100 characters), and the run directory's 400-byte name
    failed with ENAMETOOLONG: the limit is in bytes, with room for the time stamp."""
    longest = "\U0001f600" * (MAX_RUN_NAME_BYTES // 4)
    assert len(check_run_name(longest, "spec name").encode()) == MAX_RUN_NAME_BYTES == 224
    assert new_run_dir(tmp_path, longest).is_dir()
    with pytest.raises(ConfigError, match="is 228 bytes long as a file name"):
        check_run_name(longest + "\U0001f600", "spec name")
