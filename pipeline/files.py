"""Reading the tool's JSON input files: every error names the file and what it was for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError

__all__ = ["read_json"]


def read_json(path: str | Path, what: str) -> Any:
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ConfigError(f"cannot read {what} {path}: {err.strerror}") from err
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{what} {path} is not valid JSON: {err}") from err
