"""Load YAML while remembering the line of every node, so that a validation
error can name `file:line` as well as the field path.

A file that cannot be used is always a `ConfigError` listing its problems (the CLI
exits 2 on it), never another exception, whatever the bytes:

- at most `MAX_BYTES`; UTF-8 only (a UTF-8 byte order mark is allowed), no control
  characters; an empty file is an error;
- nesting at most `MAX_DEPTH` levels, and at most `MAX_NODES` values counted with every
  alias expanded: anchors and aliases (`&a`, `*a`, `<<: *a`) are allowed (Ansible's
  to_nice_yaml writes them for shared values), but a few hundred bytes of aliases to
  aliases that would expand to gigabytes ("billion laughs") stop at the bound, naming
  the line; an alias inside its own anchor (a recursive structure) is refused;
- no explicit tags other than `!!str` (`!!python/...`, `!!binary`, `!!set`, ...);
- a key given twice in one mapping is an error naming both lines (YAML itself would
  keep the last one silently, e.g. a renamed host).

The text is parsed once: the values are built here straight from the parser's events
(libyaml when present), without recursion and without PyYAML's node tree (indexing each
value's line on the way; a 10,000-member file loads in a quarter of the time the nodes
took). PyYAML resolves and constructs every scalar that is not a string. An alias reuses
its anchor's value (nothing is copied); values reached through an alias have no line of
their own: errors in them name the alias's line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from yaml.events import (
    AliasEvent,
    CollectionStartEvent,
    Event,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
    StreamEndEvent,
)
from yaml.nodes import ScalarNode

Loc = tuple[str | int, ...]
M = TypeVar("M", bound=BaseModel)

MAX_BYTES = 16 * 2**20
MAX_DEPTH = 64
MAX_PROBLEMS = 100  # listed; the rest are counted
MAX_NODES = 1_500_000  # about 150k peers; worst case (all small values) ~7 s, ~650 MB

# Only the parser (events, no recursion) of these loaders is used; the C one is 3x faster.
_Loader: type[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# YAML's printable set (PyYAML's Reader.NON_PRINTABLE): everything else is refused up front
# so that the message can name the line.
_NON_PRINTABLE = re.compile("[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_STR_TAGS = {None, "!", "tag:yaml.org,2002:str"}


class ConfigError(Exception):
    """A file that cannot be used; `problems` holds one line per error."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass
class YamlDoc:
    path: Path
    data: Any
    lines: dict[Loc, int]  # field path -> 1-based line

    def line_of(self, loc: Loc) -> int | None:
        # Walk up until a located node is found (a missing key has no line;
        # its parent mapping does).
        while True:
            if loc in self.lines:
                return self.lines[loc]
            if not loc:
                return None
            loc = loc[:-1]

    def where(self, loc: Loc) -> str:
        line = self.line_of(loc)
        return f"{self.path}:{line}" if line else str(self.path)


def read_text(path: Path, max_bytes: int = MAX_BYTES) -> str:
    """The file as text, or a ConfigError saying plainly why not."""
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size > max_bytes:
                raise ConfigError([f"{path}: larger than {max_bytes} bytes; not a configuration file?"])
            raw = f.read(max_bytes + 1)
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror or exc}"]) from exc
    if len(raw) > max_bytes:
        raise ConfigError([f"{path}: larger than {max_bytes} bytes; not a configuration file?"])
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise ConfigError([f"{path}: is UTF-16 (or UTF-32) text; save it as UTF-8"])
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            [f"{path}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); is this a binary file?"]
        ) from exc
    bad = _NON_PRINTABLE.search(text)
    if bad:
        line = text.count("\n", 0, bad.start()) + 1
        raise ConfigError([f"{path}:{line}: control character U+{ord(bad.group()):04X} is not allowed in YAML"])
    return text


class _Refused(Exception):
    def __init__(self, mark: Any, problem: str):
        super().__init__(problem)
        self.mark, self.problem = mark, problem


_MERGE = "tag:yaml.org,2002:merge"
_STR = "tag:yaml.org,2002:str"


@dataclass
class _Open:
    """A collection being built."""

    value: list[Any] | dict[Any, Any]
    loc: Loc | None  # None: inside a mapping key (not indexed)
    start: int  # values counted (aliases expanded) before this collection
    anchor: str | None = None
    has_key: bool = False  # a mapping's key is waiting for its value
    key: Any = None
    merges: list[tuple[Any, Any]] | None = None  # a mapping's `<<` values (mark, value), in order
    seen: dict[Any, int] | None = None  # a mapping's keys -> line


class _Merge:
    """The `<<` key (a merge), as a key waiting for its value."""


