"""The tool's files: reading its inputs (every error names the file and what it was for) and
writing its outputs whole or not at all."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO, TypeVar

from pipeline.checks import whole_number
from pipeline.errors import ConfigError

__all__ = [
    "MAX_DEPTH",
    "MAX_INPUT_CHARACTERS",
    "atomic_writer",
    "leftover_temporaries",
    "load_yaml",
    "load_yaml_lines",
    "parse_json_file",
    "pyplot",
    "read_json",
    "read_text",
    "save_figure",
    "write_atomic",
]

T = TypeVar("T")


MAX_INPUT_CHARACTERS = 64 << 20
"""The longest input the tool reads (its inputs are a few KiB to a few MiB; a device or a
pipe with no end, /dev/zero, was read until memory ran out)."""


def read_text(path: str | Path, what: str) -> str:
    try:
        with Path(path).open() as handle:
            text = handle.read(MAX_INPUT_CHARACTERS + 1)
        if len(text) > MAX_INPUT_CHARACTERS:
            raise ConfigError(f"{what} {path} is longer than {MAX_INPUT_CHARACTERS:,} characters")
        return text
    except OSError as err:
        raise ConfigError(f"cannot read {what} {path}: {err.strerror}") from err
    except UnicodeDecodeError as err:
        raise ConfigError(f"{what} {path} is not text (byte {err.start} is not UTF-8)") from err


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's members as a dict, refusing a key given twice (json would keep the
    last silently, as YAML would: load_yaml refuses it too)."""
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise ConfigError(f"key {key!r} given twice in one object")
        data[key] = value
    return data


def read_json(path: str | Path, what: str) -> Any:
    """The file's JSON; a syntax error, a key given twice in one object or a whole number
    too large for a float (`whole_number`) is a ConfigError naming the file."""
    text = read_text(path, what)
    try:
        return _shallow(json.loads(text, object_pairs_hook=_unique_keys, parse_int=whole_number))
    except json.JSONDecodeError as err:
        raise ConfigError(f"{what} {path} is not valid JSON: {err}") from err
    except RecursionError as err:
        raise ConfigError(f"{what} {path}: {_TOO_DEEP}") from err
    except ConfigError as err:  # a key given twice, nested too deeply, too large a number
        raise ConfigError(f"{what} {path}: {err}") from err


MAX_DEPTH = 64
"""The most a file's arrays and objects may nest (every input the tool reads nests a few
levels; far more made every reader fail in Python's recursion, an internal error)."""
_TOO_DEEP = f"lists and mappings nested more than {MAX_DEPTH} deep"


def _shallow(data: Any) -> Any:
    """`data`, refused where its lists and mappings nest more than MAX_DEPTH deep."""
    level = [data] if isinstance(data, list | dict) else []
    for _ in range(MAX_DEPTH):
        level = [
            item
            for value in level
            for item in (value.values() if isinstance(value, dict) else value)
            if isinstance(item, list | dict)
        ]
        if not level:
            return data
    raise ConfigError(_TOO_DEEP)


def parse_json_file(path: str | Path, what: str, parse: Callable[[Any], T]) -> T:
    """`parse` of the file's JSON; its ConfigError then names the file too."""
    data = read_json(path, what)
    try:
        return parse(data)
    except ConfigError as err:
        raise ConfigError(f"{what} {path}: {err}") from err


_YAML_INT = r"[-+]?[0-9]+"
"""An unquoted whole number YAML reads as one here: decimal, as a person reads it (010 is
10, as a fault timeline's reader always took it)."""
_YAML_FLOAT = (
    r"[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+(?=[eE]))(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)"
)
"""An unquoted real number YAML reads as one here: PyYAML's forms less base 60 and `_`,
with an exponent also without its sign or a point (1e3 is 1000.0, as in JSON and YAML
1.2)."""


