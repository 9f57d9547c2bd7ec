"""Reading the tool's input files: every error names the file and what it was for."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pipeline.errors import ConfigError

__all__ = ["parse_json_file", "read_json", "read_text"]

T = TypeVar("T")


def read_text(path: str | Path, what: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as err:
        raise ConfigError(f"cannot read {what} {path}: {err.strerror}") from err


def read_json(path: str | Path, what: str) -> Any:
    try:
        return json.loads(read_text(path, what))
    except json.JSONDecodeError as err:
        raise ConfigError(f"{what} {path} is not valid JSON: {err}") from err


def parse_json_file(path: str | Path, what: str, parse: Callable[[Any], T]) -> T:
    """`parse` of the file's JSON; its ConfigError then names the file too."""
    data = read_json(path, what)
    try:
        return parse(data)
    except ConfigError as err:
        raise ConfigError(f"{what} {path}: {err}") from err