class _Builder:
    """Builds one document's values straight from the parser's events with a stack of open
    collections (no recursion, no node tree: the C parser's events and a str scalar's value
    are used as they come), counting the values it holds with aliases expanded, and its
    depth, as it goes. A mapping's `<<` merges are applied at its end (`_merged`)."""

    def __init__(self, loader: Any, lines: dict[Loc, int], duplicates: list[tuple[int, str]]):
        self.loader, self.lines, self.duplicates = loader, lines, duplicates
        self.stack: list[_Open] = []
        self.anchors: dict[str, tuple[Any, int]] = {}  # name -> (value, values it holds with aliases expanded)
        self.count = 0  # values so far, aliases expanded

    def build(self) -> tuple[bool, Any]:
        """(whether the file holds a document, its value)."""
        loader = self.loader
        loader.get_event()  # StreamStartEvent
        if loader.check_event(StreamEndEvent):
            return False, None
        loader.get_event()  # DocumentStartEvent
        while True:
            event: Event = loader.get_event()
            mark: Any = event.start_mark
            loc = _loc_of_next(self.stack)
            if loc is not None and isinstance(event, (AliasEvent, ScalarEvent, CollectionStartEvent)):
                self.lines.setdefault(loc, mark.line + 1)
            if isinstance(event, (SequenceStartEvent, MappingStartEvent)):
                self._open(event, mark, loc)
                continue
            value = self._value(event, mark)
            if not self.stack:
                break
            self._attach(self.stack[-1], value, mark)
        loader.get_event()  # DocumentEndEvent
        if not loader.check_event(StreamEndEvent):
            raise _Refused(loader.get_event().start_mark, "more than one YAML document (---) in this file")
        return True, value

    def _counted(self, mark: Any, n: int, what: str = "values") -> None:
        self.count += n
        if self.count > MAX_NODES:
            raise _Refused(mark, f"more than {MAX_NODES} {what}")

    def _open(self, event: SequenceStartEvent | MappingStartEvent, mark: Any, loc: Loc | None) -> None:
        self._counted(mark, 1)
        if event.tag not in (None, "!"):
            raise _Refused(mark, f"the tag {event.tag} is not allowed in this file")
        if len(self.stack) >= MAX_DEPTH:
            raise _Refused(mark, f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(event, SequenceStartEvent):
            self.stack.append(_Open([], loc, self.count - 1, event.anchor))
        else:
            self.stack.append(_Open({}, loc, self.count - 1, event.anchor, merges=[], seen={}))

    def _value(self, event: Event, mark: Any) -> Any:
        """The value that an alias, a scalar or the end of a collection completes."""
        if isinstance(event, AliasEvent):
            if event.anchor not in self.anchors:
                inside = any(frame.anchor == event.anchor for frame in self.stack)
                why = "inside its own anchor (a recursive structure)" if inside else "has no anchor before it"
                raise _Refused(mark, f"alias *{event.anchor} {why}")
            value, size = self.anchors[event.anchor]
            self._counted(mark, size, "values with aliases expanded")
            return value
        if isinstance(event, ScalarEvent):
            self._counted(mark, 1)
            value = _scalar(self.loader, event, mark)
            if event.anchor is not None:
                self.anchors[event.anchor] = (value, 1)
            return value
        if isinstance(event, (SequenceEndEvent, MappingEndEvent)):
            frame = self.stack.pop()
            value = _merged(frame) if frame.merges else frame.value
            if frame.anchor is not None:
                self.anchors[frame.anchor] = (value, self.count - frame.start)
            return value
        raise _Refused(mark, f"unexpected {type(event).__name__}")  # the parser guarantees the order of events

    def _attach(self, top: _Open, value: Any, mark: Any) -> None:
        """Add a finished value (`mark`: where it started, or its alias) to the collection being built."""
        line = mark.line + 1
        if isinstance(top.value, list):
            top.value.append(value)
        elif not top.has_key:
            top.has_key, top.key = True, value
            if value is _Merge:
                return
            try:
                hash(value)
            except TypeError:
                raise _Refused(mark, "a mapping key must be a plain value, not a list or a mapping") from None
            if top.loc is not None:
                self.lines.setdefault((*top.loc, value), line)  # a field's line is its key's
            assert top.seen is not None
            first = top.seen.get(value)
            if first is None:
                top.seen[value] = line
            else:
                self.duplicates.append((line, f"key {_short(value)!r} given twice (first on line {first})"))
        else:
            if top.key is _Merge:
                assert top.merges is not None
                top.merges.append((mark, value))
            else:
                top.value[top.key] = value
            top.has_key, top.key = False, None


def _merged(frame: _Open) -> dict[Any, Any]:
    """A mapping with its `<<` values merged in, as PyYAML's SafeConstructor.flatten_mapping
    does: its own keys win; of a merged list, the first mapping; of two `<<` keys, the later."""
    assert frame.merges is not None and isinstance(frame.value, dict)
    merged: dict[Any, Any] = {}
    for mark, value in frame.merges:
        sources = value if isinstance(value, list) else [value]
        if not all(isinstance(m, dict) for m in sources):
            raise _Refused(mark, "YAML: a merge (<<) takes a mapping or a list of mappings")
        for source in reversed(sources):
            merged.update(source)
    merged.update(frame.value)
    return merged


def _scalar(loader: Any, event: ScalarEvent, mark: Any) -> Any:
    if event.tag not in _STR_TAGS:
        raise _Refused(mark, f"the tag {event.tag} is not allowed in this file")
    tag = event.tag if event.tag not in (None, "!") else loader.resolve(ScalarNode, event.value, event.implicit)
    if tag in (_STR, "tag:yaml.org,2002:value"):  # a bare '=': nothing in SafeLoader constructs it
        return event.value
    if tag == _MERGE:
        return _Merge
    try:  # constructed now so that an error names its line
        return loader.construct_object(ScalarNode(tag, event.value, mark, None, style=event.style))
    except ValueError as exc:  # 2024-13-45, an int of 5,000 digits
        kind = tag.rsplit(":", 1)[-1]
        why = str(exc).split(";")[0]
        raise _Refused(mark, f"{_short(event.value)!r} is not a valid {kind}: {why}") from exc


def _loc_of_next(stack: list[_Open]) -> Loc | None:
    """The field path of the value about to start; None: a mapping key or inside one (not indexed)."""
    if not stack:
        return ()
    parent = stack[-1]
    if parent.loc is None:
        return None
    if isinstance(parent.value, dict):
        if not parent.has_key or parent.key is _Merge:
            return None
        return (*parent.loc, parent.key)
    return (*parent.loc, len(parent.value))


def _short(value: Any, limit: int = 40) -> str:
    text = str(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _where(path: Path, mark: Any) -> str:
    return f"{path}:{mark.line + 1}" if mark is not None else str(path)


def load(path: str | Path) -> YamlDoc:
    path = Path(path)
    text = read_text(path)
    loader = _Loader(text)
    lines: dict[Loc, int] = {}
    duplicates: list[tuple[int, str]] = []
    try:
        found, data = _Builder(loader, lines, duplicates).build()
    except _Refused as exc:
        raise ConfigError([f"{_where(path, exc.mark)}: {exc.problem}"]) from exc
    except yaml.MarkedYAMLError as exc:  # syntax, or a value that cannot be constructed
        what = "YAML" if isinstance(exc, yaml.constructor.ConstructorError) else "YAML syntax"
        raise ConfigError([f"{_where(path, exc.problem_mark)}: {what}: {exc.problem}"]) from exc
    except yaml.YAMLError as exc:  # e.g. ReaderError: no line, only a position
        raise ConfigError([f"{path}: YAML: {_short(exc, 200)}"]) from exc
    finally:
        loader.dispose()
    if duplicates:
        problems = [f"{path}:{line}: {problem}" for line, problem in duplicates[:MAX_PROBLEMS]]
        if len(duplicates) > MAX_PROBLEMS:
            problems.append(f"{path}: ... and {len(duplicates) - MAX_PROBLEMS} more keys given twice")
        raise ConfigError(problems)
    if not found or data is None:
        raise ConfigError([f"{path}: empty (no YAML document in it)"])
    return YamlDoc(path, data, lines)


def _format_loc(loc: Loc) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def validate(doc: YamlDoc, model: type[M]) -> M:
    """Validate a loaded document; every error names file:line and field path."""
    try:
        return model.model_validate(doc.data)
    except ValidationError as exc:
        problems = []
        errors = exc.errors()
        for err in errors[:MAX_PROBLEMS]:
            loc = tuple(p for p in err["loc"] if not isinstance(p, str) or not p.startswith("function-"))
            msg = err["msg"].removeprefix("Value error, ")
            problems.append(f"{doc.where(loc)}: {_format_loc(loc)}: {msg}")
        if len(errors) > MAX_PROBLEMS:
            problems.append(f"{doc.path}: ... and {len(errors) - MAX_PROBLEMS} more problems")
        raise ConfigError(problems) from exc


def file_problem(path: Path) -> str | None:
    """Why a file a configuration names cannot be read, or None: it exists, is a
    regular file and this process can open it for reading."""
    try:
        with open(path, "rb"):
            pass
    except IsADirectoryError:
        return f"{path} is a directory, not a file"
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror or exc}"
    except ValueError as exc:  # a NUL in the name
        return f"cannot read {_short(path)}: {exc}"
    if not path.is_file():
        return f"{path} is not a regular file"
    return None


Check = Callable[[M], list[tuple[Loc, str]]]


def load_model(path: str | Path, model: type[M], check: Check[M] | None = None) -> M:
    """Load and validate; `check` (optional) looks beyond the file (e.g. at the files it
    names) and returns (field path, problem) pairs, reported with file:line like the rest."""
    doc = load(path)
    obj = validate(doc, model)
    if check is not None:
        found = check(obj)
        if found:
            raise ConfigError([f"{doc.where(loc)}: {_format_loc(loc)}: {problem}" for loc, problem in found])
    return obj
