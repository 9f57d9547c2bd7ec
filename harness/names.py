"""User-given names, checked once at the edge: labels print on one line, and run names are
one path component (a run directory never lands outside --out)."""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

from pipeline.errors import ConfigError

__all__ = [
    "MAX_LABEL_CHARS",
    "MAX_RUN_NAME_BYTES",
    "check_label",
    "check_run_name",
    "markdown_cell",
    "slug",
]

MAX_LABEL_CHARS = 100
"""The longest name or label: result files are named after several of them, and a file
name has at most 255 bytes."""
_MAX_FILE_NAME_BYTES = 240
"""A configuration's file name, leaving room for a temporary file's prefix and suffix."""
MAX_RUN_NAME_BYTES = _MAX_FILE_NAME_BYTES - len("-YYYYMMDD-HHMMSS")
"""The longest run name (a spec's name, --run-id) in UTF-8 bytes: a run directory's name is
the spec's name and a time stamp (harness.experiment.new_run_dir), and a file name has at
most 255 bytes (100 four-byte characters are 400)."""


def check_label(text: str, what: str) -> str:
    """`text` if it is non-empty, at most `MAX_LABEL_CHARS` long, and has no control
    characters (newlines, tabs, escapes)."""
    if not text:
        raise ConfigError(f"{what} is empty")
    if len(text) > MAX_LABEL_CHARS:
        raise ConfigError(
            f"{what} {text[:20]!r}... is {len(text)} characters long; at most {MAX_LABEL_CHARS}"
        )
    bad = next((c for c in text if unicodedata.category(c).startswith("C")), None)
    if bad is not None:
        raise ConfigError(f"{what} {text!r} contains the control character {bad!r}")
    return text


def check_run_name(text: str, what: str, max_bytes: int = MAX_RUN_NAME_BYTES) -> str:
    """`text` if it names one directory inside another: a label with no path separator,
    not '.' or '..', of at most `max_bytes` as a file name (UTF-8)."""
    check_label(text, what)
    if "/" in text or "\\" in text or text in (".", ".."):
        raise ConfigError(
            f"{what} {text!r} must be a single path component (no '/', not '.' or '..')"
        )
    if len(text.encode()) > max_bytes:
        raise ConfigError(
            f"{what} {text[:20]!r}... is {len(text.encode())} bytes long as a file name "
            f"(UTF-8); at most {max_bytes}"
        )
    return text


def markdown_cell(text: object) -> str:
    """`text` as a Markdown table's cell: a label may hold a '|', which would end the cell
    (a model "a|b" put each of its rows' values one column to the right)."""
    return str(text).replace("|", "\\|")


def slug(parts: Sequence[str], what: str) -> str:
    """A configuration's parts (model, system, scenario, ...) as one file name: joined by
    '_', with '/' and ':' and '@' written '-' and ',' written '+' ("0-1,2-3@40ms" is
    "0-1+2-3-40ms"); refused (naming `what`) unless it is one path component."""
    text = "_".join(
        part.replace("/", "-").replace("@", "-").replace(",", "+").replace(":", "-")
        for part in parts
    )
    if len(text.encode()) > _MAX_FILE_NAME_BYTES:
        raise ConfigError(
            f"{what} {text[:40]!r}... is {len(text.encode())} bytes long as a file name; "
            f"at most {_MAX_FILE_NAME_BYTES} (shorten the names in it)"
        )
    return check_run_name(text, what, _MAX_FILE_NAME_BYTES)
