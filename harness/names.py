"""User-given names, checked once at the edge: labels print on one line, and run names are
one path component (a run directory never lands outside --out)."""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

from pipeline.errors import ConfigError

__all__ = ["check_label", "check_run_name", "slug"]


def check_label(text: str, what: str) -> str:
    """`text` if it is non-empty and has no control characters (newlines, tabs, escapes)."""
    if not text:
        raise ConfigError(f"{what} is empty")
    bad = next((c for c in text if unicodedata.category(c).startswith("C")), None)
    if bad is not None:
        raise ConfigError(f"{what} {text!r} contains the control character {bad!r}")
    return text


def check_run_name(text: str, what: str) -> str:
    """`text` if it names one directory inside another: a label with no path separator,
    not '.' or '..'."""
    check_label(text, what)
    if "/" in text or "\\" in text or text in (".", ".."):
        raise ConfigError(
            f"{what} {text!r} must be a single path component (no '/', not '.' or '..')"
        )
    return text


def slug(parts: Sequence[str], what: str) -> str:
    """A configuration's parts (model, system, scenario, ...) as one file name: joined by
    '_', with '/' and ':' and '@' written '-' and ',' written '+' ("0-1,2-3@40ms" is
    "0-1+2-3-40ms"); refused (naming `what`) unless it is one path component."""
    text = "_".join(
        part.replace("/", "-").replace("@", "-").replace(",", "+").replace(":", "-")
        for part in parts
    )
    return check_run_name(text, what)