@functools.cache
def _yaml_loader() -> Any:
    """PyYAML's safe loader, but for a key given twice (refused) and numbers: YAML 1.1 reads
    an unquoted 010 as octal 8, 0x10 as 16, 1:30 as 90 (base 60) and 1_000 as 1000, which a
    file's reader takes for 10, a name, a time and a typo: only decimal forms are numbers
    here (010 is 10, 1e3 is 1000.0), the others strings (which a number's check then
    refuses, or reads as written)."""
    import yaml  # loads slowly; most commands read no YAML

    class Loader(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.events.AliasEvent):  # a few bytes for gigabytes
                event = self.peek_event()
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"an alias (*{event.anchor}) is not read here: write the value out",
                    event.start_mark,
                )
            return super().compose_node(parent, index)

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                with contextlib.suppress(TypeError):  # unhashable: the base refuses it
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"key {key!r} given twice", key_node.start_mark
                        )
                    seen.add(key)
            return super().construct_mapping(node, deep)

    def decimal_int(loader: Loader, node: Any) -> int:
        text = loader.construct_scalar(node)
        try:
            return whole_number(text)  # not the base's: 010 would be octal 8
        except ConfigError as err:  # too large a number
            raise yaml.constructor.ConstructorError(None, None, str(err), node.start_mark) from None
        except ValueError:  # a tag's (!!int 0x10)
            raise yaml.constructor.ConstructorError(
                None, None, f"{text!r} is not a decimal whole number", node.start_mark
            ) from None

    def finite_float(loader: Loader, node: Any) -> float:
        value = float(loader.construct_yaml_float(node))
        text = loader.construct_scalar(node)
        if math.isinf(value) and "inf" not in text.lower():  # 1e999: not `.inf` (a failure)
            raise yaml.constructor.ConstructorError(
                None, None, f"{text!r} is too large a number", node.start_mark
            )
        return value

    Loader.add_constructor("tag:yaml.org,2002:int", decimal_int)
    Loader.add_constructor("tag:yaml.org,2002:float", finite_float)
    numbers = {"tag:yaml.org,2002:int", "tag:yaml.org,2002:float"}
    Loader.yaml_implicit_resolvers = {
        first: [(tag, rule) for tag, rule in rules if tag not in numbers]
        for first, rules in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:int", re.compile(f"^(?:{_YAML_INT})$"), list("-+0123456789")
    )
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float", re.compile(f"^(?:{_YAML_FLOAT})$"), list("-+0123456789.")
    )
    return Loader


def load_yaml(text: str, what: str) -> Any:
    """YAML (JSON too) read safely; a syntax error, or a key given twice in one mapping (YAML
    would keep the last silently), is one line with its place in the file. Only decimal
    forms are numbers (`_yaml_loader`)."""
    return load_yaml_lines(text, what)[0]


def load_yaml_lines(text: str, what: str) -> tuple[Any, tuple[int, ...]]:
    """`load_yaml`'s data and, where it is a list, the line (from 1) each of its items starts
    on (for a later error about an item to name its place in the file)."""
    import yaml

    try:
        data, node = _load_yaml_node(text)
        items = node.value if isinstance(node, yaml.SequenceNode) else []
        return _shallow(data), tuple(_entry_line(text, item.start_mark) for item in items)
    except RecursionError as err:
        raise ConfigError(f"{what} is not valid YAML: {_TOO_DEEP}") from err
    except ConfigError as err:
        raise ConfigError(f"{what}: {err}") from err
    except yaml.reader.ReaderError as err:  # a character YAML refuses (a form feed)
        where = _place(text, err.position)
        problem = f"{err.reason}: U+{err.character:04X}"
        raise ConfigError(f"{what} is not valid YAML{where}: {problem}") from err
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        problem = getattr(err, "problem", None) or type(err).__name__
        where = _place(text, mark.index) if mark else ""
        raise ConfigError(f"{what} is not valid YAML{where}: {problem}") from err


def _line(text: str, index: int) -> int:
    """The line (from 1) of `text`'s character `index`, counting newlines only: YAML breaks
    lines at U+0085, U+2028 and U+2029 too, which an editor may show on one line."""
    return text.count("\n", 0, index) + 1


def _place(text: str, index: int) -> str:
    """Where `text`'s character `index` is, as an error says it: " at line L, column C"
    (both from 1; `_line`)."""
    column = index - text.rfind("\n", 0, index)
    return f" at line {_line(text, index)}, column {column}"


