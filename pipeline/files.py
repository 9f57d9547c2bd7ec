"""Reading the tool's input files: every error names the file and what it was for."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pipeline.errors import ConfigError

__all__ = ["load_yaml", "parse_json_file", "read_json", "read_text"]

T = TypeVar("T")


def read_text(path: str | Path, what: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as err:
        raise ConfigError(f"cannot read {what} {path}: {err.strerror}") from err
    except UnicodeDecodeError as err:
        raise ConfigError(f"{what} {path} is not text (byte {err.start} is not UTF-8)") from err


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


def load_yaml(text: str, what: str) -> Any:
    """YAML (JSON too) read safely; a syntax error is one line with its place in the file."""
    import yaml  # loads slowly; most commands read no YAML

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        problem = getattr(err, "problem", None) or type(err).__name__
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{what} is not valid YAML{where}: {problem}") from err