def _entry_line(text: str, mark: Any) -> int:
    """The line (from 1) of a list item that starts at `mark`: its `-`'s where the dash
    stands alone on a line above it (a block mapping's item starts at its first key), else
    the item's own."""
    i = mark.index - 1
    while i >= 0 and text[i] in " \t\r\n":
        i -= 1
    return _line(text, i) if i >= 0 and text[i] == "-" else _line(text, mark.index)


def _load_yaml_node(text: str) -> tuple[Any, Any]:
    """The data of `text`'s YAML document and its node (None for an empty one): yaml.load's
    steps with `_yaml_loader`, a SafeLoader, keeping the node and its marks."""
    loader = _yaml_loader()(text)
    try:
        node = loader.get_single_node()
        return (None if node is None else loader.construct_document(node)), node
    finally:
        loader.dispose()


def _readable_mode() -> int:
    """0666 less the process's umask: what `open` would have given the file (the umask read
    from /proc, which leaves it as it is; elsewhere set and restored)."""
    try:
        status = Path("/proc/self/status").read_text()
        umask = next(
            int(line.split()[1], 8) for line in status.splitlines() if line.startswith("Umask:")
        )
    except (OSError, StopIteration, ValueError, IndexError):
        umask = os.umask(0)
        os.umask(umask)
    return 0o666 & ~umask


_TEMPORARY_NAME = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp")
"""The name of `_replacing`'s temporary file: a dot, the file's name, a dot, mkstemp's 8
random characters, ".tmp" (e.g. `.runs.csv.k3x_q0ab.tmp`)."""


@contextlib.contextmanager
def _replacing(path: Path, *, binary: bool, append: bool) -> Iterator[Any]:
    """A handle on a temporary file beside `path` (named as `_TEMPORARY_NAME` says), renamed
    onto it when the block ends without an error, otherwise removed (a SIGKILL leaves it:
    `leftover_temporaries`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        try:
            os.fchmod(fd, _readable_mode())  # like any output file (mkstemp makes it 0600)
            if append and path.exists():
                shutil.copyfile(path, tmp)  # in the kernel where it can (before the open: an
                # append handle starts at the end the file has when it is opened)
            mode = "a" if append else "w"
            handle = os.fdopen(fd, mode + "b") if binary else os.fdopen(fd, mode, newline="")
        except BaseException:
            os.close(fd)  # the handle would have closed it
            raise
        with handle:
            yield handle
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def leftover_temporaries(folder: Path) -> list[Path]:
    """The files in `folder` (not below it) named as this module's writers name their
    temporary files (`atomic_writer`, `write_atomic`, `save_figure`), sorted: what a writer
    killed mid-write (SIGKILL: no handler ran) left there. Only where no writer is at work
    are they all leftovers (a run directory its run holds: harness.saved.drop_stale)."""
    try:
        entries = list(folder.iterdir())
    except FileNotFoundError:
        return []
    return sorted(p for p in entries if _TEMPORARY_NAME.fullmatch(p.name) and p.is_file())


def atomic_writer(path: Path, *, append: bool = False) -> contextlib.AbstractContextManager[TextIO]:
    """A text file written through a temporary file and renamed onto `path` when the block
    ends without an error (otherwise removed): a reader never sees half a file. `append`:
    the temporary file starts as a copy of `path` (if it exists)."""
    return _replacing(path, binary=False, append=append)


def pyplot() -> Any:
    """matplotlib.pyplot drawing to files (Agg), every text it draws literal: the figures'
    titles, legends and ticks hold user-given labels (a model's may have a '$', which
    mathtext would read as a formula and refuse), never a formula."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["text.parse_math"] = False
    import matplotlib.pyplot as plt

    return plt


def save_figure(figure: Any, path: str | Path, *, dpi: int) -> None:
    """A matplotlib figure (or seaborn grid) saved whole or not at all, in the format its
    file name ends with."""
    path = Path(path)
    with _replacing(path, binary=True, append=False) as out:
        figure.savefig(out, format=path.suffix.lstrip(".") or "png", dpi=dpi)


def write_atomic(path: str | Path, text: str) -> None:
    with atomic_writer(Path(path)) as handle:
        handle.write(text)
